// The 1x1 forward product on Hopper (sm_90a), both layouts, TF32 or FP32-accurate: tiles moved by
// the TMA unit (no warp issues a global load or store), the product on wgmma. Serves
// run_pointwise when pointwise_tma_applies (R <= 64, 16-byte rows). Design: docs/kernels/conv1x1.md
//
// One block per SM, 288 threads: warp 8 the producer, warpgroups 0 and 1 consume; tile = 128
// pixels x 128 output channels, one wgmma.m64n128k8 per 8 reduction channels (three in FP32),
// A from registers, B (the weight, K-major, no swizzle: element (n, k) at float
// (k / 4) 512 + n 4 + k % 4) resident in smem; FP32 keeps a hi and a lo copy.
// x boxes carry the 128-byte swizzle (chunk c of box row r at c ^ (r % 8)); y is staged densely
// and drained by ONE TMA store per warpgroup (write order matters: see the note).
// NCHW fragments: lane (g, t) reads channels 2t and 2t + 1 (conflict-free with the swizzle), so
// the resident weight is stored in that order (channel_of_column): only a reordering of terms.
// FP32: x = hi + lo, w likewise; lo w_hi + hi w_lo + hi w_hi on one accumulator (one shape).
//
// Synchronization: full[s] (producer's expect_tx + TMA bytes), empty[s] (one arrival per consumer
// warp once it has read its fragments). Before a warpgroup rewrites its staging, its store thread
// waits for the previous store to have read it (bulk_wait_read), then the warpgroup's barrier.
#include "ops/cuda/conv1x1/fprop_sm90.h"

#include <algorithm>

#include "core/cuda_context.h"
#include "core/error.h"
#include "ops/cuda/arch/cp_async.cuh"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/named_barrier.cuh"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/arch/tf32.cuh"
#include "ops/cuda/arch/tma.cuh"
#include "ops/cuda/arch/wgmma.cuh"
#include "ops/cuda/conv1x1/tile_sm90.cuh"

namespace tg::cuda {
namespace {

using namespace conv1x1_sm90;
constexpr uint32_t kWeightLbo = 16 * 128, kWeightSbo = 128;  // see the layout above

struct Params {
  CUtensorMap x_map;  // NHWC: (rows, R) in 128 x 32 boxes (R = 64: (rows, 2, 32) in 128 x 2 x 32);
                      // NCHW: (images, R, pixels) in boxes of 8 kKS x 32
  CUtensorMap y_map;  // NHWC: (rows, M) in boxes of 64 x 128; NCHW: (images, M, pixels) in boxes of 128 x 64; dense
  const float* w;
  int64_t w_stride_m, w_stride_r;
  const float* bias;
  int m0, m_count, r_count;  // this launch: output channels m0 .. m0 + m_count - 1 (<= 128)
  int64_t pixels;            // NHWC: rows of x and y; NCHW: pixels per image
  int64_t tiles_per_image;   // NCHW
  int64_t tiles;
};

// kRows (NHWC only): x arrives as one box of 128 whole rows (R = 64) instead of R / 32 boxes
// of 32-channel halves (see the layout above).
template <bool kNchw, int kKS, bool kSplit, bool kRows>
struct Layout {
  static constexpr int kStages = kSplit ? 3 : 4;
  static constexpr int kInBoxes = kRows ? 1 : kNchw ? kTileRows / kBoxFloats : kKS / 4;
  static constexpr int kInBoxBytes = kRows ? kTileRows * 32 * kKS : kNchw ? 8 * kKS * 128 : kTileRows * 128;
  static constexpr int kStageBytes = kInBoxes * kInBoxBytes;  // 4 KB per k-step either way
  static constexpr int kOutOffset = kStages * kStageBytes;
  static constexpr int kWeightWords = kOutChannels * 8 * kKS;
  static constexpr int kWeightOffset = kOutOffset + 2 * kStagingBytes;
  static constexpr int kBiasOffset = kWeightOffset + (kSplit ? 2 : 1) * kWeightWords * 4;
  static constexpr int kBarOffset = kBiasOffset + kOutChannels * 4;
  static constexpr int kBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + alignment slack
};

template <bool kNchw>
__device__ __forceinline__ TilePlace place_of(const Params& p, int64_t tile) {
  return conv1x1_sm90::place_of<kNchw>(tile, p.tiles_per_image);
}

template <bool kNchw, int kKS, bool kSplit, bool kRows>
__global__ void __launch_bounds__(kThreads, 1) pointwise_tma_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<kNchw, kKS, kSplit, kRows>;
  constexpr int kStages = L::kStages;
  extern __shared__ unsigned char smem_raw[];
  // The swizzled boxes need 1024-byte alignment (the swizzle is a function of address bits 7-9).
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  uint32_t* w_hi = reinterpret_cast<uint32_t*>(smem + L::kWeightOffset);
  uint32_t* w_lo = w_hi + L::kWeightWords;  // FP32 mode only
  float* bias_s = reinterpret_cast<float*>(smem + L::kBiasOffset);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarOffset);
  uint64_t* empty = full + kStages;

