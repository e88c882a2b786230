// Experiment (not built by CMake): can the engine's TMA pipeline take an A operand stored
// M-major (its reduction strided) by loading wgmma's A fragments into registers itself (the RS
// form), instead of transposing A into a scratch copy first? TF32 wgmma reads only K-major
// operands from shared memory. Channels-first activations (the 1x1 NCHW forwards), Linear's
// backward and a columns-free grad-weight all have such an A (bench/journal/notes_engine_sm90.md).
//
// Same pipeline as dev/wgmma_pipeline_probe.cu (one TMA producer warp, two consumer warpgroups,
// 4 stages, 128 x 128 x 32 k-tiles), three ways:
//   SS      A (M x K, K-major) in 128 x 32 swizzled boxes, both operands from descriptors;
//   RS      A^T (K x M, M-major) in four 32 k x 32 m swizzled boxes per stage; each lane loads
//           its fragments (a[0..3] = A[16 w + g][t], [g + 8][t], [g][t + 4], [g + 8][t + 4] per
//           8-deep step) with 32-bit shared loads, rounds them to TF32, and runs mma_rs_tf32;
//   TS      the same A^T boxes; each warpgroup first copies its 64 rows into a K-major swizzled
//           buffer of its own (double-buffered: 16 loads and 4 16-byte stores per thread per
//           k-tile, no bank conflicts), then runs the SS products on that copy;
//   loads   the boxes alone, no products.
// First a correctness check of RS (and SS) against a double-precision product on the host
// (relative L2 of a 1024 x 128 result, TF32 tolerance), then us per k-tile per wave.
//
// Lane (g, t)'s loads: element (m, k) of a box sits at row k, 16-byte chunk (m % 32) / 4 XOR
// k % 8, word m % 4. A warp's a[0] loads (m = 16 w + g, k = t) then hit chunks c ^ t with
// c in {c0, c0 + 1}: two lanes per bank (2-way conflicts). The probe measures what that costs.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <cuda.h>

#include "ops/cuda/arch/named_barrier.cuh"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/arch/tf32.cuh"
#include "ops/cuda/arch/tma.cuh"
#include "ops/cuda/arch/wgmma.cuh"
#include "probe_common.h"

using namespace tg::cuda;

