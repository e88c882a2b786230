// The channels-last 1x1 forward (workload B's NHWC forward) on Hopper: tiles moved by the TMA
// unit, the product on wgmma, TF32.
//
// Why a separate kernel: B's NHWC forward is a pure stream (x 4.3 GB in, y 8.6 GB out, 275
// GFLOP: 3.0 ms at 4.3 TB/s, 0.7 ms of tensor time), and the cp.async kernels of conv1x1.cu spend
// their time in the shared-memory instruction queue (ncu: mio_throttle the top stall; per warp
// and tile 416 shared-memory wavefronts for copies in, fragment loads and the staged stores'
// write-and-read-back) and reach 80% of the copy rate. Channels-last tiles are plain boxes of the
// (rows, channels) matrices, which the TMA unit moves with one instruction per box: no warp
// issues a global load or store.
//
// Block: one per SM (persistent), 288 threads: warp 8 is the producer (one lane issues the
// loads), warpgroups 0 and 1 consume. A tile is 128 rows (pixels) x 128 output channels;
// warpgroup w owns rows 64 w .. 64 w + 63: one wgmma.m64n128k8 per 8 reduction channels, A (the
// activations) from registers, B (the weight) from shared memory.
//   x tile    [box b: channels 32 b .. 32 b + 31][128 rows][32 channels] with the 128-byte swizzle
//             (tensor_map.h), kStages stages of kKS / 4 boxes; zeros past the matrix;
//   y staging [warpgroup][64 rows][128 channels], dense, one per warpgroup, drained by ONE TMA
//             store of the whole half tile: 32 KB of consecutive addresses of y when M = 128
//             (as four 32-channel swizzled boxes, each writing every fourth 128-byte piece, B's
//             forward took 3.62 ms instead of 3.43 on an H200: the order of the writes matters);
//   weight    A (128 x 8 kKS) as wgmma's K-major B operand, no swizzle: element (n, k) at float
//             (k / 4) 512 + n 4 + k % 4 (ops/cuda/wgmma.cuh has the layout rules); bias (128).
// Synchronization: full[s] (the producer's expect_tx + the TMA bytes) and empty[s] (one arrival
// per consumer warp once its ldmatrix have read the stage: the stage is free long before the
// tile's stores), per stage; each warpgroup's store thread waits until its previous store has
// read the staging (bulk_wait_read) before the warpgroup's barrier that lets the warps rewrite
// it. (Two staging buffers per warpgroup, which leave room for only 2 stages, were slower: 3.78
// vs 3.66 ms; 3 stages instead of 4 the same.)
//
// Numerics as the mma.sync kernels: the activations rounded to nearest TF32 in registers (after
// ldmatrix), the weight rounded once when it is staged: NHWC agrees with NCHW to FP32 rounding.
#include "ops/cuda/conv1x1_nhwc_tma.h"

#include <algorithm>

#include "core/cuda_context.h"
#include "core/error.h"
#include "ops/cuda/hopper.h"
#include "ops/cuda/named_barrier.cuh"
#include "ops/cuda/tensor_map.h"
#include "ops/cuda/tma.cuh"
#include "ops/cuda/wgmma.cuh"

namespace tg::cuda {
namespace {

constexpr int kTileRows = 128;                  // pixels per tile
constexpr int kHalfRows = 64;                   // per warpgroup (wgmma's M)
constexpr int kOutChannels = 128;               // per launch (wgmma's N)
constexpr int kBoxChannels = 32;                // x boxes: 128 bytes, the widest 128-byte-swizzle row
constexpr int kStages = 4;
constexpr int kConsumers = 256, kThreads = kConsumers + 32;
constexpr int kInBoxBytes = kTileRows * kBoxChannels * 4;     // 16 KB
constexpr int kStagingBytes = kHalfRows * kOutChannels * 4;   // 32 KB per warpgroup
constexpr uint32_t kWeightLbo = 16 * 128, kWeightSbo = 128;  // see the layout above

struct Params {
  CUtensorMap x_map;  // (rows, R), boxes of 128 rows x 32 channels, 128-byte swizzle
  CUtensorMap y_map;  // (rows, M), boxes of 64 rows x 128 channels, dense
  const float* w;
  int64_t w_stride_m, w_stride_r;
  const float* bias;
  int m0, m_count, r_count;  // this launch: output channels m0 .. m0 + m_count - 1 (<= 128)
  int64_t rows, tiles;
};

template <int kKS>
struct Layout {
  static constexpr int kInBoxes = kKS / 4;
  static constexpr int kStageBytes = kInBoxes * kInBoxBytes;
  static constexpr int kOutOffset = kStages * kStageBytes;
  static constexpr int kWeightOffset = kOutOffset + 2 * kStagingBytes;
  static constexpr int kBiasOffset = kWeightOffset + kOutChannels * 8 * kKS * 4;
  static constexpr int kBarOffset = kBiasOffset + kOutChannels * 4;
  static constexpr int kBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + alignment slack
};

__device__ __forceinline__ uint32_t tf32_round(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }
// As a plain TF32 operand the tensor core reads only the top 19 bits: adding half an ulp rounds.
__device__ __forceinline__ uint32_t tf32_operand(uint32_t bits) { return bits + 0x1000u; }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void st_shared_v2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

template <int kKS>
__global__ void __launch_bounds__(kThreads, 1) pointwise_nhwc_tma_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<kKS>;
  extern __shared__ unsigned char smem_raw[];
  // The swizzled boxes need 1024-byte alignment (the swizzle is a function of address bits 7-9).
  unsigned char* smem = smem_raw + ((1024 - (tma::smem_u32(smem_raw) & 1023)) & 1023);
  float* wb = reinterpret_cast<float*>(smem + L::kWeightOffset);
  float* bias_s = reinterpret_cast<float*>(smem + L::kBiasOffset);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarOffset);
  uint64_t* empty = full + kStages;

