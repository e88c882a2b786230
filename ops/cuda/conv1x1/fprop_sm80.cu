// The 1x1 forward and grad-input product on mma.sync (m16n8k8 TF32; the FP32-accurate mode
// adds one m16n8k16 bf16 op per product for both cross terms): pointwise_kernel over a
// persistent grid of 128-pixel tiles, and run_pointwise, which hands Hopper shapes with R <= 64
// and 16-byte rows to conv1x1/fprop_sm90.cu and launches this kernel for every other case, one launch
// per block of output channels and group of reduction channels.
// Design, precision contract and the floor: docs/kernels/conv1x1.md.
//
// Stores are staged through the tile's consumed stage so each instruction writes whole lines.
#include <algorithm>
#include <cstdint>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/conv1x1/launch_sm80.cuh"
#include "ops/cuda/conv1x1/fprop_sm90.h"
#include "ops/cuda/policy.h"

namespace tg::cuda::conv1x1_detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Forward and grad-input: out (M channels) = weight (M x R) applied at every pixel of in (R channels)

struct PointwiseParams {
  float* out;         // (N, M, P) or (N*P, M)
  const float* in;    // (N, R, P) or (N*P, R)
  const float* bias;  // (M) or null
  WeightView weight;  // this launch's block of output channels x group of reduction channels
  int64_t images, pixels, out_channels, in_channels;
  int r_pad;          // weight.r_count rounded up to 16
  int stages;
  int stage_floats;   // one stage: the input tile, and at least the 8 warps' store scratch
  bool accumulate;    // add to out (the second and later reduction groups)
  bool vec_in, vec_out;
  TileGrid grid;
};