namespace probe {

constexpr int kM = 1024, kN = 128, kK = 2048, kKTiles = kK / 32, kStages = 4;
constexpr int kABytes = 128 * 32 * 4, kBBytes = kN * 32 * 4, kStageBytes = kABytes + kBBytes;
// TS: per warpgroup two 64 x 32 K-major buffers of 8 KB after the stages, then the barriers.
constexpr int kCopyBytes = 64 * 32 * 4, kCopyRegion = 2 * 2 * kCopyBytes;
constexpr int kSmem = kStages * kStageBytes + kCopyRegion + 2 * kStages * 8 + 1024;
enum Mode { kSS, kRS, kTS, kLoads };

__device__ __forceinline__ void st_shared_v4_at(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// Byte offset of A element (m, k) (m < 128 of the tile, k < 32 of the k-tile) in an RS stage:
// box m / 32 of 32 k rows x 128 bytes, 128-byte swizzle.
__host__ __device__ constexpr uint32_t rs_offset(int m, int k) {
  return uint32_t((m >> 5) * 4096 + k * 128 + ((((m & 31) >> 2) ^ (k & 7)) << 4) + (m & 3) * 4);
}

template <Mode kMode>
__global__ void __launch_bounds__(288, 1) kernel(const __grid_constant__ CUtensorMap a_map,
                                                 const __grid_constant__ CUtensorMap b_map, float* d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes + kCopyRegion);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) tma::init_stage_ring(full, empty, kStages, 1, 8);
  __syncthreads();
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  const int m0 = (blockIdx.x % (kM / 128)) * 128;
  if (warp == 8) {
    if (lane == 0)
      for (int i = 0; i < kKTiles; ++i) {
        const int s = i % kStages;
        if (i >= kStages) tma::mbar_wait(&empty[s], ((i / kStages) - 1) & 1);
        tma::mbar_arrive_expect_tx(&full[s], kStageBytes);
        unsigned char* dst = smem + s * kStageBytes;
        if (kMode == kSS) {
          tma::load_box(dst, &a_map, &full[s], i * 32, m0);  // A (M x K): 128 rows x 32 k
        } else {
          for (int b = 0; b < 4; ++b)  // A^T (K x M): 32 k rows x 32 m, four boxes
            tma::load_box(dst + b * 4096, &a_map, &full[s], m0 + 32 * b, i * 32);
        }
        tma::load_box(dst + kABytes, &b_map, &full[s], i * 32, 0);
      }
    return;
  }
  const int wg = warp / 4, w = warp % 4, g = lane >> 2, t = lane & 3;
  float acc[kN / 2];
#pragma unroll
  for (int q = 0; q < kN / 2; ++q) acc[q] = 0.f;
  uint32_t a_off[4];  // lane (g, t)'s four fragment elements at k-step 0
#pragma unroll
  for (int u = 0; u < 4; ++u) a_off[u] = rs_offset(64 * wg + 16 * w + g + 8 * (u & 1), t + 4 * (u >> 1));
  uint32_t a[2][4][4];  // per k-tile parity: an RS wgmma reads its A registers until it retires
  const uint32_t stages = shared_address(smem);
  for (int i = 0; i < kKTiles; ++i) {
    const int s = i % kStages;
    tma::mbar_wait(&full[s], (i / kStages) & 1);
    const uint32_t stage = stages + s * kStageBytes, b_addr = stage + kABytes;
    if (kMode == kLoads) {
      if (lane == 0) tma::mbar_arrive(&empty[s]);
      continue;
    }
    if (kMode == kRS) {
      uint32_t(&ai)[4][4] = a[i & 1];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int u = 0; u < 4; ++u)  // k-step ks adds 8 rows: 1024 bytes, the swizzle unchanged
          ai[ks][u] = tf32_operand(__uint_as_float(ld_shared(stage + a_off[u] + ks * 1024)));
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)  // the operands exist before the fence (see conv1x1/fprop_sm90.cu)
        asm volatile("" : "+r"(ai[ks][0]), "+r"(ai[ks][1]), "+r"(ai[ks][2]), "+r"(ai[ks][3]));
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma::mma_rs_tf32<kN>(acc, ai[ks], wgmma::sw128_kmajor_desc(b_addr + ks * 32), true);
    } else if (kMode == kTS) {
      // Thread (m, half) of the warpgroup: row m, k = 16 half .. 16 half + 15, as 4 chunks of 4.
      const int tid = threadIdx.x & 127, m = tid & 63, half = tid >> 6;
      const uint32_t copy = stages + kStages * kStageBytes + uint32_t(2 * wg + (i & 1)) * kCopyBytes;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int k0 = 16 * half + 4 * c;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = __uint_as_float(ld_shared(stage + rs_offset(64 * wg + m, k0 + e)));
        st_shared_v4_at(copy + m * 128 + ((((k0 >> 2) ^ (m & 7))) << 4), v[0], v[1], v[2], v[3]);
      }
      wgmma::fence_proxy_async();  // generic-proxy writes, read next by wgmma (async proxy)
      named_barrier_sync(1 + wg, 128);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma::mma_ss_tf32<kN>(acc, wgmma::sw128_kmajor_desc(copy + ks * 32),
                               wgmma::sw128_kmajor_desc(b_addr + ks * 32), true);
    } else {
      wgmma::fence();
      const uint32_t a_addr = stage + uint32_t(wg) * 64 * 128;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma::mma_ss_tf32<kN>(acc, wgmma::sw128_kmajor_desc(a_addr + ks * 32),
                               wgmma::sw128_kmajor_desc(b_addr + ks * 32), true);
    }
    wgmma::commit();
    wgmma::wait<1>();
    // Every mode's wgmma reads B from the stage until it retires: the previous tile's stage is
    // free once wait<1> returned. (Its A copy too: TS writes the other of its two buffers next.)
    if (i > 0 && lane == 0) tma::mbar_arrive(&empty[(i - 1) % kStages]);
  }
  wgmma::wait<0>();