  for (int e = threadIdx.x; e < kOutChannels * 8 * kKS; e += kThreads) {
    const int n = (e >> 2) & (kOutChannels - 1), k = 4 * (e >> 9) + (e & 3);
    const float v = (n < p.m_count && k < p.r_count) ? p.w[(p.m0 + n) * p.w_stride_m + k * p.w_stride_r] : 0.f;
    wb[e] = __uint_as_float(tf32_round(v));
  }
  for (int c = threadIdx.x; c < kOutChannels; c += kThreads)
    bias_s[c] = (p.bias != nullptr && c < p.m_count) ? p.bias[p.m0 + c] : 0.f;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::mbar_init(&full[s], 1);
      tma::mbar_init(&empty[s], kConsumers / 32);
    }
    tma::mbar_init_fence();
  }
  wgmma::fence_proxy_async();  // the weight's plain stores, for wgmma
  __syncthreads();
  // From here on the roles part: no block-wide barrier below.

  // warp is the same in every lane; ptxas must see that (a shuffle's result is uniform), or it
  // treats the consumer path as divergent and serializes the wgmma (C7520).
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  if (warp == kConsumers / 32) {
    if (lane == 0) {
      tma::prefetch_map(&p.x_map);
      uint64_t policy;
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
      int i = 0;
      for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x, ++i) {
        const int s = i % kStages;
        const uint32_t use = i / kStages;
        if (use > 0) tma::mbar_wait(&empty[s], (use - 1) & 1);  // every consumer warp read use - 1
        tma::mbar_arrive_expect_tx(&full[s], L::kStageBytes);
        unsigned char* dst = smem + s * L::kStageBytes;
#pragma unroll
        for (int b = 0; b < L::kInBoxes; ++b)
          tma::load_box(dst + b * kInBoxBytes, &p.x_map, &full[s], b * kBoxChannels, static_cast<int>(tile * kTileRows),
                        policy);
      }
    }
    return;
  }

  const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, t = lane & 3;
  const bool store_thread = (threadIdx.x & 127) == 0;
  if (store_thread) tma::prefetch_map(&p.y_map);
  // ldmatrix: lane 8 j + r hands row r of matrix j: rows 16 wi + r + 8 (j & 1) of the warpgroup's
  // half, 16-byte chunk 2 (ks % 4) + (j >> 1) of box ks / 4, stored at chunk ^ (row % 8) = ^ r.
  const int j8 = lane >> 3, r8 = lane & 7;
  const uint32_t a_row = static_cast<uint32_t>(kHalfRows * wg + 16 * wi + r8 + 8 * (j8 & 1)) * 128;
  uint32_t a_off[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) a_off[u] = a_row + ((((2 * u + (j8 >> 1)) ^ r8)) << 4);
  // Staging: result (row 16 wi + g + 8 h, channel 8 j + 2 t + e) of this warpgroup's half at
  // float (16 wi + g + 8 h) 128 + 8 j + 2 t + e. Rows are 512 bytes, so every row starts at bank
  // 0: were all lanes to store n-tile j together, a half-warp's 4 rows (g % 4) would collide 4
  // ways. In step j lane (g, t) stores n-tile j ^ (g % 4) instead: 8 (j ^ g) % 32 + 2 t covers the
  // 32 banks once per half-warp.
  const int gq = g & 3;
  float* staging = reinterpret_cast<float*>(smem + L::kOutOffset + wg * kStagingBytes);
  uint32_t st_off[4];  // step j's address: st_off[j % 4] + 32 (j / 4) + 8 h rows