// The mma tile per block is (kWM * kMT * 16) x (kWN * kNT * 8): NCHW rows = output channels,
// columns = 128 pixels (weight = A, resident; activations = B); NHWC rows = 128 pixels,
// columns = output channels (activations = A; weight = B, resident). kMinBlocks = 2 caps the
// registers at 128 so that two blocks share an SM.
template <bool kNHWC, int kWM, int kWN, int kMT, int kNT, int kMode, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) pointwise_kernel(const PointwiseParams p) {
  constexpr bool kSplit = kMode != kTf32;
  constexpr int kRows = kWM * kMT * 16, kCols = kWN * kNT * 8;
  constexpr int kChannels = kNHWC ? kCols : kRows;  // output channels per block
  constexpr int kResTiles = kNHWC ? kChannels / 8 : kChannels / 16;
  static_assert(kWM * kWN == kThreads / 32, "one warp per warp tile");
  static_assert((kNHWC ? kRows : kCols) == kTilePixels, "a tile is 128 pixels");
  static_assert(kNHWC || kNT == 4, "NCHW: a warp's columns are 32 pixels (fragment offsets)");
  static_assert(kNT % 4 == 0, "staged stores take blocks of 32 columns");

  extern __shared__ __align__(16) unsigned char smem[];
  const int KS = p.r_pad / 8;
  float* bias_s = reinterpret_cast<float*>(smem + resident_bytes(kChannels, p.r_pad, kMode));  // (kChannels)
  float* stage0 = bias_s + kChannels;
  // Compile-time row strides, so that fragment addresses are per-lane offsets plus constants.
  constexpr int stride = kNHWC ? pointwise_nhwc_stride(kChannels) : kTilePixels;

  const int entries = kNHWC ? fill_resident_b<kMode, kResTiles>(smem, KS, p.weight)
                            : fill_resident_a<kMode, kResTiles>(smem, KS, p.weight);
  const Resident<kMode, kResTiles> res{smem, entries};
  for (int c = threadIdx.x; c < kChannels; c += kThreads)
    bias_s[c] = (p.bias != nullptr && c < p.weight.m_count) ? p.bias[p.weight.m0 + c] : 0.f;

  const uint64_t policy = l2_evict_first_policy();
  const int64_t rows = p.images * p.pixels;
  const TileLoader loader(stride, kThreads, kNHWC ? p.r_pad : kTilePixels);
  auto issue = [&](const TileCursor& c, int stage) {
    if (c.tile < p.grid.num_tiles) {
      const TilePos q = tile_pos<kNHWC>(c, p.pixels, rows);
      load_tile(loader, SmemTile{stage0 + stage * p.stage_floats, stride},
                tile_source(kNHWC, p.in, q, p.in_channels, p.pixels, p.weight.r0, p.weight.r_count, p.r_pad), p.in,
                p.vec_in, policy);
    }
    cp_async_commit();  // always: the wait below counts groups
  };

  {
    TileCursor c = cursor_at<kNHWC>(blockIdx.x, p.grid);
    for (int s = 0; s < p.stages - 1; ++s) {
      issue(c, s);
      advance<kNHWC>(c, p.grid);
    }
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp % kWM, wn = warp / kWM;
  const int row0 = wm * kMT * 16, col0 = wn * kNT * 8;  // the warp tile's origin
  const bool has_bias = p.bias != nullptr;
  const RowsKQuads pb(stride, wn, lane);  // NCHW: B fragments of the activation tile
  int stage = 0;
  for (TileCursor cur = cursor_at<kNHWC>(blockIdx.x, p.grid); cur.tile < p.grid.num_tiles;
       advance<kNHWC>(cur, p.grid)) {
    cp_async_wait_pending(p.stages - 2);
    __syncthreads();  // this stage has landed for every thread; the one refilled next is free
    issue(ahead_of<kNHWC>(cur, p.stages - 1, p.grid), stage == 0 ? p.stages - 1 : stage - 1);

    float* X = stage0 + stage * p.stage_floats;
    float acc[kMT][kNT][4];
    if constexpr (kNHWC) {
      if (KS % 4 == 0) {
        // A (pixels x reduction channels) with one ldmatrix.x4 per fragment.
        uint32_t a_off[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) a_off[u] = shared_address(X) + ldmatrix_offset(stride, row0, u, true, lane);
        // The warp's A fragments first, then one (resident, cheap) B fragment at a time.
        auto kstep = [&](int ks, int u, int jj, auto first) {
          FragA a[kMT];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            uint32_t r[4];
            ldmatrix_x4(r, a_off[u] + mt * 16 * stride * 4 + jj * 128);
            a[mt] = make_a<kSplit>(r);
          }
#pragma unroll
          for (int np = 0; np < kNT / 2; ++np) {
            FragB b[2];
            res.b_pair(b[0], b[1], wn * kNT / 2 + np, ks, lane);
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int mt = 0; mt < kMT; ++mt) mma<kSplit, decltype(first)::value>(acc[mt][2 * np + h], a[mt], b[h]);
          }
        };
        kstep(0, 0, 0, First{});
        kstep(1, 1, 0, Later{});
        kstep(2, 2, 0, Later{});
        kstep(3, 3, 0, Later{});
        auto group = [&](int jj) {
          kstep(4 * jj, 0, jj, Later{});
          kstep(4 * jj + 1, 1, jj, Later{});
          kstep(4 * jj + 2, 2, jj, Later{});
          kstep(4 * jj + 3, 3, jj, Later{});
        };
        if (KS == 8) group(1);  // 64 reduction channels (workload B): constant offsets
        else
          for (int jj = 1; jj < KS / 4; ++jj) group(jj);
      } else {
        const SmemTile XT{X, stride};
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
        for (int ks = 0; ks < KS; ++ks) {
          FragA a[kMT];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) a[mt] = tile_a_rows_m<kSplit>(XT, row0 + mt * 16, ks * 8, g, t);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            const FragB b = res.b(wn * kNT + nt, ks, lane);
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) mma<kSplit>(acc[mt][nt], a[mt], b);
          }
        }
      }
    } else {
      // B (reduction channels x pixels) from the tile through per-lane offsets.
      auto kstep = [&](int ks, auto first) {
        FragB b[kNT];
        quad_b_fragments<kSplit>(b, X, pb, 8 * ks * stride);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const FragA a = res.a(wm * kMT + mt, ks, lane);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) mma<kSplit, decltype(first)::value>(acc[mt][nt], a, b[nt]);
        }
      };
      kstep(0, First{});
      if (!kSplit && KS == 8) {  // 64 reduction channels (workload B): every offset a constant
#pragma unroll
        for (int ks = 1; ks < 8; ++ks) kstep(ks, Later{});
      } else {
        kstep(1, Later{});
        for (int ks = 2; ks < KS; ks += 2) {  // KS is even (r_pad is a multiple of 16)
          kstep(ks, Later{});
          kstep(ks + 1, Later{});
        }
      }
    }

    const TilePos q = tile_pos<kNHWC>(cur, p.pixels, rows);
    const OutTile o = out_tile(kNHWC, p.out, q, p.out_channels, p.pixels, p.weight.m0, p.weight.m_count, p.vec_out);
    if (q.pixels == kTilePixels && p.weight.m_count == kChannels && p.vec_out && !p.accumulate) {
      __syncthreads();  // every warp is done reading this stage: it becomes the warps' store scratch
      float* scratch = X + warp * kScratchFloats;
      float* out = o.base + row0 * o.row_stride + col0;
      const int64_t rs = o.row_stride;
      if constexpr (kNHWC) {
        if (!has_bias) store_acc_staged<kMT, kNT, kNoBias>(acc, scratch, out, rs, lane, nullptr);
        else store_acc_staged<kMT, kNT, kBiasCols>(acc, scratch, out, rs, lane, bias_s + col0);
      } else {
        if (!has_bias) store_acc_staged_quads<kMT, kNoBias>(acc, scratch, out, rs, lane, nullptr);
        else store_acc_staged_quads<kMT, kBiasRows>(acc, scratch, out, rs, lane, bias_s + row0);
      }
    } else if constexpr (kNHWC) {
      store_acc(acc, o, row0, col0, g, t, nullptr, bias_s, p.accumulate);
    } else {
      store_acc_quads(acc, o, row0, col0, g, t, bias_s, p.accumulate);
    }
    stage = stage + 1 == p.stages ? 0 : stage + 1;
  }
  cp_async_wait<0>();
}