  for (int e = threadIdx.x; e < L::kWeightWords; e += kThreads) {
    const int n = (e >> 2) & (kOutChannels - 1), r = channel_of_column<kNchw>(4 * (e >> 9) + (e & 3));
    const float v = (n < p.m_count && r < p.r_count) ? p.w[(p.m0 + n) * p.w_stride_m + r * p.w_stride_r] : 0.f;
    w_hi[e] = tf32_bits(v);
    if constexpr (kSplit) w_lo[e] = tf32_bits(v - __uint_as_float(w_hi[e]));
  }
  for (int c = threadIdx.x; c < kOutChannels; c += kThreads)
    bias_s[c] = (p.bias != nullptr && c < p.m_count) ? p.bias[p.m0 + c] : 0.f;
  if (threadIdx.x == 0) tma::init_stage_ring(full, empty, kStages, 1, kConsumers / 32);
  wgmma::fence_proxy_async();  // the weight's plain stores, for wgmma
  __syncthreads();
  // From here on the roles part: no block-wide barrier below.

  // warp is the same in every lane; ptxas must see that (a shuffle's result is uniform), or it
  // treats the consumer path as divergent and serializes the wgmma (C7520).
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  if (warp == kConsumers / 32) {
    if (lane == 0) {
      tma::prefetch_map(&p.x_map);
      const uint64_t policy = l2_evict_first_policy();
      int i = 0;
      for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x, ++i) {
        const int s = i % kStages;
        const uint32_t use = i / kStages;
        if (use > 0) tma::mbar_wait(&empty[s], (use - 1) & 1);  // every consumer warp read use - 1
        tma::mbar_arrive_expect_tx(&full[s], L::kStageBytes);
        unsigned char* dst = smem + s * L::kStageBytes;
        const TilePlace at = place_of<kNchw>(p, tile);
#pragma unroll
        for (int b = 0; b < L::kInBoxes; ++b) {
          if constexpr (kRows)
            tma::load_box_3d(dst, &p.x_map, &full[s], 0, 0, at.pixel, policy);
          else if constexpr (kNchw)
            tma::load_box_3d(dst + b * L::kInBoxBytes, &p.x_map, &full[s], at.pixel + b * kBoxFloats, 0, at.n, policy);
          else
            tma::load_box(dst + b * L::kInBoxBytes, &p.x_map, &full[s], b * kBoxFloats, at.pixel, policy);
        }
      }
    }
    return;
  }

  const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, t = lane & 3;
  const bool store_thread = (threadIdx.x & 127) == 0;
  if (store_thread) tma::prefetch_map(&p.y_map);
  float* staging = reinterpret_cast<float*>(smem + L::kOutOffset + wg * kStagingBytes);
  // Per-lane offsets of the fragment loads (a_off) and of the staging writes (st_off), and the
  // bias of the channels each staging write carries.
  uint32_t a_off[4], st_off[4], a_off_c[kRows ? kKS : 1];
  const int gq = g & 3;  // NHWC's staging rotation
  if constexpr (kNchw) {
    nchw_fragment_offsets(a_off, wg, wi, g, t, L::kInBoxBytes);
    nchw_staging_offsets(st_off, staging, wi, g, t);
  } else {
    // ldmatrix: lane 8 j + r hands row r of matrix j: rows 16 wi + r + 8 (j & 1) of the
    // warpgroup's half, 16-byte chunk 2 (ks % 4) + (j >> 1) of box ks / 4, stored at chunk ^ r.
    const int j8 = lane >> 3, r8 = lane & 7;
    const uint32_t a_row = static_cast<uint32_t>(kHalfRows * wg + 16 * wi + r8 + 8 * (j8 & 1)) * 128;
#pragma unroll
    for (int u = 0; u < 4; ++u) a_off[u] = a_row + ((((2 * u + (j8 >> 1)) ^ r8)) << 4);
    if constexpr (kRows) {
      // One box of whole rows: smem row 2 pixel + ks / 4 holds channels 32 (ks / 4) .. + 31.
      const int pixel = kHalfRows * wg + 16 * wi + r8 + 8 * (j8 & 1);
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        const int row = (kKS / 4) * pixel + (ks >> 2), c = 2 * (ks & 3) + (j8 >> 1);
        a_off_c[ks] = row * 128 + ((c ^ (row & 7)) << 4);
      }
    }
    // Staging: result (row 16 wi + g + 8 h, channel 8 j + 2 t + e) of this warpgroup's half at
    // float (16 wi + g + 8 h) 128 + 8 j + 2 t + e. Rows are 512 bytes, so every row starts at bank
    // 0: were all lanes to store n-tile j together, a half-warp's 4 rows (g % 4) would collide 4
    // ways. In step j lane (g, t) stores n-tile j ^ (g % 4) instead: 8 (j ^ g) % 32 + 2 t covers
    // the 32 banks once per half-warp. Step j's address: st_off[j % 4] + 32 (j / 4) + 8 h rows.
