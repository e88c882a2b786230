// The mma.sync grad-weight kernel of the 3x3 stride-1 NCHW fast path and its launcher
// (run_wgrad): every FP32 weight gradient, and TF32 off Hopper (conv3x3/dispatch.cu dispatches).
// Design and precision: docs/kernels/conv3x3.md.
//
// Grad-weight: M = output channels, N = input channels x 9 taps, reduction over every (image,
//   pixel). Blocks own a dw tile (128 or, FP32, 64 x 32 x 9) and a slice of 2x32-pixel strips;
//   partials per slice summed in a fixed order in f64. FP32 restarts the tensor-core chain every
//   strip into fp32 side sums (mma.sync accumulates with truncation, see conv3x3_wgrad_kernel).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_context.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/mma_sync.cuh"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tf32.cuh"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv3x3/pipeline_sm80.cuh"
#include "ops/cuda/conv3x3/staging.cuh"
#include "ops/cuda/sum_partials.cuh"

namespace tg::cuda::conv3x3_detail {
namespace {

// ---- grad-weight ----

// dw tile kBK output channels x 32 input channels x 9 taps; warps kWarpsK (k) x 4 (c), each
// (16 kMTiles) x (8 channels x 9 taps). One stage = one strip of 2 x 32 output pixels: dy for
// the kBK channels and the x halo (4 x 40) for the 32.
// TF32: 16 warps (4 x 4) of 32 x 72 -> kBK = 128, 72 accumulators, <= 128 registers: 4 warps
//   per scheduler to hide mma.sync / LDS latency (the 8-warp 64 x 72 version ran at 12.5%
//   occupancy, latency-bound).
// FP32: 8 warps (2 x 4) of 32 x 72 -> kBK = 64: 72 tensor-core accumulators plus 72 fp32 side
//   sums (see conv3x3_wgrad_kernel for why).
template <int kMTiles_, int kWarpsK_>
struct WgradTile {
  static constexpr int kWarpsK = kWarpsK_, kWarpsC = 4, kThreads = 32 * kWarpsK * kWarpsC;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kBK = 16 * kMTiles * kWarpsK;  // 128 or 64
  static constexpr int kBC = 8 * kWarpsC;             // 32
  static constexpr int kRows = 2, kCols = 32, kPos = kRows * kCols;
  static constexpr int kDyLd = stride_for_rows_of_8(kPos);  // A: lanes g -> output channels
  static constexpr int kRowLen = kCols + 8;
  static constexpr int kXChan = stride_for_rows_of_8((kRows + 2) * kRowLen);  // B: lanes g -> channels
  static constexpr int kDyStage = kBK * kDyLd, kXStage = kBC * kXChan;
  static constexpr int kStageFloats = kDyStage + kXStage;
  static constexpr size_t kSmemBytes = sizeof(float) * kStages * kStageFloats;
};
template <bool kSplit>
using WgradTileFor = std::conditional_t<kSplit, WgradTile<2, 2>, WgradTile<2, 4>>;

struct WgradParams {
  int64_t N, C, H, W;  // x
  int64_t K, Ho, Wo;   // dy
  int64_t pad_h, pad_w;
  int64_t row_tiles, col_tiles, strips, strips_per_split;
  int64_t k_tiles, c_tiles;
  int vec_x, vec_dy;  // floats per copy of x rows and of dy rows
};

template <class T, int kVec>
__device__ __forceinline__ void load_dy_strip(float* dys, const float* __restrict__ dy, const WgradParams& p,
                                              int64_t n, int64_t k0, int64_t oh0, int64_t ow0) {
  constexpr int kPerRow = T::kCols / kVec;
  // Outside dy (channels, rows, columns past the end) the strip is 0, so it adds nothing.
  const RowGrid g{dy,
                  (n * p.K + k0) * p.Ho * p.Wo + oh0 * p.Wo + ow0,
                  p.Ho * p.Wo,
                  p.Wo,
                  T::kDyLd,
                  T::kCols,
                  static_cast<int>(min_i64(T::kBK, p.K - k0)),
                  0,
                  static_cast<int>(min_i64(T::kRows, p.Ho - oh0)),
                  0,
                  static_cast<int>(clamp_i64(ceil_div(p.Wo - ow0, kVec), 0, kPerRow))};
  copy_grid<T::kThreads, T::kBK, T::kRows, kPerRow, kVec>(dys, g);
}

template <class T, int kVec>
__device__ __forceinline__ void load_x_halo(float* xs, const float* __restrict__ x, const WgradParams& p, int64_t n,
                                            int64_t c0, int64_t ih0, int64_t iw0) {
  constexpr int kHalo = T::kRows + 2, kPerRow = T::kRowLen / kVec;
  const RowGrid g{x,
                  (n * p.C + c0) * p.H * p.W + ih0 * p.W + iw0,
                  p.H * p.W,
                  p.W,
                  T::kXChan,
                  T::kRowLen,
                  static_cast<int>(min_i64(T::kBC, p.C - c0)),
                  static_cast<int>(clamp_i64(-ih0, 0, kHalo)),
                  static_cast<int>(clamp_i64(p.H - ih0, 0, kHalo)),
                  static_cast<int>(clamp_i64(ceil_div(-iw0, kVec), 0, kPerRow)),
                  static_cast<int>(clamp_i64(ceil_div(p.W - iw0, kVec), 0, kPerRow))};
  copy_grid<T::kThreads, T::kBC, kHalo, kPerRow, kVec>(xs, g);
}

// The block's next strip to load: (image, row tile, column tile), columns fastest.
struct StripCursor {
  int64_t n, rt, ct;
};
__device__ __forceinline__ StripCursor strip_cursor(int64_t strip, const WgradParams& p) {
  return {strip / (p.col_tiles * p.row_tiles), strip / p.col_tiles % p.row_tiles, strip % p.col_tiles};
}
__device__ __forceinline__ void advance(StripCursor& c, const WgradParams& p) {
  if (++c.ct < p.col_tiles) return;
  c.ct = 0;
  if (++c.rt < p.row_tiles) return;
  c.rt = 0;
  ++c.n;
}

template <class T>
__device__ __forceinline__ void load_strip(float* stage, const float* __restrict__ dy, const float* __restrict__ x,
                                           const WgradParams& p, const StripCursor& c, int64_t k0, int64_t c0,
                                           int xoff) {
  const int64_t ow0 = c.ct * T::kCols, oh0 = c.rt * T::kRows;
  if (p.vec_dy == 4) load_dy_strip<T, 4>(stage, dy, p, c.n, k0, oh0, ow0);
  else if (p.vec_dy == 2) load_dy_strip<T, 2>(stage, dy, p, c.n, k0, oh0, ow0);
  else load_dy_strip<T, 1>(stage, dy, p, c.n, k0, oh0, ow0);
  const int64_t iw0 = ow0 - p.pad_w - xoff;  // aligned to the copy width
  float* xs = stage + T::kDyStage;
  if (p.vec_x == 4) load_x_halo<T, 4>(xs, x, p, c.n, c0, oh0 - p.pad_h, iw0);
  else if (p.vec_x == 2) load_x_halo<T, 2>(xs, x, p, c.n, c0, oh0 - p.pad_h, iw0);
  else load_x_halo<T, 1>(xs, x, p, c.n, c0, oh0 - p.pad_h, iw0);
}

// The 8 k8 steps (8 pixels each) of one strip. dya: this thread's A base (output channel g of
// the warp, pixel t); xb: its B base (input channel g of the warp, pixel t, plus the shift).
template <class T, bool kSplit>
__device__ __forceinline__ void wgrad_stage(float (&acc)[T::kMTiles][9][4], const float* dya, const float* xb) {
  constexpr int kM = T::kMTiles;
#pragma unroll(kSplit ? 1 : 2)
  for (int q = 0; q < T::kPos / 8; ++q) {
    const int pr = q / (T::kCols / 8), pc0 = q % (T::kCols / 8) * 8;
    const float* a = dya + pr * T::kCols + pc0;
    uint32_t a_hi[kM][4], a_pair[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      const float* r = a + 16 * mt * T::kDyLd;
      const float v[4] = {r[0], r[8 * T::kDyLd], r[4], r[8 * T::kDyLd + 4]};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (kSplit) {
          a_hi[mt][i] = tf32_bits(v[i]);
          const float hi = __uint_as_float(a_hi[mt][i]);
          a_pair[mt][i] = bf16_pair(hi, v[i] - hi);
        } else {
          a_hi[mt][i] = tf32_operand(v[i]);
        }
      }
    }
    const float* b = xb + pr * T::kRowLen + pc0;
#pragma unroll
    for (int tap = 0; tap < 9; ++tap) {
      const float* bt = b + (tap / 3) * T::kRowLen + tap % 3;
      const float b0 = bt[0], b1 = bt[4];  // pixels t and t + 4
      if constexpr (kSplit) {
        const uint32_t b0_hi = tf32_bits(b0), b1_hi = tf32_bits(b1);
        const float h0 = __uint_as_float(b0_hi), h1 = __uint_as_float(b1_hi);
        const uint32_t b0_pair = bf16_pair(b0 - h0, h0), b1_pair = bf16_pair(b1 - h1, h1);  // (lo', hi')
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) mma_bf16(acc[mt][tap], a_pair[mt], b0_pair, b1_pair);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) mma_tf32(acc[mt][tap], a_hi[mt], b0_hi, b1_hi);
      } else {
        const uint32_t b0_t = tf32_operand(b0), b1_t = tf32_operand(b1);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) mma_tf32(acc[mt][tap], a_hi[mt], b0_t, b1_t);
      }
    }
  }
}

