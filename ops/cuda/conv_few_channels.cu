// Forward convolution with few taps per output (C * kernel volume <= kFewMaxTaps: RGB stems,
// one-channel volumes) on FP32 FMAs. Such a layer's reduction is too short for the tensor-core
// kernels to pay back their tile fill (a 3x3x3 kernel over one channel reduces over 27 values,
// a 7x7 RGB stem over 147): its time is the output's bytes and 2 C kvol FLOPs per output.
// Here one thread owns one output pixel of a tile and a chunk of 16 or 32 output channels: the
// chunk's weights sit in shared memory as [tap][channel] (every lane of a warp reads the same
// word: a broadcast), staged once per block, which then loops over tiles; each input value is
// loaded once per chunk and multiplied into every channel's accumulator. FP32 products and sums in a fixed order: FP32-accurate at either precision, and
// the same bits run to run. Design note: docs/kernels/few_channels.md.
#include <algorithm>

#include "core/cuda_context.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/conv_dims32.h"
#include "ops/cuda/conv_few_channels.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 128;

// The geometry in 32-bit coordinates (few_channels_forward_applies checks the ranges); offsets
// stay 64-bit.
struct FewGeometry {
  int32_t C, K, taps;
  ConvDims32 d;
  int64_t in_volume, out_volume, pixels;  // pixels = N * out_volume
  bool channels_last;
};

// y[n, k0 + k, p] (+ b[k]) for the chunk k0 = blockIdx.y * Chunk, over tiles of kThreads
// consecutive output pixels (tile = blockIdx.x, + gridDim.x, ...): a block stages its chunk's
// weights once and keeps them for every tile it takes.
template <int Chunk, bool ChannelsLast>
__global__ void __launch_bounds__(kThreads) few_channels_forward_kernel(float* __restrict__ y,
                                                                       const float* __restrict__ x,
                                                                       const float* __restrict__ w,
                                                                       const float* __restrict__ b,
                                                                       const FewGeometry g) {
  __shared__ float4 weights[kFewMaxTaps * Chunk / 4];  // [tap][channel of the chunk]; zero past K
  // Channels-last outputs leave through shared memory: a tile's rows of the chunk, stored by
  // consecutive threads at consecutive addresses (a thread's own channels are K apart from the
  // next thread's). The row stride Chunk + 1 keeps the threads' writes on distinct banks.
  __shared__ float staged[ChannelsLast ? kThreads * (Chunk + 1) : 1];
  float* ws = reinterpret_cast<float*>(weights);
  const int k0 = blockIdx.y * Chunk;
  const int kn = min(Chunk, g.K - k0);
  // w is (K, taps); consecutive threads take consecutive chunk channels (distinct banks).
  for (int i = threadIdx.x; i < g.taps * Chunk; i += kThreads) {
    const int t = i / Chunk, k = i % Chunk;
    ws[i] = k < kn ? w[int64_t(k0 + k) * g.taps + t] : 0.f;
  }
  __syncthreads();
  const int64_t tiles = (g.pixels + kThreads - 1) / kThreads;
  const int64_t c_step = ChannelsLast ? 1 : g.in_volume, q_step = ChannelsLast ? g.C : 1;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t pixel = tile * kThreads + threadIdx.x;
    const bool live = pixel < g.pixels;
    const int64_t n = pixel / g.out_volume, p = pixel % g.out_volume;
    float acc[Chunk];
#pragma unroll
    for (int k = 0; k < Chunk; ++k) acc[k] = 0.f;
    if (live) {
      const int32_t ox = int32_t(p % g.d.out[2]), oy = int32_t((p / g.d.out[2]) % g.d.out[1]);
      const int32_t oz = int32_t(p / (int64_t(g.d.out[2]) * g.d.out[1]));
      const int32_t z0 = oz * g.d.stride[0] - g.d.pad[0], y0 = oy * g.d.stride[1] - g.d.pad[1];
      const int32_t x0 = ox * g.d.stride[2] - g.d.pad[2];
      const float* xn = x + n * g.in_volume * g.C;
      int t = 0;  // the tap: ((c * kd + tz) * kh + ty) * kw + tx, as w orders them
      for (int32_t c = 0; c < g.C; ++c) {
        const float* xc = xn + c * c_step;
        for (int32_t tz = 0; tz < g.d.kernel[0]; ++tz) {
          const int32_t iz = z0 + tz * g.d.dil[0];
          if (uint32_t(iz) >= uint32_t(g.d.in[0])) {
            t += g.d.kernel[1] * g.d.kernel[2];
            continue;
          }
          for (int32_t ty = 0; ty < g.d.kernel[1]; ++ty) {
            const int32_t iy = y0 + ty * g.d.dil[1];
            if (uint32_t(iy) >= uint32_t(g.d.in[1])) {
              t += g.d.kernel[2];
              continue;
            }
            const float* row = xc + (int64_t(iz) * g.d.in[1] + iy) * g.d.in[2] * q_step;
            for (int32_t tx = 0; tx < g.d.kernel[2]; ++tx, ++t) {
              const int32_t ix = x0 + tx * g.d.dil[2];
              if (uint32_t(ix) >= uint32_t(g.d.in[2])) continue;
              const float v = __ldg(row + int64_t(ix) * q_step);
              const float4* wt = weights + t * (Chunk / 4);
#pragma unroll
              for (int q = 0; q < Chunk / 4; ++q) {
                const float4 wq = wt[q];
                acc[4 * q] = fmaf(v, wq.x, acc[4 * q]);
                acc[4 * q + 1] = fmaf(v, wq.y, acc[4 * q + 1]);
                acc[4 * q + 2] = fmaf(v, wq.z, acc[4 * q + 2]);
                acc[4 * q + 3] = fmaf(v, wq.w, acc[4 * q + 3]);
              }
            }
          }
        }
      }
    }
    if constexpr (ChannelsLast) {
#pragma unroll
      for (int k = 0; k < Chunk; ++k)
        if (k < kn) staged[threadIdx.x * (Chunk + 1) + k] = b ? acc[k] + b[k0 + k] : acc[k];
      __syncthreads();
      const int64_t first = tile * kThreads;
      const int rows = int(min(int64_t(kThreads), g.pixels - first));
      for (int i = threadIdx.x; i < rows * kn; i += kThreads) {
        const int r = i / kn, k = i % kn;
        y[(first + r) * g.K + k0 + k] = staged[r * (Chunk + 1) + k];
      }
      __syncthreads();  // the next tile rewrites staged
    } else if (live) {
      float* out = y + (n * g.K + k0) * g.out_volume + p;  // consecutive threads: consecutive p
#pragma unroll
      for (int k = 0; k < Chunk; ++k)
        if (k < kn) out[int64_t(k) * g.out_volume] = b ? acc[k] + b[k0 + k] : acc[k];
    }
  }
}