#pragma unroll
    for (int q = 0; q < 4; ++q)
      st_off[q] = shared_address(staging + (16 * wi + g) * kOutChannels + 8 * (q ^ gq) + 2 * t);
  }
  // The bias of the two channels lane (g, t) stores in step j: in registers for TF32; FP32 mode
  // needs those registers (ptxas caps 288 threads at 168) and reads it at the epilogue.
  auto bias_channel = [&](int j) { return (kNchw ? 8 * j : 8 * (j ^ gq)) + 2 * t; };
  float2 bias_r[kSplit ? 1 : 16];
  if constexpr (!kSplit) {
#pragma unroll
    for (int j = 0; j < 16; ++j) bias_r[j] = *reinterpret_cast<const float2*>(bias_s + bias_channel(j));
  }
  const uint64_t desc_hi = wgmma::kmajor_desc(shared_address(w_hi), kWeightLbo, kWeightSbo);
  const uint64_t desc_lo = wgmma::kmajor_desc(shared_address(w_lo), kWeightLbo, kWeightSbo);
  const uint32_t stages_base = shared_address(smem);

  float acc[64];
  int i = 0;
  for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x, ++i) {
    const int s = i % kStages;
    tma::mbar_wait(&full[s], (i / kStages) & 1);
    const uint32_t stage = stages_base + s * L::kStageBytes;
    uint32_t raw[kKS][4];
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      if constexpr (kNchw) {
#pragma unroll
        for (int u = 0; u < 4; ++u) raw[ks][u] = ld_shared(stage + ks * 8 * 128 + a_off[u]);
      } else {
        if constexpr (kRows) ldmatrix_x4(raw[ks], stage + a_off_c[ks]);
        else ldmatrix_x4(raw[ks], stage + (ks >> 2) * L::kInBoxBytes + a_off[ks & 3]);
      }
    }
    __syncwarp();
    if (lane == 0) tma::mbar_arrive(&empty[s]);  // this warp's reads of stage s are done
    uint32_t a_hi[kKS][4], a_lo[kKS][4];
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks)
#pragma unroll
      for (int u = 0; u < 4; ++u) tf32_fragment<kSplit>(__uint_as_float(raw[ks][u]), a_hi[ks][u], a_lo[ks][u]);
    pin_fragments<kSplit>(a_hi, a_lo);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      const uint32_t k_bytes = ks * 2 * kWeightLbo;
      if constexpr (kSplit) {
        // The small terms first; all three of one shape on one accumulator.
        wgmma::mma_rs_tf32<128>(acc, a_lo[ks], wgmma::desc_advance(desc_hi, k_bytes), ks > 0);
        wgmma::mma_rs_tf32<128>(acc, a_hi[ks], wgmma::desc_advance(desc_lo, k_bytes), true);
      }
      wgmma::mma_rs_tf32<128>(acc, a_hi[ks], wgmma::desc_advance(desc_hi, k_bytes), kSplit || ks > 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int e = 0; e < 64; ++e) wgmma::fence_operand(acc[e]);

    if (store_thread) tma::bulk_wait_read<0>();  // the previous tile's stores have read the staging
    named_barrier_sync(1 + wg, 128);
    auto bias_of = [&](int j) -> float2 {
      if constexpr (kSplit) return *reinterpret_cast<const float2*>(bias_s + bias_channel(j));
      else return bias_r[j];
    };
    if constexpr (kNchw) {
      stage_nchw_tile(acc, st_off, t, bias_of);
    } else {
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
          const float2 b = bias_of(j);
          st_shared_v2(st_off[j & 3] + 4 * (32 * (j >> 2) + 8 * h * kOutChannels), v[0] + b.x, v[1] + b.y);
        }
    }
    wgmma::fence_proxy_async();  // the staging writes, for the TMA stores (async proxy)
    named_barrier_sync(1 + wg, 128);
    if (store_thread) {
      const TilePlace at = place_of<kNchw>(p, tile);
      const int pixel = at.pixel + kHalfRows * wg;
      if constexpr (kNchw) {
        if (pixel < p.pixels) tma::store_box_3d(&p.y_map, staging, pixel, p.m0, at.n);
      } else {
        if (pixel < p.pixels) tma::store_box(&p.y_map, staging, p.m0, pixel);  // the part past the matrix is skipped
      }
      tma::bulk_commit();
    }
  }
  if (store_thread) tma::bulk_wait();  // the staging must outlive the stores reading it
