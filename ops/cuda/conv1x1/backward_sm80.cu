// The 1x1 backward on mma.sync: backward_kernel computes dw partials over a block's pixel tiles
// and, in its fused variant, dx = w^T dy on the same dy tile (16 warps: 8 for dx, 8 for dw);
// run_backward plans its shared memory, launches it and sums the partials.
// Design, precision contract and the floor: docs/kernels/conv1x1.md.
//
// - In the fused backward the dx warps reuse the stage for staged stores only after the named
//   barrier at which both roles meet after their GEMMs.
// - dw: tensor-core sums flushed into fp32 every tile; block partials summed in f64 in a fixed
//   order by sum_partials_kernel. Deterministic: no atomics.
#include <algorithm>
#include <cstdint>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/conv1x1/backward_tiles_sm80.cuh"
#include "ops/cuda/conv1x1/launch_sm80.cuh"
#include "ops/cuda/sum_partials.cuh"

namespace tg::cuda::conv1x1_detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Backward: dw partials over a block's tiles, and (fused) dx = w^T dy on the same dy tile

struct BackwardParams {
  float* dx;           // (N, C, P) or (N*P, C); only read by the fused variant
  float* partial;      // (gridDim.x, K, C) dw partials
  const float* dy;     // (N, K, P) or (N*P, K)
  const float* x;      // (N, C, P) or (N*P, C)
  const float* w;      // (K, C)
  int64_t images, pixels, K, C;
  int c_blocks;        // blockIdx.y = k_block * c_blocks + c_block (the fused variant: one block)
  int res_bytes;       // resident w^T (fused only)
  int dy_floats, x_floats;  // per stage, sized for the largest dw block
  int stages;
  bool vec_dx;
  TileGrid grid;
};

