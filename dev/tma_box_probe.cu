// Experiment (not built by CMake): how fast does the TMA unit deliver a 3x3 stride-1
// convolution's A operand in im2col mode, against tiled boxes of the same bytes? The engine's
// TMA forward (ops/cuda/gemm/conv_fprop_sm90_tma.cu) spends ~2 us per 128x256x32 k-tile on
// NHWC 192 channels at 32x32 where the math is ~0.6 us; this isolates the loads.
//
// x: NHWC [16, 32, 32, 192] f32. A k-tile is one tap (ty, tx) and 32 channels of 128 output
// pixels (4 whole image rows): 16 KB in the 128-byte swizzle. Three ways to fetch it:
//   im2col  the engine's map (f32_im2col_map): one im2col-mode request per k-tile
//   tiled   a 4-D tiled map (C, W, H, N), box 32 x 32 x 4 x 1, coordinates shifted by the
//           tap offset; what falls outside the image arrives as zeros (same bytes as im2col)
//   matrix  a plain 2-D box of 128 rows x 32 floats of x seen as (N*H*W) x C, no tap
//           offset: the matmul kernel's kind of request, for reference
// Each block (one per 128-pixel tile, 128 blocks) streams its 54 k-tiles (9 taps x 6 slices)
// through a 4-stage ring: one producer thread, four consumer warps that only wait and
// release. It first checks that im2col and tiled deliver identical bytes for every tile and
// tap (copied out of shared memory), then times each mode (median of 20 launches).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/arch/tma.cuh"
#include "probe_common.h"

using namespace tg::cuda;

namespace probe {

constexpr int N = 16, H = 32, W = 32, C = 192;
constexpr int kPixels = 128, kRows = kPixels / W;  // 4 image rows per tile
constexpr int kSlices = C / 32, kTaps = 9, kKTiles = kTaps * kSlices;
constexpr int kTiles = N * H * W / kPixels;
constexpr int kBoxBytes = kPixels * 32 * 4;  // 16 KB
constexpr int kStages = 4;

enum Mode { kIm2col = 0, kTiled = 1, kMatrix = 2 };

__device__ __forceinline__ void load_tiled_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c, int w, int h,
                                              int n) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c), "r"(w), "r"(h), "r"(n), "r"(shared_address(bar))
      : "memory");
}

// The k-tile kt of tile `tile` into dst, counted on bar.
__device__ __forceinline__ void load_ktile(int mode, const CUtensorMap* map, void* dst, uint64_t* bar, int tile,
                                          int kt) {
  const int tap = kt / kSlices, c0 = (kt % kSlices) * 32, ty = tap / 3, tx = tap % 3;
  const int img = tile / (H / kRows), h0 = (tile % (H / kRows)) * kRows;
  if (mode == kIm2col) tma::load_im2col_4d(dst, map, bar, c0, -1, h0 - 1, img, uint16_t(tx), uint16_t(ty));
  else if (mode == kTiled) load_tiled_4d(dst, map, bar, c0, tx - 1, h0 + ty - 1, img);
  else tma::load_box(dst, map, bar, c0, tile * kPixels);
}

// One block per tile. check != nullptr: after each k-tile, the consumers copy the box to
// check[(tile * kKTiles + kt) * 4096 ...] (verification run).
__global__ void __launch_bounds__(160) stream_kernel(const __grid_constant__ CUtensorMap map, int mode, float* check) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kBoxBytes);
  uint64_t* empty = full + kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tile = blockIdx.x;
  if (threadIdx.x == 0) tma::init_stage_ring(full, empty, kStages, 1, 4);
  __syncthreads();
  if (warp == 4) {
    if (lane == 0) {
      for (int i = 0; i < kKTiles; ++i) {
        const int s = i % kStages;
        if (i >= kStages) tma::mbar_wait(&empty[s], ((i / kStages) - 1) & 1);
        tma::mbar_arrive_expect_tx(&full[s], kBoxBytes);
        load_ktile(mode, &map, smem + s * kBoxBytes, &full[s], tile, i);
      }
    }
    return;
  }
  for (int i = 0; i < kKTiles; ++i) {
    const int s = i % kStages;
    tma::mbar_wait(&full[s], (i / kStages) & 1);
    if (check) {
      const float* box = reinterpret_cast<const float*>(smem + s * kBoxBytes);
      float* out = check + (int64_t(tile) * kKTiles + i) * (kBoxBytes / 4);
      for (int e = threadIdx.x; e < kBoxBytes / 4; e += 128) out[e] = box[e];
      asm volatile("bar.sync 1, 128;" ::: "memory");  // every consumer read the stage
    }
    if (lane == 0) tma::mbar_arrive(&empty[s]);
  }
}

