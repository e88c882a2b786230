// Experiment (not built by CMake): which TMA stores of a 32 x 32 f32 box in the 128-byte swizzle
// does the unit accept, and what does it write? The engine's channels-first epilogue
// (ops/cuda/gemm/tma_epilogue_sm90.cuh) stores boxes of 32 pixels x 32 channels of one image
// through a 3-D map (pixels, channels, images); a box that runs past its image's last pixel
// would go out again to the next image at a negative pixel coordinate.
//
// Each case is one store from a block whose shared box holds value(line, element) = line *
// 1000 + element (line = box row, written through the swizzle), into a poisoned tensor; the
// host checks every element of the tensor against what a clipped store must leave. A case that
// faults would kill the context, so each runs in a child process (this program with the case
// number as its argument) and the parent prints one line per case.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda.h>

#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/arch/tma.cuh"
#include "ops/cuda/arch/wgmma.cuh"

namespace {

struct Case {
  const char* what;
  int rank;                 // 2: (cols, rows) map; 3: (cols, rows, planes)
  int planes, rows, cols;   // the tensor
  bool swizzle;
  int c0, c1, c2;           // the box's first coordinate (cols, rows, planes)
  int repeats = 1;          // stores of the same box in one bulk group
};

const Case kCases[] = {
    {"3-D, inside", 3, 3, 67, 48, true, 0, 0, 0},
    {"3-D, past the last column (clipped)", 3, 3, 67, 48, true, 32, 0, 0},
    {"3-D, negative column (-16)", 3, 3, 67, 48, true, -16, 0, 1},
    {"3-D, past the last row", 3, 3, 67, 48, true, 0, 64, 0},
    {"3-D, 4 columns in all (box wider than the tensor)", 3, 9, 40, 4, true, 0, 0, 2},
    {"3-D, negative column, no swizzle", 3, 3, 67, 48, false, -16, 0, 1},
    {"2-D, negative column (-16)", 2, 1, 67, 48, true, -16, 0, 0},
    {"2-D, negative row (-8)", 2, 1, 67, 48, true, 0, -8, 0},
    {"3-D, inside, 24 stores in one group", 3, 3, 67, 48, true, 0, 0, 0, 24},
};

__global__ void store_one_box(const __grid_constant__ CUtensorMap map, Case c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char raw[];
  unsigned char* box = raw + ((1024 - reinterpret_cast<uintptr_t>(raw) % 1024) % 1024);
  for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) {
    const int line = i / 32, e = i % 32;
    const int chunk = c.swizzle ? ((e / 4) ^ (line % 8)) : e / 4;
    reinterpret_cast<float*>(box + line * 128 + chunk * 16)[e % 4] = float(line * 1000 + e);
  }
  tg::cuda::wgmma::fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int r = 0; r < c.repeats; ++r) {
      if (c.rank == 3) tg::cuda::tma::store_box_3d(&map, box, c.c0, c.c1, c.c2);
      else tg::cuda::tma::store_box(&map, box, c.c0, c.c1);
    }
    tg::cuda::tma::bulk_commit();
    tg::cuda::tma::bulk_wait();
  }
#endif
}

int run_case(int k) {
  const Case& c = kCases[k];
  const size_t n = size_t(c.planes) * c.rows * c.cols;
  float* d = nullptr;
  cudaMalloc(&d, n * sizeof(float));
  std::vector<float> host(n, -1.f);
  cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  const tg::cuda::TmaBox box{.rows = 32, .cols = 32, .swizzle128 = c.swizzle};
  const CUtensorMap map = c.rank == 3 ? tg::cuda::f32_planes_map("probe", d, c.planes, c.rows, c.cols, box)
                                      : tg::cuda::f32_matrix_map("probe", d, c.rows, c.cols, box);
  cudaFuncSetAttribute(store_one_box, cudaFuncAttributeMaxDynamicSharedMemorySize, 8192);
  store_one_box<<<1, 128, 8192>>>(map, c);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("case %d (%s): CUDA error %s\n", k, c.what, cudaGetErrorString(e));
    return 1;
  }
  cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  int wrong = 0, written = 0;
  for (int p = 0; p < c.planes; ++p)
    for (int r = 0; r < c.rows; ++r)
      for (int col = 0; col < c.cols; ++col) {
        const int line = r - c.c1, e = col - c.c0;
        const bool inside = p == c.c2 && line >= 0 && line < 32 && e >= 0 && e < 32;
        const float want = inside ? float(line * 1000 + e) : -1.f;
        const float got = host[(size_t(p) * c.rows + r) * c.cols + col];
        wrong += got != want;
        written += inside;
      }
  std::printf("case %d (%s): %d elements to write, %d wrong\n", k, c.what, written, wrong);
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2) return run_case(std::atoi(argv[1]));
  int failed = 0;
  for (int k = 0; k < int(sizeof kCases / sizeof kCases[0]); ++k) {
    std::fflush(stdout);
    const int r = std::system((std::string(argv[0]) + " " + std::to_string(k)).c_str());
    if (r != 0) {
      std::printf("case %d: child exit status %d\n", k, r);
      ++failed;
    }
  }
  std::printf("probe done: %d of the cases failed or were refused\n", failed);
  return 0;  // a refused case is a finding, not a failure of the probe
}