// Block (tile, split) sums its slice of strips into part[split] (K, C, 3, 3) over its tile.
//
// FP32 accuracy of long reductions: mma.sync adds its products to the fp32 accumulator with
// truncation (a slice of ~8k pixels = ~2000 accumulating mma per element gives rel. L2 ~3.75e-5
// against f64; the same split products with round-to-nearest adds ~6e-7). Truncation is biased
// (always toward
// zero), so its error grows linearly with the chain: ~2^-23 |acc| per accumulating mma. In
// FP32 mode the tensor-core chain is therefore restarted every strip: each strip's 16
// accumulating mma (8 k8 steps x 2) start from 0 and the strip's sum is added to an fp32 side
// sum with FADD (round to nearest, unbiased). Chain error <= 16 x 2^-23 ~ 2e-6 of a strip's
// sum (typically far less), side-sum error ~sqrt(strips) x 2^-24; the f64 sum over slices
// adds none. The side sums take another 72 registers: 8 warps in FP32 mode.
template <bool kSplit>
__global__ void __launch_bounds__(WgradTileFor<kSplit>::kThreads, 1)
    conv3x3_wgrad_kernel(float* __restrict__ part,      // (splits, K, C, 3, 3)
                         const float* __restrict__ dy,  // (N, K, Ho, Wo)
                         const float* __restrict__ x,   // (N, C, H, W)
                         WgradParams p) {
  using T = WgradTileFor<kSplit>;
  constexpr int kM = T::kMTiles;
  constexpr int kSideM = kSplit ? kM : 1;  // fp32 side sums (FP32 mode only)
  float* smem = dynamic_smem<16>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int wk = warp % T::kWarpsK, wc = warp / T::kWarpsK;
  const int64_t tiles = p.k_tiles * p.c_tiles;
  const int64_t tile = blockIdx.x % tiles, split = blockIdx.x / tiles;
  const int64_t k0 = tile % p.k_tiles * T::kBK, c0 = tile / p.k_tiles * T::kBC;
  const int64_t first = split * p.strips_per_split;
  const int64_t count = (p.strips - first < p.strips_per_split ? p.strips - first : p.strips_per_split);
  const int xoff = static_cast<int>(pos_mod(-p.pad_w, p.vec_x));  // ow0 is a multiple of kCols
  const int a_base = (wk * 16 * kM + g) * T::kDyLd + t;
  const int b_base = T::kDyStage + (wc * 8 + g) * T::kXChan + xoff + t;

  float acc[kM][9][4], side[kSideM][9][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int tap = 0; tap < 9; ++tap)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][tap][i] = 0.f;