template <int Chunk, bool ChannelsLast>
void launch_few_channels(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const FewGeometry& g,
                         int dev) {
  // Enough blocks to fill the GPU several times over, each looping over tiles; fewer where
  // the tiles are fewer.
  constexpr int kBlocksPerSm = 6;
  const int64_t tiles = (g.pixels + kThreads - 1) / kThreads, chunks = (g.K + Chunk - 1) / Chunk;
  const int64_t want = std::max<int64_t>(1, int64_t(sm_count(dev)) * kBlocksPerSm / chunks);
  const dim3 grid(static_cast<unsigned>(std::min(tiles, want)), static_cast<unsigned>(chunks));
  few_channels_forward_kernel<Chunk, ChannelsLast><<<grid, kThreads, 0, stream(dev)>>>(
      y.data<float>(), x.data<float>(), w.data<float>(), b.defined() ? b.data<float>() : nullptr, g);
  TG_LAUNCH_CHECK();
}

constexpr int64_t kCoordinateLimit = int64_t{1} << 30;

}  // namespace

bool few_channels_forward_applies(const ConvShape& s) {
  const int64_t taps = s.C * s.kernel_volume();
  if (s.C < 1 || s.K < 1 || taps > kFewMaxTaps || (s.K + 31) / 32 > 65535) return false;  // grid's y limit
  for (int d = 0; d < 3; ++d) {
    // Every coordinate the kernel forms (o * stride - pad + t * dilation) within 32 bits.
    if (s.in[d] >= kCoordinateLimit || s.out[d] >= kCoordinateLimit || s.pad[d] >= kCoordinateLimit) return false;
    if ((s.out[d] - 1) * s.stride[d] >= kCoordinateLimit || (s.kernel[d] - 1) * s.dilation[d] >= kCoordinateLimit)
      return false;
  }
  return true;
}

void few_channels_conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                               const ConvShape& s) {
  FewGeometry g{};
  g.C = int32_t(s.C);
  g.K = int32_t(s.K);
  g.taps = int32_t(s.C * s.kernel_volume());
  g.d = conv_dims32(s);
  g.in_volume = s.in_volume();
  g.out_volume = s.out_volume();
  g.pixels = s.N * s.out_volume();
  g.channels_last = s.channels_last();
  if (g.pixels == 0) return;
  const int dev = y.device().index;
  set_device(dev);
  if (s.K <= 16) {
    if (g.channels_last) launch_few_channels<16, true>(y, x, w, b, g, dev);
    else launch_few_channels<16, false>(y, x, w, b, g, dev);
  } else {
    if (g.channels_last) launch_few_channels<32, true>(y, x, w, b, g, dev);
    else launch_few_channels<32, false>(y, x, w, b, g, dev);
  }
}

}  // namespace tg::cuda