#pragma unroll
  for (int q = 0; q < 4; ++q) st_off[q] = tma::smem_u32(staging + (16 * wi + g) * kOutChannels + 8 * (q ^ gq) + 2 * t);
  float2 bias_r[16];  // the bias of the channels this lane stores in step j
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int n = 8 * (j ^ gq) + 2 * t;
    bias_r[j] = make_float2(bias_s[n], bias_s[n + 1]);
  }
  const uint64_t desc_w = wgmma::kmajor_desc(tma::smem_u32(wb), kWeightLbo, kWeightSbo);
  const uint32_t stages_base = tma::smem_u32(smem);

  float acc[64];
  int i = 0;
  for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x, ++i) {
    const int s = i % kStages;
    tma::mbar_wait(&full[s], (i / kStages) & 1);
    uint32_t a[kKS][4];
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      uint32_t r[4];
      ldmatrix_x4(r, stages_base + s * L::kStageBytes + (ks >> 2) * kInBoxBytes + a_off[ks & 3]);
#pragma unroll
      for (int e = 0; e < 4; ++e) a[ks][e] = tf32_operand(r[e]);
    }
    __syncwarp();
    if (lane == 0) tma::mbar_arrive(&empty[s]);  // this warp's reads of stage s are done
    // The rounded fragments exist before the fence: left to itself the compiler sinks the adds
    // between the wgmma, and ptxas then serializes them (C7519/C7520).
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) asm volatile("" : "+r"(a[ks][0]), "+r"(a[ks][1]), "+r"(a[ks][2]), "+r"(a[ks][3]));
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks)
      wgmma::mma_rs_tf32<128>(acc, a[ks], wgmma::desc_advance(desc_w, ks * 2 * kWeightLbo), ks > 0);
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int e = 0; e < 64; ++e) wgmma::fence_operand(acc[e]);

    if (store_thread) tma::bulk_wait_read<0>();  // the previous tile's store has read the staging
    named_barrier_sync(1 + wg, 128);
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // acc[4 (j ^ gq) + 2 h + e], by selects: a register index must be known at compile time.
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          v[e] = acc[4 * j + 2 * h + e];
#pragma unroll
          for (int x = 1; x < 4; ++x) v[e] = gq == x ? acc[4 * (j ^ x) + 2 * h + e] : v[e];
        }
        st_shared_v2(st_off[j & 3] + 4 * (32 * (j >> 2) + 8 * h * kOutChannels), v[0] + bias_r[j].x,
                     v[1] + bias_r[j].y);
      }
    wgmma::fence_proxy_async();  // the staging writes, for the TMA store (async proxy)
    named_barrier_sync(1 + wg, 128);
    if (store_thread) {
      const int row = static_cast<int>(tile * kTileRows) + kHalfRows * wg;
      if (row < p.rows) tma::store_box(&p.y_map, staging, p.m0, row);  // the part past the matrix is skipped
      tma::bulk_commit();
    }
  }
  if (store_thread) tma::bulk_wait();  // the staging must outlive the stores reading it
#else
  __trap();  // launched only where device_runs_wgmma (sm_90a code on an H100 / H200)
#endif
}

template <int kKS>
void launch(const Params& p, int dev, cudaStream_t st) {
  const int smem = Layout<kKS>::kBytes;
  auto kernel = pointwise_nhwc_tma_kernel<kKS>;
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t grid = std::min<int64_t>(p.tiles, sm_count(dev));
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, st>>>(p);
  TG_LAUNCH_CHECK();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool pointwise_nhwc_tma_applies(const float* y, const float* x, int64_t rows, int64_t M, int64_t R, int dev) {
  return R > 0 && R <= 64 && R % 4 == 0 && M > 0 && M % 4 == 0 && rows > 0 && rows < (int64_t(1) << 31) - kTileRows &&
         aligned16(x) && aligned16(y) && device_runs_wgmma(dev);
}

void pointwise_nhwc_tma(float* y, const float* x, const float* w, int64_t w_stride_m, int64_t w_stride_r,
                        const float* bias, int64_t rows, int64_t M, int64_t R, int dev, cudaStream_t st) {
  TG_CHECK(pointwise_nhwc_tma_applies(y, x, rows, M, R, dev), "conv1x1 (NHWC, TMA): not applicable to x (", rows,
           ", ", R, ") -> y (", rows, ", ", M, ") on device ", dev);
  Params p{};
  p.x_map = f32_matrix_map("conv1x1 (NHWC, TMA)", x, rows, R, {kTileRows, kBoxChannels, true});
  p.y_map = f32_matrix_map("conv1x1 (NHWC, TMA)", y, rows, M, {kHalfRows, kOutChannels, false});
  p.w = w;
  p.w_stride_m = w_stride_m;
  p.w_stride_r = w_stride_r;
  p.r_count = static_cast<int>(R);
  p.rows = rows;
  p.tiles = (rows + kTileRows - 1) / kTileRows;
  set_device(dev);
  for (int64_t m0 = 0; m0 < M; m0 += kOutChannels) {
    p.m0 = static_cast<int>(m0);
    p.m_count = static_cast<int>(std::min<int64_t>(kOutChannels, M - m0));
    p.bias = bias;
    if (R <= 32) launch<4>(p, dev, st);
    else launch<8>(p, dev, st);
  }
}

}  // namespace tg::cuda
