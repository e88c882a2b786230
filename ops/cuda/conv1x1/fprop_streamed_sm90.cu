// The channels-first 1x1 forward product on Hopper (sm_90a) with the weight streamed beside the
// activations: any reduction length R, any output count M, TF32 or FP32-accurate, no transpose of
// the input. pointwise_tma runs it for NCHW problems past the resident kernel's 64 reduction
// channels (conv1x1/fprop_sm90.cu). Design: docs/kernels/conv1x1.md.
//
// TF32 wgmma reads both shared-memory operands K-major only, and a channels-first input has its
// pixels, not its channels, contiguous. So A (pixels x channels) comes from registers: each
// consumer loads its fragments from the swizzled [32 channels][32 pixels] boxes itself, in the
// order of tile_sm90.cuh (lane (g, t) takes channels 2t and 2t + 1 into columns t and t + 4).
// B, the weight, is K-major already (w[m][r], r contiguous); one small pass first writes it with
// its columns in that same order, rounded to TF32 (FP32 mode: a TF32 head copy and a TF32
// remainder copy), so the TMA unit can bring it as plain 128 x 32 boxes.
//
// One block per SM (persistent), 288 threads: warp 8 the producer, warpgroups 0 and 1 consume.
// A work item is a tile of 128 pixels of one image times 128 output channels; the items of one
// pixel tile follow each other (m-blocks inner), so its activations come from L2 after the first.
// Per item, k-tiles of 32 channels: a stage holds four x boxes (16 KB) and the weight's 128 x 32
// box (16 KB; FP32 mode also its remainder box). A consumer warp waits for `full`, loads its
// fragments, runs 4 wgmma.m64n128k8 (12 in FP32 mode: lo w_hi + hi w_lo + hi w_hi, on a per-k-tile
// accumulator added to the tile's in FP32), waits for them (the weight box is read by the wgmma)
// and releases the stage on `empty` (one arrival per consumer warp). The epilogue stages the 64 x 128 results and sends them with one TMA store per
// warpgroup, as the resident kernel does.
#include <algorithm>

#include "core/cuda_context.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/cuda/arch/cp_async.cuh"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/named_barrier.cuh"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/arch/tf32.cuh"
#include "ops/cuda/arch/tma.cuh"
#include "ops/cuda/arch/wgmma.cuh"
#include "ops/cuda/conv1x1/fprop_sm90.h"
#include "ops/cuda/conv1x1/tile_sm90.cuh"