// dw block: rows = K side (4 warps x 2 m-tiles x 16 = 128), columns = C side (2 warps x 4
// n-tiles x 8 = 64), reduction over the tile's 128 pixels.
// dx (fused): NCHW rows = C (2 x 2 x 16 = 64), columns = pixels (4 x 4 x 8 = 128);
//             NHWC rows = pixels (4 x 2 x 16), columns = C (2 x 4 x 8); reduction over K.
// The fused variant runs 16 warps: warps 0-7 compute and store dx, warps 8-15 dw, on the same
// shared-memory stage (each role needs half the registers, and 4 warps per scheduler hide
// each other's latencies); the dw-only variant runs the 8 dw warps.
// kVec: dy's and x's rows start 16-byte aligned (16-byte copies), else both take 4-byte copies.
// A template flag, not a parameter: as a runtime flag ptxas kept it in a register across the tile
// loop and, at 128 registers, spilled it; its reload at every tile waited behind the tile's
// copies.
template <bool kNHWC, bool kWithDx, int kMode, bool kVec>
__global__ void __launch_bounds__(kWithDx ? 2 * kThreads : kThreads, 1) backward_kernel(const BackwardParams p) {
  constexpr bool kSplit = kMode != kTf32;
  constexpr int kBlockThreads = kWithDx ? 2 * kThreads : kThreads;
  constexpr int kResTiles = kNHWC ? kDwCols / 8 : kDwCols / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  const int kb = blockIdx.y / p.c_blocks, cb = blockIdx.y % p.c_blocks;
  const int k0 = kb * kDwRows, c0 = cb * kDwCols;
  const int Kt = static_cast<int>(min64(kDwRows, p.K - k0));
  const int Ct = static_cast<int>(min64(kDwCols, p.C - c0));
  const int Kpad = round_up(Kt, 16), Cpad = round_up(Ct, 16);
  float* stage0 = reinterpret_cast<float*>(smem + p.res_bytes);
  const int stage_floats = p.dy_floats + p.x_floats;
  // Fixed row strides (sized for the largest block) so that offsets in the hot loop are constants.
  constexpr int dy_stride = kBwdDyStride, x_stride = kNHWC ? kBwdXStrideNhwc : kTilePixels;

  // dx = M dy with M(m = c, r = k) = w[k * C + c]; the fused variant has k0 = c0 = 0.
  const int KS1 = Kpad / 8;
  int entries = 0;
  if constexpr (kWithDx) {
    const WeightView wt{p.w, 1, p.C, 0, Ct, 0, Kt};
    entries = kNHWC ? fill_resident_b<kMode, kResTiles>(smem, KS1, wt)
                    : fill_resident_a<kMode, kResTiles>(smem, KS1, wt);
  }
  const Resident<kMode, kResTiles> res{smem, entries};

  const uint64_t policy = l2_evict_first_policy();
  const int64_t rows = p.images * p.pixels;
  auto issue = [&](const TileCursor& c, int stage) {
    if (c.tile < p.grid.num_tiles) {
      // Rebuilt per tile (a few integer ops) rather than kept: the dw warps need the registers.
      const TileLoader dy_loader(dy_stride, kBlockThreads, kNHWC ? Kpad : kTilePixels);
      const TileLoader x_loader(x_stride, kBlockThreads, kNHWC ? Cpad : kTilePixels);
      const TilePos q = tile_pos<kNHWC>(c, p.pixels, rows);
      float* base = stage0 + stage * stage_floats;
      load_tile(dy_loader, SmemTile{base, dy_stride}, tile_source(kNHWC, p.dy, q, p.K, p.pixels, k0, Kt, Kpad),
                p.dy, kVec, policy);
      load_tile(x_loader, SmemTile{base + p.dy_floats, x_stride},
                tile_source(kNHWC, p.x, q, p.C, p.pixels, c0, Ct, Cpad), p.x, kVec, policy);
    }
    cp_async_commit();
  };

  {
    TileCursor c = cursor_at<kNHWC>(blockIdx.x, p.grid);
    for (int s = 0; s < p.stages - 1; ++s) {
      issue(c, s);
      advance<kNHWC>(c, p.grid);
    }
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bool dx_role = kWithDx && warp < 8;
  const int rw = warp & 7;  // the warp's index inside its role
  const bool dw_full = Kpad == kDwRows && Cpad == kDwCols;
  float dw[2][4][4] = {};  // dw warps: this thread's share of the block's dw, summed over its tiles
  int stage = 0;
  for (TileCursor cur = cursor_at<kNHWC>(blockIdx.x, p.grid); cur.tile < p.grid.num_tiles;
       advance<kNHWC>(cur, p.grid)) {
    cp_async_wait_pending(p.stages - 2);
    __syncthreads();
    issue(ahead_of<kNHWC>(cur, p.stages - 1, p.grid), stage == 0 ? p.stages - 1 : stage - 1);
    const float* dy_s = stage0 + stage * stage_floats;
    const float* x_s = dy_s + p.dy_floats;

    if (dx_role) {
      if constexpr (kWithDx) {
        constexpr int kWM = kNHWC ? 4 : 2;
        const int wm = rw % kWM, wn = rw / kWM;
        float acc[2][4][4];
        if (Cpad == kDwCols && (!kNHWC || KS1 % 4 == 0)) {
          dx_tile_mma_full<kNHWC>(acc, res, dy_s, KS1, wm, wn, lane);
        } else {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
          const SmemTile DY{const_cast<float*>(dy_s), dy_stride};
          if (Cpad == kDwCols) dx_tile_mma<kNHWC, false>(acc, res, DY, KS1, Cpad, wm, wn, lane);
          else dx_tile_mma<kNHWC, true>(acc, res, DY, KS1, Cpad, wm, wn, lane);
        }
        const TilePos q = tile_pos<kNHWC>(cur, p.pixels, rows);
        const OutTile o = out_tile(kNHWC, p.dx, q, p.C, p.pixels, 0, Ct, p.vec_dx);
        const int row0 = wm * 2 * 16, col0 = wn * 4 * 8;
        // The dw warps are done with this stage (they meet here after their GEMM); its first 20 KB
        // then serve as the dx warps' scratch for staged stores (the stage is refilled only
        // after the next tile's block barrier): each store instruction writes 4 whole 128-byte
        // lines instead of 8 rows x 32 bytes. Stages smaller than that (few channels) take the
        // general stores.
        named_barrier_sync(kDwDoneBarrier, 2 * kThreads);
        // NCHW: the columns are in RowsKQuads order (both dx GEMMs read dy that way).
        float* scratch = const_cast<float*>(dy_s) + rw * kScratchFloats;
        float* out = o.base + row0 * o.row_stride + col0;
        if (q.pixels == kTilePixels && Ct == kDwCols && p.vec_dx && stage_floats >= 8 * kScratchFloats) {
          if constexpr (kNHWC) store_acc_staged<2, 4, kNoBias>(acc, scratch, out, o.row_stride, lane, nullptr);
          else store_acc_staged_quads<2, kNoBias>(acc, scratch, out, o.row_stride, lane, nullptr);
        } else if constexpr (kNHWC) {
          store_acc(acc, o, row0, col0, g, t, nullptr, nullptr, false);
        } else {
          store_acc_quads(acc, o, row0, col0, g, t, nullptr, false);
        }
      }
    } else {
      // dw block += dy_tile (K side x pixels) * x_tile^T (pixels x C side)
      const int wm = rw % 4, wn = rw / 4;
      float acc[2][4][4];
      if (dw_full) {
        dw_tile_mma_full<kNHWC, kSplit>(acc, dy_s, x_s, wm, wn, lane);
      } else {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
        dw_tile_mma<kNHWC, kSplit, true>(acc, SmemTile{const_cast<float*>(dy_s), dy_stride},
                                         SmemTile{const_cast<float*>(x_s), x_stride}, Kpad, Cpad, wm, wn, lane);
      }
      if constexpr (kWithDx) named_barrier_sync(kDwDoneBarrier, 2 * kThreads);  // this stage's reads are done
      // Flush the tensor-core sum (a chain of 16 steps) into the plain fp32 running sum.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dw[mt][nt][e] += acc[mt][nt][e];
    }
    stage = stage + 1 == p.stages ? 0 : stage + 1;
  }
  cp_async_wait<0>();

  // This block's partial: every (k, c) of its dw block, zeros if it had no tile.
  if (!dx_role) {
    const int wm = rw % 4, wn = rw / 4;
    float* part = p.partial + blockIdx.x * p.K * p.C;
    const bool quads = kNHWC && dw_full;  // dw_tile_mma_full's NHWC order (RowsKQuads)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e >= 2 ? 1 : 0, col = 2 * t + (e & 1);
          const int r = quads ? 32 * wm + 4 * g + 2 * mt + half : (wm * 2 + mt) * 16 + g + 8 * half;
          const int c = quads ? 32 * wn + 4 * col + nt : (wn * 4 + nt) * 8 + col;
          if (r < Kt && c < Ct) part[(k0 + r) * p.C + c0 + c] = dw[mt][nt][e];
        }
  }
}

