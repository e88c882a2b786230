// Experiment (not built by CMake): where does the engine's TMA kernel lose its k-tile time?
// tg_zoo under ncu: ~1 us per 128 x 128 x 32 k-tile on a 3x3 NHWC convolution and ~0.94 us
// per 128 x 256 x 32 one on Linear 4096^3, where the products take ~0.26 and ~0.52 us and
// tma_box_probe streams a k-tile's boxes in ~0.34 us. This probe runs the kernel's pipeline
// (one TMA producer warp, two consumer warpgroups, the same barriers and wgmma calls) on plain
// matrix boxes, with and without the products, at 4 and 6 stages, and times it.
//
// A: 1024 x 2048 floats, block b takes row tile b % 8; B: kBN x 2048, the same for every
// block; 64 k-tiles per block; 132 blocks (one per SM) and 264 (two waves).
// Last, the engine's own kernel (tma_wgmma_kernel, epilogue included) on the convolution's
// boxes through probe producers, under each L2 hint of B's loads (Hint below) and with a
// second column of tiles: what of the engine's ~1 us per k-tile the pipeline alone does not show.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <cuda.h>

#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/arch/tma.cuh"
#include "ops/cuda/arch/wgmma.cuh"
#include "ops/cuda/gemm/tma_mainloop_sm90.cuh"
#include "probe_common.h"

using namespace tg::cuda;

namespace probe {

constexpr int kK = 2048, kKTiles = kK / 32, kARows = 1024;
constexpr int kBatch = 8;  // launches per timing (probe_common::median_ms)
constexpr int kABytes = 128 * 32 * 4;

// kIm2col: A is the 3x3 NHWC convolution of tma_box_probe (x [16, 32, 32, 192], 128 output
// pixels per block, k-tile = (tap, 32 channels): 54 of them) through the engine's im2col map.
constexpr int kConvN = 16, kConvHW = 32, kConvC = 192, kConvKTiles = 9 * kConvC / 32;

// How a box load treats the L2: the plain instruction (the engine's), the cache-hint form with
// a zero operand, or with a policy made by createpolicy (evict-normal, evict-last, evict-first).
enum Hint { kPlain, kZero, kEvictNormal, kEvictLast, kEvictFirst, kHints };
const char* const kHintNames[kHints] = {"plain", "hint 0", "evict-normal", "evict-last", "evict-first"};

__device__ __forceinline__ void load_box_hinted(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                int hint) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  uint64_t policy = 0;
  if (hint == kEvictNormal) asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  if (hint == kEvictLast) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  if (hint == kEvictFirst) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  if (hint == kPlain) tma::load_box(dst, map, bar, c0, c1);
  else tma::load_box(dst, map, bar, c0, c1, policy);
#endif
}

template <int kBN, int kStages, bool kMath, bool kIm2col = false>
__global__ void __launch_bounds__(288, 1) pipeline_kernel(const __grid_constant__ CUtensorMap a_map,
                                                          const __grid_constant__ CUtensorMap b_map, int k_tiles,
                                                          int b_row0, int hint, float* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBBytes = kBN * 32 * 4, kStageBytes = kABytes + kBBytes;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) tma::init_stage_ring(full, empty, kStages, 1, 8);
  __syncthreads();
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  const int a_row = (blockIdx.x % (kARows / 128)) * 128;
  if (warp == 8) {
    if (lane == 0) {
      probe_common::Conv3x3Walk walk(blockIdx.x * 128, kConvHW);
      for (int i = 0; i < k_tiles; ++i) {
        const int s = i % kStages;
        if (i >= kStages) tma::mbar_wait(&empty[s], ((i / kStages) - 1) & 1);
        tma::mbar_arrive_expect_tx(&full[s], kStageBytes);
        unsigned char* dst = smem + s * kStageBytes;
        if (kIm2col) {
          walk.load(dst, &a_map, &full[s]);
          walk.advance(kConvC);
        } else {
          tma::load_box(dst, &a_map, &full[s], i * 32, a_row);
        }
        load_box_hinted(dst + kABytes, &b_map, &full[s], i * 32, b_row0, hint);
      }
    }
    return;
  }
  const int warpgroup = warp / 4;
  float acc[kBN / 2];