#else
  __trap();  // launched only where device_runs_wgmma (sm_90a code on an H100 / H200)
#endif
}

template <bool kNchw, int kKS, bool kSplit, bool kRows>
void launch(const Params& p, int dev, cudaStream_t st) {
  const int smem = Layout<kNchw, kKS, kSplit, kRows>::kBytes;
  auto kernel = pointwise_tma_kernel<kNchw, kKS, kSplit, kRows>;
  allow_dynamic_smem(kernel, smem);
  const int64_t grid = std::min<int64_t>(p.tiles, sm_count(dev));
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, st>>>(p);
  TG_LAUNCH_CHECK();
}

// NHWC x as one box of whole rows: where a row is two 32-channel halves.
bool nhwc_whole_rows(int64_t R) { return R == 64; }

template <bool kNchw, bool kSplit>
void launch_for(const Params& p, int64_t R, int dev, cudaStream_t st) {
  if (R <= 32) launch<kNchw, 4, kSplit, false>(p, dev, st);
  else if (!kNchw && nhwc_whole_rows(R)) launch<false, 8, kSplit, true>(p, dev, st);
  else launch<kNchw, 8, kSplit, false>(p, dev, st);
}

// The resident kernel's own rule (R <= 64).
bool resident_applies(const PointwiseTmaProblem& q, int dev) {
  if (q.R < 1 || q.R > 64 || q.M < 1 || q.images < 1 || q.pixels < 1 || !aligned16(q.x) || !aligned16(q.y))
    return false;
  const bool rows_ok = q.nchw ? q.pixels % 4 == 0 && q.pixels < kCoordinateLimit && q.images < kCoordinateLimit
                              : q.R % 4 == 0 && q.M % 4 == 0 && q.images <= kCoordinateLimit / q.pixels;
  return rows_ok && device_runs_wgmma(dev);
}

}  // namespace

bool pointwise_tma_applies(const PointwiseTmaProblem& q, int dev) {
  return resident_applies(q, dev) || pointwise_tma_streamed_applies(q, dev);
}

void pointwise_tma(const PointwiseTmaProblem& q, int dev, cudaStream_t st, bool stream_weight) {
  if ((stream_weight || !resident_applies(q, dev)) && pointwise_tma_streamed_applies(q, dev))
    return pointwise_tma_streamed(q, dev, st);
  const char* op = q.nchw ? "conv1x1 (NCHW, TMA)" : "conv1x1 (NHWC, TMA)";
  TG_CHECK(resident_applies(q, dev), op, ": not applicable to ", q.images, " images of ", q.pixels,
           " pixels, ", q.R, " -> ", q.M, " channels on device ", dev);
  Params p{};
  if (q.nchw) {
    const int box_channels = q.R <= 32 ? 32 : 64;
    p.x_map = f32_planes_map(op, q.x, q.images, q.R, q.pixels, {box_channels, kBoxFloats, true});
    p.y_map = f32_planes_map(op, q.y, q.images, q.M, q.pixels, {kOutChannels, kHalfRows, false});
    p.pixels = q.pixels;
    p.tiles_per_image = (q.pixels + kTileRows - 1) / kTileRows;
    p.tiles = q.images * p.tiles_per_image;
  } else {
    const int64_t rows = q.images * q.pixels;
    if (nhwc_whole_rows(q.R))  // each row as 2 x 32 channels: one box of 128 whole rows
      p.x_map = f32_planes_map(op, q.x, rows, 2, kBoxFloats, {2, kBoxFloats, true, kTileRows});
    else
      p.x_map = f32_matrix_map(op, q.x, rows, q.R, {kTileRows, kBoxFloats, true});
    p.y_map = f32_matrix_map(op, q.y, rows, q.M, {kHalfRows, kOutChannels, false});
    p.pixels = rows;
    p.tiles = (rows + kTileRows - 1) / kTileRows;
  }
  p.w = q.w;
  p.w_stride_m = q.w_stride_m;
  p.w_stride_r = q.w_stride_r;
  p.r_count = static_cast<int>(q.R);
  p.bias = q.bias;
  set_device(dev);
  for (int64_t m0 = 0; m0 < q.M; m0 += kOutChannels) {
    p.m0 = static_cast<int>(m0);
    p.m_count = static_cast<int>(std::min<int64_t>(kOutChannels, q.M - m0));
    if (q.nchw) {
      if (q.split) launch_for<true, true>(p, q.R, dev, st);
      else launch_for<true, false>(p, q.R, dev, st);
    } else {
      if (q.split) launch_for<false, true>(p, q.R, dev, st);
      else launch_for<false, false>(p, q.R, dev, st);
    }
  }
}

}  // namespace tg::cuda