#pragma unroll
  for (int mt = 0; mt < kSideM; ++mt)
#pragma unroll
    for (int tap = 0; tap < 9; ++tap)
#pragma unroll
      for (int i = 0; i < 4; ++i) side[mt][tap][i] = 0.f;

  StripCursor cur = strip_cursor(first, p);
#pragma unroll 1
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) {
      load_strip<T>(smem + s * T::kStageFloats, dy, x, p, cur, k0, c0, xoff);
      advance(cur, p);
    }
    cp_async_commit();
  }
  int load_stage = kStages - 1, compute_stage = 0;
#pragma unroll 1
  for (int64_t i = 0; i < count; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (i + kStages - 1 < count) {
      load_strip<T>(smem + load_stage * T::kStageFloats, dy, x, p, cur, k0, c0, xoff);
      advance(cur, p);
    }
    cp_async_commit();
    load_stage = load_stage == kStages - 1 ? 0 : load_stage + 1;
    const float* stage = smem + compute_stage * T::kStageFloats;
    compute_stage = compute_stage == kStages - 1 ? 0 : compute_stage + 1;
    wgrad_stage<T, kSplit>(acc, stage + a_base, stage + b_base);
    if constexpr (kSplit) {  // end of the strip's tensor-core chain: into the side sums
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int tap = 0; tap < 9; ++tap)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            side[mt][tap][e] += acc[mt][tap][e];
            acc[mt][tap][e] = 0.f;
          }
    }
  }

  float* dst = part + split * p.K * p.C * 9;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int tap = 0; tap < 9; ++tap)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t k = k0 + wk * 16 * kM + mt * 16 + g + (i >= 2 ? 8 : 0);
        const int64_t c = c0 + wc * 8 + 2 * t + (i & 1);
        const float v = kSplit ? side[kSplit ? mt : 0][tap][i] : acc[mt][tap][i];
        if (k < p.K && c < p.C) dst[(k * p.C + c) * 9 + tap] = v;
      }
}