#pragma unroll
  for (int q = 0; q < kBN / 2; ++q) acc[q] = 0.f;
  const uint32_t stages = shared_address(smem), a_rows = uint32_t(warpgroup) * 64 * 32 * 4;
  for (int i = 0; i < k_tiles; ++i) {
    const int s = i % kStages;
    tma::mbar_wait(&full[s], (i / kStages) & 1);
    if (kMath) {
      wgmma::fence();
      const uint32_t a_addr = stages + s * kStageBytes + a_rows, b_addr = stages + s * kStageBytes + kABytes;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma::mma_ss_tf32<kBN>(acc, wgmma::sw128_kmajor_desc(a_addr + ks * 32),
                                wgmma::sw128_kmajor_desc(b_addr + ks * 32), true);
      wgmma::commit();
      wgmma::wait<1>();
      if (i > 0 && lane == 0) tma::mbar_arrive(&empty[(i - 1) % kStages]);
    } else if (lane == 0) {
      tma::mbar_arrive(&empty[s]);
    }
  }
  wgmma::wait<0>();
#pragma unroll
  for (int q = 0; q < kBN / 2; ++q) wgmma::fence_operand(acc[q]);
  float sum = 0.f;
#pragma unroll
  for (int q = 0; q < kBN / 2; ++q) sum += acc[q];
  if (sum == 12345.f) sink[blockIdx.x] = sum;  // keeps the products
#endif
}

template <int kBN, int kStages, bool kMath, bool kIm2col = false>
float time_it(const CUtensorMap& a, const CUtensorMap& b, int blocks, float* sink, int k_tiles = kKTiles,
              int b_row0 = 0, int hint = kPlain) {
  constexpr int smem = kStages * (kABytes + kBN * 128) + 2 * kStages * 8 + 1024;
  auto kernel = pipeline_kernel<kBN, kStages, kMath, kIm2col>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return probe_common::median_ms(11, [&] { kernel<<<blocks, 288, smem>>>(a, b, k_tiles, b_row0, hint, sink); }, kBatch);
}

template <int kBN, int kStages>
void row(const CUtensorMap& a, const CUtensorMap& b, float* sink) {
  for (int blocks : {132, 264}) {
    const float t0 = time_it<kBN, kStages, false>(a, b, blocks, sink);
    const float t1 = time_it<kBN, kStages, true>(a, b, blocks, sink);
    const double waves = blocks / 132.0, flops = 2.0 * 128 * kBN * kK * blocks;
    std::printf("B %3d rows, %d stages, %3d blocks: loads only %6.3f us per k-tile, with products %6.3f us (%5.0f TFLOP/s)\n",
                kBN, kStages, blocks, t0 * 1e3 / (kKTiles * waves), t1 * 1e3 / (kKTiles * waves),
                flops / (t1 * 1e-3) / 1e12);
  }
}

// The convolution's 128 blocks x 54 k-tiles: A through the im2col map, or (same bytes per
// k-tile) a box of the GEMM rows' A; B a 128 x 1728 matrix (the packed weights' shape).
void conv_row(const CUtensorMap& x_im2col, const CUtensorMap& a_matrix, const CUtensorMap& w, float* sink) {
  constexpr int blocks = kConvN * kConvHW * kConvHW / 128;
  const float m0 = time_it<128, 6, false, false>(a_matrix, w, blocks, sink, kConvKTiles);
  const float m1 = time_it<128, 6, true, false>(a_matrix, w, blocks, sink, kConvKTiles);
  const float i0 = time_it<128, 6, false, true>(x_im2col, w, blocks, sink, kConvKTiles);
  const float i1 = time_it<128, 6, true, true>(x_im2col, w, blocks, sink, kConvKTiles);
  std::printf("conv 3x3 NHWC 192, 128 blocks x 54 k-tiles, 6 stages, us per k-tile: matrix A %6.3f (with products %6.3f), "
              "im2col A %6.3f (with products %6.3f)\n",
              m0 * 1e3 / kConvKTiles, m1 * 1e3 / kConvKTiles, i0 * 1e3 / kConvKTiles, i1 * 1e3 / kConvKTiles);
}