template <bool kNHWC, int kWM, int kWN, int kMT, int kNT, int kMode, int kMinBlocks>
void launch_pointwise(PointwiseParams p, const ConvShape& s, int smem, int sms, cudaStream_t st) {
  auto kernel = pointwise_kernel<kNHWC, kWM, kWN, kMT, kNT, kMode, kMinBlocks>;
  const int64_t grid = std::min<int64_t>(tile_count(s), int64_t(sms) * blocks_per_sm(kernel, kThreads, smem));
  p.grid = tile_grid(s, grid);
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, st>>>(p);
  TG_LAUNCH_CHECK();
}

// The warp layouts: 128 output channels with <= 64 reduction channels ("narrow", two blocks
// per SM), or 64 output channels with <= 128 ("wide", one block per SM); both keep the resident
// weight at 32 KB (48 KB split).
template <int kMode>
void launch_pointwise_variant(bool nhwc, bool wide, const PointwiseParams& p, const ConvShape& s, int smem, int sms,
                              cudaStream_t st) {
  if (!nhwc) {
    if (wide) launch_pointwise<false, 2, 4, 2, 4, kMode, 1>(p, s, smem, sms, st);  // 64 ch x 128 px
    else launch_pointwise<false, 2, 4, 4, 4, kMode, 2>(p, s, smem, sms, st);       // 128 ch x 128 px
  } else {
    if (wide) launch_pointwise<true, 4, 2, 2, 4, kMode, 1>(p, s, smem, sms, st);   // 128 px x 64 ch
    else launch_pointwise<true, 4, 2, 2, 8, kMode, 2>(p, s, smem, sms, st);        // 128 px x 128 ch
  }
}

}  // namespace