// The slices' partials are summed by sum_partials_kernel (ops/cuda/sum_partials.cuh).

// Grad-weight: at most this many output pixels per slice, so each (side) accumulator sums a
// bounded number of terms (FP32 accuracy), and at most this many bytes of partials.
constexpr int64_t kMaxPixelsPerSplit = 8192;
constexpr int64_t kMaxPartialBytes = int64_t(512) << 20;

// Returns the plan and the number of slices (splits) of the reduction.
template <class T>
WgradParams plan_wgrad(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo,
                              int64_t pad_h, int64_t pad_w, int vec_x, int vec_dy, int64_t sms, int64_t& splits) {
  WgradParams p{};
  p.N = N, p.C = C, p.H = H, p.W = W;
  p.K = K, p.Ho = Ho, p.Wo = Wo;
  p.pad_h = pad_h, p.pad_w = pad_w;
  p.row_tiles = ceil_div(Ho, T::kRows);
  p.col_tiles = ceil_div(Wo, T::kCols);
  p.strips = N * p.row_tiles * p.col_tiles;
  p.k_tiles = ceil_div(K, T::kBK);
  p.c_tiles = ceil_div(C, T::kBC);
  p.vec_x = vec_x, p.vec_dy = vec_dy;
  // Enough slices for bounded sums, rounded up to whole waves of one block per SM, then
  // limited by the partials' size and by the strip count.
  const int64_t tiles = p.k_tiles * p.c_tiles;
  const int64_t count = K * C * 9;
  splits = ceil_div(p.strips * T::kPos, kMaxPixelsPerSplit);
  splits = ceil_div(ceil_div(splits * tiles, sms) * sms, tiles);
  splits = std::min(splits, std::max<int64_t>(1, kMaxPartialBytes / (count * int64_t(sizeof(float)))));
  splits = std::max<int64_t>(1, std::min(splits, p.strips));
  p.strips_per_split = ceil_div(p.strips, splits);
  splits = ceil_div(p.strips, p.strips_per_split);  // no empty slices
  return p;
}

}  // namespace

template <bool kSplit>
void run_wgrad(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s) {
  using T = WgradTileFor<kSplit>;
  const int dev = dw.device().index;
  set_device(dev);
  int64_t splits = 1;
  const WgradParams p = plan_wgrad<T>(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2],
                                      row_copy_width(x.data<float>(), s.in[2]),
                                      row_copy_width(dy.data<float>(), s.out[2]), sm_count(dev), splits);
  Tensor scratch;
  float* part = partial_slices(scratch, dw, splits);
  const auto kernel = conv3x3_wgrad_kernel<kSplit>;
  allow_dynamic_smem(kernel, int(T::kSmemBytes));
  kernel<<<static_cast<unsigned>(p.k_tiles * p.c_tiles * splits), T::kThreads, T::kSmemBytes, stream(dev)>>>(
      part, dy.data<float>(), x.data<float>(), p);
  TG_LAUNCH_CHECK();
  sum_partials(dw.data<float>(), part, dw.numel(), splits, stream(dev));
}

template void run_wgrad<true>(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s);
template void run_wgrad<false>(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s);

}  // namespace tg::cuda::conv3x3_detail