// The blocks' dw partials are added in block order by sum_partials_kernel (ops/cuda/sum_partials.cuh).

// The backward kernel for one layout and role set, its mode (split: FP32-accurate) and copy
// width chosen at run time.
template <bool kNHWC, bool kWithDx>
void launch_backward(const BackwardParams& p, bool split, bool vec, int smem, unsigned groups, unsigned blocks_y,
                     cudaStream_t st) {
  auto kernel = split ? (vec ? backward_kernel<kNHWC, kWithDx, kSplitRaw, true>
                             : backward_kernel<kNHWC, kWithDx, kSplitRaw, false>)
                      : (vec ? backward_kernel<kNHWC, kWithDx, kTf32, true>
                             : backward_kernel<kNHWC, kWithDx, kTf32, false>);
  allow_dynamic_smem(kernel, smem);
  kernel<<<dim3(groups, blocks_y), kWithDx ? 2 * kThreads : kThreads, smem, st>>>(p);
  TG_LAUNCH_CHECK();
}

// Shared-memory plan of the backward kernel; stages == 0 when it does not fit.
struct BackwardPlan {
  int res_bytes = 0, dy_floats = 0, x_floats = 0, stages = 0, smem = 0;
};
BackwardPlan plan_backward(const ConvShape& s, bool with_dx, int smem_limit) {
  BackwardPlan b;
  const int Kpad = round_up(static_cast<int>(std::min<int64_t>(s.K, kDwRows)), 16);
  const int Cpad = round_up(static_cast<int>(std::min<int64_t>(s.C, kDwCols)), 16);
  b.res_bytes = with_dx ? resident_bytes(kDwCols, Kpad, kSplitRaw) : 0;  // kTf32 is the same size
  // NHWC rows have the fixed strides of backward_kernel; NCHW rows are always 128 pixels.
  b.dy_floats = s.channels_last() ? kTilePixels * kBwdDyStride : Kpad * kTilePixels;
  b.x_floats = s.channels_last() ? kTilePixels * kBwdXStrideNhwc : Cpad * kTilePixels;
  const int stage_bytes = (b.dy_floats + b.x_floats) * 4;
  b.stages = stages_that_fit(smem_limit, b.res_bytes, stage_bytes);
  if (b.stages < 2) b.stages = 0;
  b.smem = b.res_bytes + b.stages * stage_bytes;
  return b;
}

}  // namespace