// The engine's second column of tiles for 192 output channels: B rows 128..255 of a 192-row
// matrix (half the box outside it), under each L2 hint of B's loads.
void conv_b_variants(const CUtensorMap& x_im2col, const CUtensorMap& w192, float* sink) {
  constexpr int blocks = kConvN * kConvHW * kConvHW / 128;
  std::printf("im2col A with products, B of 192 rows, us per k-tile, rows 0..127 / rows 128..255 (half outside):");
  for (int hint = 0; hint < kHints; ++hint) {
    const float inside = time_it<128, 6, true, true>(x_im2col, w192, blocks, sink, kConvKTiles, 0, hint);
    const float half_out = time_it<128, 6, true, true>(x_im2col, w192, blocks, sink, kConvKTiles, 128, hint);
    std::printf(" %s %6.3f / %6.3f;", kHintNames[hint], inside * 1e3 / kConvKTiles, half_out * 1e3 / kConvKTiles);
  }
  std::printf("\n");
}

// Producers for the engine's kernel (tma_mainloop_sm90.cuh's interface), every box load
// under `hint`.
struct ProbeMatrixBoxes {
  CUtensorMap a, b;
  int hint;
  struct Cursor {
    int32_t m0;
  };
  __device__ void prefetch() const {}
  __device__ Cursor start(int32_t, int32_t m0) const { return {m0 % kARows}; }
  __device__ void advance(Cursor&) const {}
  __device__ void load(unsigned char* a_dst, unsigned char* b_dst, uint64_t* bar, const Cursor& at, int32_t kt,
                       int32_t n0) const {
    load_box_hinted(a_dst, &a, bar, kt * 32, at.m0, hint);
    load_box_hinted(b_dst, &b, bar, kt * 32, n0, hint);
  }
};
struct ProbeIm2colBoxes {
  CUtensorMap x, w;
  int hint;
  using Cursor = probe_common::Conv3x3Walk;
  __device__ void prefetch() const {}
  __device__ Cursor start(int32_t, int32_t m0) const { return Cursor(m0, kConvHW); }
  __device__ void advance(Cursor& at) const { at.advance(kConvC); }
  __device__ void load(unsigned char* a_dst, unsigned char* b_dst, uint64_t* bar, const Cursor& at, int32_t kt,
                       int32_t n0) const {
    at.load(a_dst, &x, bar);
    load_box_hinted(b_dst, &w, bar, kt * 32, n0, hint);
  }
};

// One launch of the engine's kernel over `tiles_m` x `tiles_n` 128 x 128 tiles, 54 k-tiles
// each, into out (M x N, row-major); us per k-tile per wave of one block per SM.
template <class Producer>
double engine_us_per_ktile(const Producer& producer, int tiles_m, int tiles_n, int N, float* out, int batch = kBatch) {
  using namespace tg::cuda::engine;
  Plan plan;
  plan.sm90 = true;
  plan.tma_cols = 128;
  plan.tma_blocks_per_sm = 1;
  plan.tiles_m = tiles_m;
  plan.tiles_n = tiles_n;
  plan.splits = 1;
  plan.k_tiles_per_split = kConvKTiles;
  const MainloopArgs args = probe_common::plain_args(tiles_m * 128, N, kConvKTiles, tiles_n, out);
  const float ms = probe_common::median_ms(11, [&] { launch_tma_wgmma(producer, plan, args, 0); }, batch);
  const double waves = std::ceil(double(tiles_m) * tiles_n / 132.0);
  return ms * 1e3 / (kConvKTiles * waves);
}

