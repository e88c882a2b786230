// Helpers the dev/ probes share (not built by CMake; each probe's header says how it is built).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/arch/tma.cuh"
#include "ops/cuda/gemm/mainloop_sm80.cuh"  // MainloopArgs

namespace probe_common {

// Relative L2 distance ||a - b|| / ||b|| of two same-shape tensors, computed on their device (the
// probes' outputs are tens of MB).
inline double rel_l2(const tg::Tensor& a, const tg::Tensor& b) {
  const tg::Tensor d = tg::sub(a, b);
  const double num = tg::sum(tg::mul(d, d)).item(), den = tg::sum(tg::mul(b, b)).item();
  return std::sqrt(num / (den > 0 ? den : 1));
}

// The median of `repeats` timings (CUDA events on `stream`) of launch(), called `batch` times
// back to back per timing and divided by it. With batch 1 the host's own cost of launching (the
// GPU idles between the first event and the kernel) is in the time; with a few launches queued
// behind the first, only the GPU's. The events must be on the stream the kernels run on: the
// framework's ops run on its own non-blocking stream (tg::cuda::stream), which the default
// stream's events do not wait for.
template <class Launch>
float median_ms(int repeats, Launch&& launch, int batch = 1, cudaStream_t stream = 0) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int rep = 0; rep < repeats; ++rep) {
    cudaEventRecord(e0, stream);
    for (int b = 0; b < batch; ++b) launch();
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t / float(batch));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The im2col geometry of a 2-D 3x3, stride-1, padding-1 convolution over NHWC [n, h, w, c].
inline tg::cuda::Im2colGeometry conv3x3_geometry(int64_t n, int64_t h, int64_t w, int64_t c) {
  tg::cuda::Im2colGeometry g{};
  g.dims = 2;
  g.N = n;
  g.C = c;
  const int64_t in[3] = {1, h, w}, kernel[3] = {1, 3, 3}, pad[3] = {0, 1, 1};
  for (int d = 0; d < 3; ++d) {
    g.in[d] = in[d];
    g.kernel[d] = kernel[d];
    g.stride[d] = 1;
    g.pad[d] = pad[d];
    g.pad_hi[d] = pad[d];
    g.dilation[d] = 1;
  }
  return g;
}

// The k-tiles of a 3x3 NHWC convolution (images hw x hw, stride 1, padding 1) in the TMA
// unit's im2col mode, for the 128 output pixels from m0: 32 channels at a time, then the next
// tap (x first).
struct Conv3x3Walk {
  int img, h0, c0 = 0, tx = 0, ty = 0;
  __device__ Conv3x3Walk(int m0, int hw) : img(m0 / (hw * hw)), h0((m0 % (hw * hw)) / hw) {}
  __device__ void load(void* dst, const CUtensorMap* map, uint64_t* bar) const {
    tg::cuda::tma::load_im2col_4d(dst, map, bar, c0, -1, h0 - 1, img, uint16_t(tx), uint16_t(ty));
  }
  __device__ void advance(int channels) {
    if ((c0 += 32) == channels) {
      c0 = 0;
      if (++tx == 3) tx = 0, ++ty;
    }
  }
};

// The engine's arguments for an unsplit product of k_tiles 32-deep k-tiles written row-major
// into out (M x N), tiles_n columns of tiles.
inline tg::cuda::engine::MainloopArgs plain_args(int M, int N, int k_tiles, int tiles_n, float* out) {
  tg::cuda::engine::MainloopArgs args{};
  args.M = M;
  args.N = N;
  args.red = k_tiles * 32;
  args.tiles_n = tiles_n;
  args.k_tiles_per_split = k_tiles;
  args.out.data = out;
  args.out.M = M;
  args.out.N = N;
  args.out.mode = tg::cuda::engine::OutputMap::kPlain;
  args.out.kvol = 1;
  return args;
}

}  // namespace probe_common