bool fused_backward_fits(const ConvShape& s, int smem_limit) {
  return s.K <= kDwRows && s.C <= kDwCols && plan_backward(s, true, smem_limit).stages >= 2;
}

// dw (and dx when with_dx) from dy and x; with_dx needs fused_backward_fits.
void run_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                  const ConvShape& s, bool with_dx, Precision precision) {
  const int dev = dw.device().index;
  set_device(dev);
  const DeviceLimits lim = device_limits(dev);
  const bool nhwc = s.channels_last();
  const bool split = precision == Precision::FP32;
  const int64_t K = s.K, C = s.C, P = s.out_volume();
  const int64_t num_tiles = tile_count(s);
  if (num_tiles == 0) {  // no pixels: dw = 0 (and dx is empty)
    TG_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), stream(dev)));
    return;
  }
  const BackwardPlan plan = plan_backward(s, with_dx, lim.smem_block);
  TG_CHECK(plan.stages >= 2, "conv1x1: not enough shared memory (", lim.smem_block, " bytes) for the backward kernel");

  BackwardParams p{};
  p.dx = with_dx ? dx.data<float>() : nullptr;
  p.dy = dy.data<float>();
  p.x = x.data<float>();
  p.w = with_dx ? w.data<float>() : nullptr;
  p.images = s.N;
  p.pixels = P;
  p.K = K;
  p.C = C;
  const int64_t k_blocks = ceil_div(K, kDwRows), c_blocks = ceil_div(C, kDwCols);
  TG_CHECK(k_blocks * c_blocks <= 65535, "conv1x1: weight ", s.w_shape(), " has too many blocks for one grid");
  p.c_blocks = static_cast<int>(c_blocks);
  p.res_bytes = plan.res_bytes;
  p.dy_floats = plan.dy_floats;
  p.x_floats = plan.x_floats;
  p.stages = plan.stages;
  // 16-byte copies need both operands' rows 16-byte aligned (otherwise both take 4-byte copies).
  const bool vec = aligned16(p.dy) && aligned16(p.x) && (nhwc ? K % 4 == 0 && C % 4 == 0 : P % 4 == 0);
  p.vec_dx = with_dx && aligned16(p.dx) && (nhwc ? C % 4 == 0 : P % 4 == 0);

  // One block per SM in all; the pixel tiles are spread over `groups` blocks per dw block.
  int64_t groups = std::max<int64_t>(1, lim.sms / (k_blocks * c_blocks));
  groups = std::min(groups, num_tiles);
  groups = std::min(groups, std::max<int64_t>(1, kPartialBudget / (K * C)));
  p.grid = tile_grid(s, groups);
  Tensor partial = Tensor::empty(Shape{groups, K, C}, {.dtype = DType::f32, .device = dw.device()});
  p.partial = partial.data<float>();

  const unsigned gx = static_cast<unsigned>(groups), gy = static_cast<unsigned>(k_blocks * c_blocks);
  cudaStream_t st = stream(dev);
  if (nhwc) {
    if (with_dx) launch_backward<true, true>(p, split, vec, plan.smem, gx, gy, st);
    else launch_backward<true, false>(p, split, vec, plan.smem, gx, gy, st);
  } else {
    if (with_dx) launch_backward<false, true>(p, split, vec, plan.smem, gx, gy, st);
    else launch_backward<false, false>(p, split, vec, plan.smem, gx, gy, st);
  }
  sum_partials(dw.data<float>(), p.partial, K * C, groups, st);
}

}  // namespace tg::cuda::conv1x1_detail