CUtensorMap tiled_4d_map(const float* x) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  CUtensorMap map{};
  const cuuint64_t dims[4] = {C, W, H, N};
  const cuuint64_t strides[3] = {C * 4ull, uint64_t(W) * C * 4, uint64_t(H) * W * C * 4};
  const cuuint32_t box[4] = {32, W, kRows, 1};
  const cuuint32_t es[4] = {1, 1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, const_cast<float*>(x), dims, strides, box, es,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) std::printf("tiled map: error %d\n", int(r));
  return map;
}

}  // namespace probe

using namespace probe;

int main() {
  const size_t n = size_t(N) * H * W * C;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = float((i * 2654435761u) % 1000003) * 1e-3f;
  float* x;
  cudaMalloc(&x, n * 4);
  cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice);

  const Im2colGeometry g = probe_common::conv3x3_geometry(N, H, W, C);
  const CUtensorMap maps[3] = {f32_im2col_map("probe", x, g, 32, kPixels), tiled_4d_map(x),
                               f32_matrix_map("probe", x, int64_t(N) * H * W, C, {kPixels, 32, true})};
  const char* names[3] = {"im2col", "tiled", "matrix"};
  const int smem = kStages * kBoxBytes + 2 * kStages * 8 + 1024;
  cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);

  // Same bytes from im2col and tiled, for every tile and k-tile.
  const size_t check_floats = size_t(kTiles) * kKTiles * (kBoxBytes / 4);
  float *c0, *c1;
  cudaMalloc(&c0, check_floats * 4);
  cudaMalloc(&c1, check_floats * 4);
  stream_kernel<<<kTiles, 160, smem>>>(maps[kIm2col], kIm2col, c0);
  stream_kernel<<<kTiles, 160, smem>>>(maps[kTiled], kTiled, c1);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("verification run failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  std::vector<float> h0(check_floats), h1(check_floats);
  cudaMemcpy(h0.data(), c0, check_floats * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(h1.data(), c1, check_floats * 4, cudaMemcpyDeviceToHost);
  size_t differ = 0, nonzero = 0;
  for (size_t i = 0; i < check_floats; ++i) {
    differ += std::memcmp(&h0[i], &h1[i], 4) != 0;
    nonzero += h0[i] != 0.f;
  }
  std::printf("im2col vs tiled: %zu of %zu floats differ (%zu nonzero)\n", differ, check_floats, nonzero);

  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int m = 0; m < 3; ++m) {
    std::vector<float> ms;
    for (int rep = 0; rep < 21; ++rep) {
      cudaEventRecord(a);
      stream_kernel<<<kTiles, 160, smem>>>(maps[m], m, nullptr);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float t;
      cudaEventElapsedTime(&t, a, b);
      if (rep > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double t = ms[ms.size() / 2];
    const double bytes = double(kTiles) * kKTiles * kBoxBytes;
    std::printf("%-7s %8.1f us  %7.0f GB/s into shared memory  %6.3f us per k-tile per block\n", names[m], t * 1e3,
                bytes / (t * 1e-3) / 1e9, t * 1e3 / kKTiles);
  }
  std::printf("probe done: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