namespace tg::cuda {
namespace {

using namespace conv1x1_sm90;

constexpr int kKTile = 32;                             // reduction channels per stage
constexpr int kXBoxBytes = kKTile * kBoxFloats * 4;    // [32 channels][32 pixels]: 4 KB
constexpr int kXBytes = 4 * kXBoxBytes;                // the tile's 128 pixels: 16 KB
constexpr int kWBytes = kOutChannels * kKTile * 4;     // one weight box: 16 KB

template <bool kSplit>
struct StreamedLayout {
  static constexpr int kWeightBoxes = kSplit ? 2 : 1;  // FP32: head and remainder
  static constexpr int kStageBytes = kXBytes + kWeightBoxes * kWBytes;
  static constexpr int kStages = kSplit ? 3 : 4;
  static constexpr int kOutOffset = kStages * kStageBytes;
  static constexpr int kBarOffset = kOutOffset + 2 * kStagingBytes;
  static constexpr int kBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + alignment slack
};

struct StreamedParams {
  CUtensorMap x_map;  // (images, R, pixels), boxes [32 channels][32 pixels], 128-byte swizzle
  CUtensorMap w_map;  // the prepared weight (copies, M, R8), boxes [128][32], 128-byte swizzle
  CUtensorMap y_map;  // (images, M, pixels), boxes [128 channels][64 pixels], dense
  const float* bias;  // M values, or nullptr
  int M, k_tiles, m_blocks;
  int64_t pixels, tiles_per_image, items;
  bool x_reread;      // more than one m-block: keep x in L2 for the next
};

// w8[copy][m][k] for k < R8 (R rounded up to 8): the weight's channel channel_of_column(k) (0
// past R) as its TF32 head (copy 0) and, when split, the TF32 rounding of its remainder (copy 1).
__global__ void prepare_weight_kernel(float* w8, const float* w, int64_t w_stride_m, int64_t w_stride_r, int M,
                                      int R, int R8, bool split) {
  const int64_t count = int64_t(M) * R8;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = e / R8;
    const int r = channel_of_column<true>(static_cast<int>(e - m * R8));
    const float v = r < R ? w[m * w_stride_m + r * w_stride_r] : 0.f;
    const uint32_t head = tf32_bits(v);
    w8[e] = __uint_as_float(head);
    if (split) w8[count + e] = __uint_as_float(tf32_bits(v - __uint_as_float(head)));
  }
}

template <bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) pointwise_streamed_kernel(const __grid_constant__ StreamedParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = StreamedLayout<kSplit>;
  constexpr int kGroup = kSplit ? 2 : 4;  // k8 steps per wgmma group
  constexpr int kStages = L::kStages;
  extern __shared__ unsigned char smem_raw[];
  // The swizzled boxes need 1024-byte alignment (the swizzle is a function of address bits 7-9).
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarOffset);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) tma::init_stage_ring(full, empty, kStages, 1, kConsumers / 32);
  __syncthreads();
  // From here on the roles part: no block-wide barrier below.

  // warp is the same in every lane; ptxas must see that (a shuffle's result is uniform), or it
  // treats the consumer path as divergent and serializes the wgmma (C7520).
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  if (warp == kConsumers / 32) {
    if (lane == 0) {
      tma::prefetch_map(&p.x_map);
      tma::prefetch_map(&p.w_map);
      const uint64_t x_policy = p.x_reread ? l2_evict_last_policy() : l2_evict_first_policy();
      const uint64_t w_policy = l2_evict_last_policy();  // every pixel tile reads it
      int i = 0;
      for (int64_t item = blockIdx.x; item < p.items; item += gridDim.x) {
        const int64_t tile = item / p.m_blocks;
        const int m0 = static_cast<int>(item - tile * p.m_blocks) * kOutChannels;
        const TilePlace at = place_of<true>(tile, p.tiles_per_image);
        for (int kt = 0; kt < p.k_tiles; ++kt, ++i) {
          const int s = i % kStages;
          const uint32_t use = i / kStages;
          if (use > 0) tma::mbar_wait(&empty[s], (use - 1) & 1);  // every consumer warp is done with use - 1
          tma::mbar_arrive_expect_tx(&full[s], L::kStageBytes);
          unsigned char* dst = smem + s * L::kStageBytes;
#pragma unroll
          for (int b = 0; b < 4; ++b)
            tma::load_box_3d(dst + b * kXBoxBytes, &p.x_map, &full[s], at.pixel + b * kBoxFloats, kt * kKTile, at.n,
                             x_policy);
#pragma unroll
          for (int c = 0; c < L::kWeightBoxes; ++c)
            tma::load_box_3d(dst + kXBytes + c * kWBytes, &p.w_map, &full[s], kt * kKTile, m0, c, w_policy);
        }
      }
    }
    return;
  }

  const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, t = lane & 3;
  const bool store_thread = (threadIdx.x & 127) == 0;
  if (store_thread) tma::prefetch_map(&p.y_map);
  float* staging = reinterpret_cast<float*>(smem + L::kOutOffset + wg * kStagingBytes);
  uint32_t a_off[4], st_off[4];
  nchw_fragment_offsets(a_off, wg, wi, g, t, kXBoxBytes);
  nchw_staging_offsets(st_off, staging, wi, g, t);
  const uint32_t stages_base = shared_address(smem);

  // FP32 mode runs each k-tile's products on `part` and adds it to acc in FP32, so that no
  // accumulator chains more than one k-tile's 12 products (the tensor core's additions are not
  // rounded to nearest: a chain over a long reduction drifts, 1e-5 at 2048 channels).
  float acc[64], part[64];
  int i = 0;
  for (int64_t item = blockIdx.x; item < p.items; item += gridDim.x) {
    const int64_t tile = item / p.m_blocks;
    const int m0 = static_cast<int>(item - tile * p.m_blocks) * kOutChannels;
    for (int kt = 0; kt < p.k_tiles; ++kt, ++i) {
      const int s = i % kStages;
      tma::mbar_wait(&full[s], (i / kStages) & 1);
      const uint32_t stage = stages_base + s * L::kStageBytes;
      const uint64_t w_hi = wgmma::sw128_kmajor_desc(stage + kXBytes);
      const uint64_t w_lo = wgmma::sw128_kmajor_desc(stage + kXBytes + kWBytes);  // FP32 mode only
      // The k-tile's 4 k8 steps in groups of kGroup: each group's fragments stay in registers
      // until its products retire, so FP32 mode (head and remainder fragments, two
      // accumulators) takes two groups of 2 to stay within the registers of 288 threads.
#pragma unroll
      for (int k0 = 0; k0 < 4; k0 += kGroup) {
        uint32_t a_hi[kGroup][4], a_lo[kGroup][4];
#pragma unroll
        for (int q = 0; q < kGroup; ++q)
#pragma unroll
          for (int u = 0; u < 4; ++u)
            tf32_fragment<kSplit>(__uint_as_float(ld_shared(stage + (k0 + q) * 8 * 128 + a_off[u])), a_hi[q][u],
                                  a_lo[q][u]);
        pin_fragments<kSplit>(a_hi, a_lo);
        wgmma::fence();
#pragma unroll
        for (int q = 0; q < kGroup; ++q) {
          const int ks = k0 + q;
          const uint32_t k_bytes = ks * 32;
          if constexpr (kSplit) {
            // The small terms first; all three on one accumulator.
            wgmma::mma_rs_tf32<128>(part, a_lo[q], wgmma::desc_advance(w_hi, k_bytes), ks > 0);
            wgmma::mma_rs_tf32<128>(part, a_hi[q], wgmma::desc_advance(w_lo, k_bytes), true);
            wgmma::mma_rs_tf32<128>(part, a_hi[q], wgmma::desc_advance(w_hi, k_bytes), true);
          } else {
            wgmma::mma_rs_tf32<128>(acc, a_hi[q], wgmma::desc_advance(w_hi, k_bytes), kt > 0 || ks > 0);
          }
        }
        wgmma::commit();
        wgmma::wait<0>();  // the group's fragments are free again; after the last, the weight box is read
      }
#pragma unroll
      for (int e = 0; e < 64; ++e) {
        if constexpr (kSplit) {
          wgmma::fence_operand(part[e]);
          acc[e] = kt > 0 ? acc[e] + part[e] : part[e];
        } else {
          wgmma::fence_operand(acc[e]);
        }
      }
      __syncwarp();
      if (lane == 0) tma::mbar_arrive(&empty[s]);
    }

    if (store_thread) tma::bulk_wait_read<0>();  // the previous item's stores have read the staging
    named_barrier_sync(1 + wg, 128);
    auto bias_of = [&](int j) -> float2 {
      const int c = m0 + 8 * j + 2 * t;
      if (p.bias == nullptr) return {0.f, 0.f};
      return {c < p.M ? __ldg(p.bias + c) : 0.f, c + 1 < p.M ? __ldg(p.bias + c + 1) : 0.f};
    };
    stage_nchw_tile(acc, st_off, t, bias_of);
    wgmma::fence_proxy_async();  // the staging writes, for the TMA stores (async proxy)
    named_barrier_sync(1 + wg, 128);
    if (store_thread) {
      const TilePlace at = place_of<true>(tile, p.tiles_per_image);
      const int pixel = at.pixel + kHalfRows * wg;
      if (pixel < p.pixels) tma::store_box_3d(&p.y_map, staging, pixel, m0, at.n);
      tma::bulk_commit();
    }
  }
  if (store_thread) tma::bulk_wait();  // the staging must outlive the stores reading it