void engine_rows(const CUtensorMap& a_map, const CUtensorMap& b128, const CUtensorMap& x_im2col,
                 const CUtensorMap& w128, const CUtensorMap& w192, float* out) {
  constexpr int tiles = kConvN * kConvHW * kConvHW / 128;
  std::printf("engine kernel, us per k-tile per wave, matrix boxes / im2col 128 outputs / im2col 192 outputs in two "
              "columns of tiles:");
  for (int hint = 0; hint < kHints; ++hint) {
    const double m = engine_us_per_ktile(ProbeMatrixBoxes{a_map, b128, hint}, tiles, 1, 128, out);
    const double i = engine_us_per_ktile(ProbeIm2colBoxes{x_im2col, w128, hint}, tiles, 1, 128, out);
    const double i2 = engine_us_per_ktile(ProbeIm2colBoxes{x_im2col, w192, hint}, tiles, 2, 192, out);
    std::printf(" %s %6.3f / %6.3f / %6.3f;", kHintNames[hint], m, i, i2);
  }
  std::printf(" (%s)\n", cudaGetErrorString(cudaGetLastError()));
  // One launch per timing: the host's cost of a launch (the engine's launcher sets the kernel's
  // shared-memory attribute every time) shows up as GPU idle time.
  const double single = engine_us_per_ktile(ProbeIm2colBoxes{x_im2col, w128, kPlain}, tiles, 1, 128, out, 1);
  std::printf("engine kernel, im2col 128 outputs, plain, one launch per timing: %6.3f us per k-tile\n", single);
}

}  // namespace probe

int main() {
  using namespace probe;
  std::vector<float> host(size_t(kARows) * kK);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float((i * 2654435761u) % 1000003) * 1e-6f;
  float *a, *b, *sink;
  cudaMalloc(&a, host.size() * 4);
  cudaMalloc(&b, size_t(256) * kK * 4);
  cudaMalloc(&sink, 1024 * 4);
  cudaMemcpy(a, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(b, host.data() + 777, size_t(256) * kK * 4, cudaMemcpyHostToDevice);
  const CUtensorMap a_map = f32_matrix_map("probe A", a, kARows, kK, {128, 32, true});
  const CUtensorMap b128 = f32_matrix_map("probe B", b, 256, kK, {128, 32, true});
  const CUtensorMap b256 = f32_matrix_map("probe B", b, 256, kK, {256, 32, true});
  row<128, 4>(a_map, b128, sink);
  row<128, 6>(a_map, b128, sink);
  row<256, 4>(a_map, b256, sink);

  const size_t xn = size_t(kConvN) * kConvHW * kConvHW * kConvC;
  std::vector<float> xh(xn);
  for (size_t i = 0; i < xn; ++i) xh[i] = float((i * 2654435761u) % 1000003) * 1e-6f;
  float *x, *w;
  cudaMalloc(&x, xn * 4);
  cudaMalloc(&w, size_t(192) * 9 * kConvC * 4);
  cudaMemcpy(x, xh.data(), xn * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(w, xh.data() + 99, size_t(192) * 9 * kConvC * 4, cudaMemcpyHostToDevice);
  const Im2colGeometry g = probe_common::conv3x3_geometry(kConvN, kConvHW, kConvHW, kConvC);
  const CUtensorMap x_im2col = f32_im2col_map("probe x", x, g, 32, 128);
  const CUtensorMap w_map = f32_matrix_map("probe w", w, 128, 9 * kConvC, {128, 32, true});
  conv_row(x_im2col, a_map, w_map, sink);
  const CUtensorMap w192 = f32_matrix_map("probe w", w, 192, 9 * kConvC, {128, 32, true});
  conv_b_variants(x_im2col, w192, sink);
  float* out;
  cudaMalloc(&out, size_t(kConvN) * kConvHW * kConvHW * 192 * 4);
  engine_rows(a_map, b128, x_im2col, w_map, w192, out);
  std::printf("probe done: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