#pragma unroll
  for (int q = 0; q < kN / 2; ++q) wgmma::fence_operand(acc[q]);
  if constexpr (kMode != kLoads) {
    if (blockIdx.x >= kM / 128) return;  // the second wave's blocks repeat the first's tiles
    // acc[4 j + 2 h + e] = D[16 w + g + 8 h][8 j + 2 t + e] of this warpgroup's 64 rows.
    for (int j = 0; j < kN / 8; ++j)
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e)
          d[size_t(m0 + 64 * wg + 16 * w + g + 8 * h) * kN + 8 * j + 2 * t + e] = acc[4 * j + 2 * h + e];
  }
#endif
}

template <Mode kMode>
float run(const CUtensorMap& a, const CUtensorMap& b, float* d, int blocks) {
  auto k = kernel<kMode>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  return probe_common::median_ms(11, [&] { k<<<blocks, 288, kSmem>>>(a, b, d); }, 8);
}

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

}  // namespace probe

int main() {
  using namespace probe;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> a(size_t(kM) * kK), at(size_t(kK) * kM), b(size_t(kN) * kK);
  for (int m = 0; m < kM; ++m)
    for (int k = 0; k < kK; ++k) at[size_t(k) * kM + m] = a[size_t(m) * kK + k] = uni(rng);
  for (float& v : b) v = uni(rng);
  std::vector<double> want(size_t(kM) * kN);
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      double s = 0;
      for (int k = 0; k < kK; ++k) s += double(a[size_t(m) * kK + k]) * b[size_t(n) * kK + k];
      want[size_t(m) * kN + n] = s;
    }
  float *da, *dat, *db, *dd;
  cudaMalloc(&da, a.size() * 4);
  cudaMalloc(&dat, at.size() * 4);
  cudaMalloc(&db, b.size() * 4);
  cudaMalloc(&dd, want.size() * 4);
  cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dat, at.data(), at.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
  const CUtensorMap a_map = f32_matrix_map("probe A", da, kM, kK, {.rows = 128, .cols = 32, .swizzle128 = true});
  const CUtensorMap at_map = f32_matrix_map("probe A^T", dat, kK, kM, {.rows = 32, .cols = 32, .swizzle128 = true});
  const CUtensorMap b_map = f32_matrix_map("probe B", db, kN, kK, {.rows = kN, .cols = 32, .swizzle128 = true});

  std::vector<float> got(want.size());
  const char* const names[] = {"SS", "RS", "TS"};
  for (Mode mode : {kSS, kRS, kTS}) {
    cudaMemset(dd, 0xff, want.size() * 4);  // NaN: a tile the kernel skips shows
    if (mode == kSS) run<kSS>(a_map, b_map, dd, kM / 128);
    else if (mode == kRS) run<kRS>(at_map, b_map, dd, kM / 128);
    else run<kTS>(at_map, b_map, dd, kM / 128);
    cudaMemcpy(got.data(), dd, got.size() * 4, cudaMemcpyDeviceToHost);
    const double err = rel_l2(got, want);
    std::printf("%s: relative L2 against the f64 product %.2e (%s the TF32 limit 2e-3)\n", names[mode], err,
                err < 2e-3 ? "within" : "PAST");
  }
  for (int blocks : {132, 264}) {
    const double waves = blocks / 132.0;
    const float loads = run<kLoads>(at_map, b_map, dd, blocks), ss = run<kSS>(a_map, b_map, dd, blocks);
    const float rs = run<kRS>(at_map, b_map, dd, blocks), ts = run<kTS>(at_map, b_map, dd, blocks);
    auto per_tile = [&](float ms) { return ms * 1e3 / (kKTiles * waves); };
    std::printf("%3d blocks, us per 128x128x32 k-tile per wave: loads only %.3f, SS %.3f, RS %.3f (RS/SS %.2f), "
                "TS %.3f (TS/SS %.2f)\n",
                blocks, per_tile(loads), per_tile(ss), per_tile(rs), rs / ss, per_tile(ts), ts / ss);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %s\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