#else
  __trap();  // launched only where device_runs_wgmma (sm_90a code on an H100 / H200)
#endif
}

}  // namespace

bool pointwise_tma_streamed_applies(const PointwiseTmaProblem& q, int dev) {
  return q.nchw && q.R >= 1 && q.M >= 1 && q.images >= 1 && q.pixels >= 1 && aligned16(q.x) && aligned16(q.y) &&
         q.pixels % 4 == 0 && q.pixels < kCoordinateLimit && q.images < kCoordinateLimit &&
         q.R < kCoordinateLimit && q.M < kCoordinateLimit && device_runs_wgmma(dev);
}

void pointwise_tma_streamed(const PointwiseTmaProblem& q, int dev, cudaStream_t st) {
  const char* op = "conv1x1 (NCHW, TMA, streamed weight)";
  TG_CHECK(pointwise_tma_streamed_applies(q, dev), op, ": not applicable to ", q.images, " images of ", q.pixels,
           " pixels, ", q.R, " -> ", q.M, " channels on device ", dev);
  set_device(dev);
  const int copies = q.split ? 2 : 1;
  const int64_t R8 = (q.R + 7) / 8 * 8;
  // On the framework's stream-ordered pool: freed after the kernel below has run.
  const Tensor w8 = Tensor::empty({copies, q.M, R8}, {.dtype = DType::f32, .device = Device::cuda(dev)});
  {
    const int64_t count = q.M * R8;
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<int64_t>((count + threads - 1) / threads, 4 * sm_count(dev)));
    prepare_weight_kernel<<<blocks, threads, 0, st>>>(w8.data<float>(), q.w, q.w_stride_m, q.w_stride_r,
                                                      static_cast<int>(q.M), static_cast<int>(q.R),
                                                      static_cast<int>(R8), q.split);
    TG_LAUNCH_CHECK();
  }
  StreamedParams p{};
  p.x_map = f32_planes_map(op, q.x, q.images, q.R, q.pixels, {kKTile, kBoxFloats, true});
  p.w_map = f32_planes_map(op, w8.data<float>(), copies, q.M, R8, {kOutChannels, kKTile, true});
  p.y_map = f32_planes_map(op, q.y, q.images, q.M, q.pixels, {kOutChannels, kHalfRows, false});
  p.bias = q.bias;
  p.M = static_cast<int>(q.M);
  p.k_tiles = static_cast<int>((q.R + kKTile - 1) / kKTile);
  p.m_blocks = static_cast<int>((q.M + kOutChannels - 1) / kOutChannels);
  p.pixels = q.pixels;
  p.tiles_per_image = (q.pixels + kTileRows - 1) / kTileRows;
  p.items = q.images * p.tiles_per_image * p.m_blocks;
  p.x_reread = p.m_blocks > 1;
  auto launch = [&](auto kernel, int smem) {
    allow_dynamic_smem(kernel, smem);
    const int64_t grid = std::min<int64_t>(p.items, sm_count(dev));
    kernel<<<static_cast<unsigned>(grid), kThreads, smem, st>>>(p);
    TG_LAUNCH_CHECK();
  };
  if (q.split) launch(pointwise_streamed_kernel<true>, StreamedLayout<true>::kBytes);
  else launch(pointwise_streamed_kernel<false>, StreamedLayout<false>::kBytes);
}

}  // namespace tg::cuda