// out (M channels) = A (M x R) in (R channels) at every pixel, A(m, r) = w[m * w_stride_m + r * w_stride_r].
// Reduction groups beyond the first accumulate into out (one launch each, in order).
void run_pointwise(const Tensor& out, const Tensor& in, const Tensor& w, const Tensor& bias, int64_t M, int64_t R,
                   int64_t w_stride_m, int64_t w_stride_r, const ConvShape& s, Precision precision) {
  const int dev = out.device().index;
  set_device(dev);
  const DeviceLimits lim = device_limits(dev);
  const bool nhwc = s.channels_last();
  const bool split = precision == Precision::FP32;
  const int mode = split ? kSplitPre : kTf32;
  const int64_t P = s.out_volume();
  const PointwiseTmaProblem tma{out.data<float>(), in.data<float>(), w.data<float>(), w_stride_m, w_stride_r,
                                bias.defined() ? bias.data<float>() : nullptr, s.N, P, M, R, !nhwc, split};
  // KernelPolicy::conv1x1.tma = false keeps the product on the kernels below (tests, benchmark).
  if (kernel_policy().conv1x1.tma && pointwise_tma_applies(tma, dev)) {
    pointwise_tma(tma, dev, stream(dev), kernel_policy().conv1x1.stream_weight);
    return;
  }
  const bool wide = R > 64;
  const int64_t group = wide ? kGroupChannels : R;
  const int channels = wide ? 64 : 128;

  PointwiseParams p{};
  p.out = out.data<float>();
  p.in = in.data<float>();
  p.images = s.N;
  p.pixels = P;
  p.out_channels = M;
  p.in_channels = R;
  p.vec_in = aligned16(p.in) && (nhwc ? R % 4 == 0 : P % 4 == 0);
  p.vec_out = aligned16(p.out) && (nhwc ? M % 4 == 0 : P % 4 == 0);
  if (tile_count(s) == 0) return;
  for (int64_t r0 = 0; r0 < R; r0 += group) {
    for (int64_t m0 = 0; m0 < M; m0 += channels) {
      const int r_count = static_cast<int>(std::min(group, R - r0));
      const int m_count = static_cast<int>(std::min<int64_t>(channels, M - m0));
      p.r_pad = round_up(r_count, 16);
      p.weight = WeightView{w.data<float>(), w_stride_m, w_stride_r, static_cast<int>(m0), m_count,
                            static_cast<int>(r0), r_count};
      p.bias = (r0 == 0 && bias.defined()) ? bias.data<float>() : nullptr;
      p.accumulate = r0 > 0;
      const int fixed = resident_bytes(channels, p.r_pad, mode) + channels * 4;
      const int tile_bytes = (nhwc ? kTilePixels * pointwise_nhwc_stride(channels) : p.r_pad * kTilePixels) * 4;
      // A stage doubles as the warps' store scratch.
      const int stage_bytes = std::max(tile_bytes, kThreads / 32 * kScratchFloats * 4);
      // Narrow blocks run two per SM where two stages fit twice (always on H100 / H200).
      p.stages = stages_that_fit(lim.smem_for(wide ? 1 : 2), fixed, stage_bytes);
      if (p.stages < 2) p.stages = stages_that_fit(lim.smem_for(1), fixed, stage_bytes);
      TG_CHECK(p.stages >= 2, "conv1x1: not enough shared memory (", lim.smem_block, " bytes) for two stages of ",
               stage_bytes, " bytes");
      p.stage_floats = stage_bytes / 4;
      const int smem = fixed + p.stages * stage_bytes;
      if (split) launch_pointwise_variant<kSplitPre>(nhwc, wide, p, s, smem, lim.sms, stream(dev));
      else launch_pointwise_variant<kTf32>(nhwc, wide, p, s, smem, lim.sms, stream(dev));
    }
  }
}

}  // namespace tg::cuda::conv1x1_detail
