// 3x3 stride-1 NCHW convolutions as implicit GEMMs on mma.sync m16n8k8 TF32: conv3x3_applies, the
// per-pass dispatch (to the wgmma kernels on Hopper), the mma.sync forward / grad-input and
// grad-weight kernels and their weight pre-pass. Design and precision: docs/kernels/conv3x3.md.
//
// Forward (grad-input = the same kernel on flipped, channel-transposed weights): M = output
//   pixels, N = output channels, reduction = input channels x 9 taps. A block owns 2x128 or
//   4x128 pixels of one image and 128 or 64 output channels; warp tiles 64 x 32 or 64 x 64.
//   Per stage (3 cp.async stages, persistent) 8 input channels of the halo and their 9 taps'
//   weights; each tap is one k8 step reading the halo shifted by (r, s).
// Grad-weight: M = output channels, N = input channels x 9 taps, reduction over every (image,
//   pixel). Blocks own a dw tile (128 or, FP32, 64 x 32 x 9) and a slice of 2x32-pixel strips;
//   partials per slice summed in a fixed order in f64. FP32 restarts the tensor-core chain every
//   strip into fp32 side sums (mma.sync accumulates with truncation, see conv3x3_wgrad_kernel).
// FP32 mode: hi*hi' as one TF32 op plus both cross terms in one bf16 m16n8k16 (see tf32_bits).
//
// Shared-memory strides are chosen so that every fragment load of a warp hits 32 distinct banks.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/mma_sync.cuh"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tf32.cuh"
#include "ops/cuda/conv3x3.h"
#include "ops/cuda/conv3x3_staging.cuh"
#include "ops/cuda/conv3x3_wgmma.h"
#include "ops/cuda/conv3x3_wgmma_dw.h"
#include "ops/cuda/conv3x3_wgmma_ss.h"
#include "ops/cuda/policy.h"
#include "ops/cuda/sum_partials.cuh"

namespace tg::cuda {
namespace {

// ---- PTX primitives: cp.async, mma_tf32, mma_bf16, bf16_pair, the TF32 roundings and the
// dynamic shared memory in ops/cuda/arch/ (with their fragment layouts); store_if in
// conv3x3_staging.cuh ----

// ---- kernels (BEGIN KERNELS: everything down to END KERNELS uses only the primitives above) ----

constexpr int kStages = 3;  // cp.async pipeline depth

// Smallest stride >= n (a multiple of 4 floats, for 16-byte copies) such that the 8 x 4 lanes
// of a fragment load, at addresses (lane % 4) * stride + lane / 4, hit 32 distinct banks.
constexpr int stride_for_rows_of_4(int n) {
  while (n % 4 != 0 || (n % 32 != 8 && n % 32 != 24)) ++n;
  return n;
}
// The same for addresses (lane / 4) * stride + lane % 4: stride / 4 must be odd.
constexpr int stride_for_rows_of_8(int n) {
  while (n % 8 != 4) ++n;
  return n;
}

// FP32-accurate products (Precision::FP32): x = hi + lo with hi = tf32(x), |lo| <= 2^-11 |x|;
// x * w ~= hi*hi' (one TF32 mma, exact products) + hi*lo' + lo*hi' (one bf16 m16n8k16 mma
// whose k16 interleaves the pairs: element 2k is hi, 2k+1 is lo on the A side and lo', hi'
// on the B side). bf16 keeps 8 bits of each cross term, itself ~2^-11 of the product, so the
// error is ~2^-20 per product; lo*lo' (~2^-22) is dropped. Two mma instead of 3xTF32's three.
// hi = tf32_bits(x), plain TF32 operands tf32_operand(x) (ops/cuda/arch/tf32.cuh).

// Block tile of the forward kernel: kRows x kCols output pixels of one image times kBN
// output channels; warps laid out kWarpsM (pixels) x kWarpsN (channels), each 64 pixels x
// kWarpN (8 kNTiles) channels.
template <int kRows_, int kCols_, int kWarpsM_, int kWarpsN_, int kNTiles_ = 8>
struct FwdTile {
  static constexpr int kRows = kRows_, kCols = kCols_, kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMTiles = 4, kNTiles = kNTiles_;  // per warp: 4 x m16 (pixels), kNTiles x n8 (channels)
  static constexpr int kWarpN = 8 * kNTiles;             // output channels per warp
  static constexpr int kBN = kWarpN * kWarpsN;
  static constexpr int kOutChannels = kBN;  // per tile (conv3x3_staging.cuh walks tiles by it)
  static_assert(kRows * kCols == 16 * kMTiles * kWarpsM, "the warps must cover the pixel tile");
  static constexpr int kTilesPerRow = kCols / 16;  // m16 tiles in one output row of the tile
  static_assert(kTilesPerRow % kMTiles == 0 || kMTiles % kTilesPerRow == 0, "warp tiles must not straddle");
  static constexpr int kChunk = 8;               // input channels per stage: one k8 step per tap
  static constexpr int kHaloRows = kRows + 2;
  static constexpr int kRowLen = kCols + 8;      // kCols + 2 halo columns + <= 3 alignment shift, whole vectors
  static constexpr int kXChan = stride_for_rows_of_4(kHaloRows * kRowLen);  // A: lanes t -> channels
  static constexpr int kWLd = kBN + 8;           // B: lanes t -> rows 9 * kWLd apart, = 8 (mod 32)
  static_assert((9 * kWLd) % 32 == 8 || (9 * kWLd) % 32 == 24, "weight rows must spread over the banks");
  static constexpr int kXStage = kChunk * kXChan;
  static constexpr int kWStage = kChunk * 9 * kWLd;
  static constexpr int kStageFloats = kXStage + kWStage;
  static constexpr size_t kSmemBytes = sizeof(float) * kStages * kStageFloats;

  // Where m16 tile mt of a warp lies relative to the warp's first pixel (row, column).
  static __device__ __forceinline__ constexpr int row_off(int mt) { return kTilesPerRow >= kMTiles ? 0 : mt / kTilesPerRow; }
  static __device__ __forceinline__ constexpr int col_off(int mt) {
    return kTilesPerRow >= kMTiles ? 16 * mt : 16 * (mt % kTilesPerRow);
  }
};
// More than 64 output channels: 2 x 128 pixels x 128 channels. At most 64: 4 x 128 x 64.
// Both run 16 warps of 64 x 32 (64 accumulators, <= 128 registers, no spills): 4 warps per
// scheduler to hide mma.sync / LDS latency, at 1.5 LDS per mma instead of 1 in TF32 (A
// fragments are reused over 4 n8 tiles instead of 8). WideTile / NarrowTile are the 8-warp
// 64 x 64 versions (255 registers, 2 warps per scheduler: latency-bound); kept so the choice in
// run_gemm can be switched back with one line.
using WideTile = FwdTile<2, 128, 4, 2>;
using WideTile16 = FwdTile<2, 128, 4, 4, 4>;
using NarrowTile = FwdTile<4, 128, 8, 1>;
using NarrowTile16 = FwdTile<4, 128, 8, 2, 4>;

// One implicit-GEMM pass: out (N, Kout, Hout, Wout) = conv3x3(in (N, Cin, Hin, Win), prepared w)
// with input row = output row + tap row - pad_h (likewise columns); pads may be negative.
struct GemmParams {
  int64_t N, Cin, Hin, Win;
  int64_t Kout, Hout, Wout;
  int64_t pad_h, pad_w;
  int64_t kout_pad;  // prepared weights: (chunks * 8, 9, kout_pad), zero beyond Cin / Kout
  int64_t chunks;    // ceil(Cin / 8)
  int64_t row_tiles, col_tiles, k_tiles, tiles;
  int vec;  // floats per input copy (4, 2 or 1): rows of `in` allow this alignment
};

// Issues the copies of the cursor's (tile, chunk) into `stage`.
template <class T>
__device__ __forceinline__ void load_step(float* stage, const float* __restrict__ in, const float* __restrict__ wp,
                                          const GemmParams& p, const LoadCursor& cur, int xoff) {
  const int64_t c0 = cur.chunk * T::kChunk;
  const int64_t ih0 = cur.tc.oh0 - p.pad_h;
  const int64_t iw0 = cur.tc.ow0 - p.pad_w - xoff;  // aligned to the copy width
  if (p.vec == 4) load_halo<T, 4>(stage, in, p, cur.tc.n, c0, ih0, iw0);
  else if (p.vec == 2) load_halo<T, 2>(stage, in, p, cur.tc.n, c0, ih0, iw0);
  else load_halo<T, 1>(stage, in, p, cur.tc.n, c0, ih0, iw0);

  // Weights of the chunk: 8 channels x 9 taps = 72 consecutive rows of kBN output channels.
  constexpr int kRows = T::kChunk * 9, kPerRow = T::kBN / 4;
  const RowGrid g{wp, c0 * 9 * p.kout_pad + cur.tc.k0, p.kout_pad, 0, T::kWLd, 0, kRows, 0, 1, 0, kPerRow};
  copy_grid<T::kThreads, kRows, 1, kPerRow, 4>(stage + T::kXStage, g);
}

// The 9 k8 steps of one stage. xa: this thread's A base (channel t, first pixel of the warp
// + g, plus the alignment shift); wb: its B base (channel t, tap 0, output channel g of the warp).
template <class T, bool kSplit>
__device__ __forceinline__ void mma_stage(float (&acc)[4][T::kNTiles][4], const float* xa, const float* wb) {
#pragma unroll(kSplit ? 3 : 9)
  for (int tap = 0; tap < 9; ++tap) {
    const float* xt = xa + (tap / 3) * T::kRowLen + tap % 3;
    // a_hi: TF32 operands; a_pair (FP32 mode): the bf16 (hi, lo) pairs of the cross terms.
    uint32_t a_hi[4][4], a_pair[4][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const float* q = xt + T::row_off(mt) * T::kRowLen + T::col_off(mt);
      const float v[4] = {q[0], q[8], q[4 * T::kXChan], q[4 * T::kXChan + 8]};
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
    const float* wt = wb + tap * T::kWLd;
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt) {
      const float b0 = wt[8 * nt], b1 = wt[8 * nt + 36 * T::kWLd];  // channels t and t + 4
      if constexpr (kSplit) {
        const uint32_t b0_hi = tf32_bits(b0), b1_hi = tf32_bits(b1);
        const float h0 = __uint_as_float(b0_hi), h1 = __uint_as_float(b1_hi);
        const uint32_t b0_pair = bf16_pair(b0 - h0, h0), b1_pair = bf16_pair(b1 - h1, h1);  // (lo', hi')
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) mma_bf16(acc[mt][nt], a_pair[mt], b0_pair, b1_pair);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) mma_tf32(acc[mt][nt], a_hi[mt], b0_hi, b1_hi);
      } else {
        // The prepared weights are already TF32 (rounded once, in the pre-pass).
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) mma_tf32(acc[mt][nt], a_hi[mt], __float_as_uint(b0), __float_as_uint(b1));
      }
    }
  }
}

// Writes a finished tile (+ bias) and zeroes the accumulators. This thread holds pixels
// (mt, half) -> (row warp_row + row_off(mt), column warp_col + col_off(mt) + g + 8 half) of the
// tile and channels (nt, j) -> wn * kWarpN + 8 nt + 2 t + j. Pixel offsets inside the tile are
// 32-bit and computed once; the channel pointer steps by whole planes (64-bit), so a store is
// an address add, a predicate and the store (addresses past the tensor are formed for
// channels >= Kout or pixels outside the output, and never stored to).
template <class T>
__device__ __forceinline__ void store_tile(float* __restrict__ out, const float* __restrict__ bias,
                                           const GemmParams& p, const TileCoord& tc, float (&acc)[4][T::kNTiles][4],
                                           int warp_row, int warp_col, int wn, int g, int t) {
  const int64_t plane = p.Hout * p.Wout;
  int pix[4][2];
  unsigned pix_ok = 0;  // bit 2 * mt + half
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    const int row = warp_row + T::row_off(mt);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int col = warp_col + T::col_off(mt) + g + 8 * half;
      pix[mt][half] = row * static_cast<int>(p.Wout) + col;  // < kRows * Wout: fits
      if (tc.oh0 + row < p.Hout && tc.ow0 + col < p.Wout) pix_ok |= 1u << (2 * mt + half);
    }
  }
  const int64_t k_first = tc.k0 + wn * T::kWarpN + 2 * t;
  // Channel k_first at the tile origin; past the tensor only when k_first >= Kout (unused then).
  float* channel = out + ((tc.n * p.Kout + k_first) * p.Hout + tc.oh0) * p.Wout + tc.ow0;
#pragma unroll
  for (int nt = 0; nt < T::kNTiles; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t k = k_first + 8 * nt + j;
      const bool k_ok = k < p.Kout;
      const float b = bias && k_ok ? bias[k] : 0.f;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          store_if(channel + pix[mt][half], acc[mt][nt][2 * half + j] + b, k_ok && (pix_ok >> (2 * mt + half) & 1u));
          acc[mt][nt][2 * half + j] = 0.f;
        }
      }
      channel += j == 0 ? plane : 7 * plane;  // channels 8 nt + j: +1, then +7
    }
  }
}

// out = conv3x3(in, wp) (+ bias). The grid loops over tiles; the pipeline runs over the
// block's (tile, chunk) steps without a break, so the next tile's first stages load while
// this tile finishes and writes.
template <class T, bool kSplit>
__global__ void __launch_bounds__(T::kThreads, 1)
    conv3x3_gemm_kernel(float* __restrict__ out,        // (N, Kout, Hout, Wout)
                        const float* __restrict__ in,   // (N, Cin, Hin, Win)
                        const float* __restrict__ wp,   // (chunks * 8, 9, kout_pad)
                        const float* __restrict__ bias, // (Kout) or null
                        GemmParams p) {
  float* smem = dynamic_smem<16>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = warp % T::kWarpsM, wn = warp / T::kWarpsM;
  const int warp_row = (wm * T::kMTiles) / T::kTilesPerRow, warp_col = (wm * T::kMTiles) % T::kTilesPerRow * 16;
  // Every tile has the same alignment shift: ow0 is a multiple of kCols, hence of vec.
  const int xoff = static_cast<int>(pos_mod(-p.pad_w, p.vec));
  const int a_base = t * T::kXChan + warp_row * T::kRowLen + warp_col + xoff + g;
  const int b_base = T::kXStage + t * 9 * T::kWLd + wn * T::kWarpN + g;

  const int64_t my_tiles = blockIdx.x < p.tiles ? ceil_div(p.tiles - blockIdx.x, gridDim.x) : 0;
  const int64_t steps = my_tiles * p.chunks;

  float acc[4][T::kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  LoadCursor cur{blockIdx.x, 0, tile_coord<T>(blockIdx.x, p)};
#pragma unroll 1
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) {
      load_step<T>(smem + s * T::kStageFloats, in, wp, p, cur, xoff);
      advance<T>(cur, p);
    }
    cp_async_commit();
  }
  int load_stage = kStages - 1, compute_stage = 0;
  int64_t out_tile = blockIdx.x, chunk = 0;
#pragma unroll 1
  for (int64_t step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();  // this step's copies (this thread's) have landed
    __syncthreads();               // everyone's have, and the stage about to be refilled is free
    if (step + kStages - 1 < steps) {
      load_step<T>(smem + load_stage * T::kStageFloats, in, wp, p, cur, xoff);
      advance<T>(cur, p);
    }
    cp_async_commit();
    load_stage = load_stage == kStages - 1 ? 0 : load_stage + 1;
    const float* stage = smem + compute_stage * T::kStageFloats;
    compute_stage = compute_stage == kStages - 1 ? 0 : compute_stage + 1;
    mma_stage<T, kSplit>(acc, stage + a_base, stage + b_base);

    if (++chunk < p.chunks) continue;
    // Last chunk of a tile: write it and start the next one from zero.
    chunk = 0;
    store_tile<T>(out, bias, p, tile_coord<T>(out_tile, p), acc, warp_row, warp_col, wn, g, t);
    out_tile += gridDim.x;
  }
}

// wp (cin_pad, 9, kout_pad) from w (K, C, 3, 3), zero-padded. Forward: wp[c][tap][k] =
// w[k][c][tap]. Grad-input (the convolution of dy with the flipped kernel, channels swapped):
// wp[k][tap][c] = w[k][c][8 - tap]. TF32 mode rounds here once instead of in every block.
__global__ void prepare_weights_kernel(float* __restrict__ wp, const float* __restrict__ w, int64_t K, int64_t C,
                                       int64_t cin_pad, int64_t kout_pad, bool for_grad_input, bool round_tf32) {
  const int64_t total = cin_pad * 9 * kout_pad;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = i % kout_pad, tap = (i / kout_pad) % 9, ci = i / (9 * kout_pad);
    float v = 0.f;
    if (!for_grad_input) {
      if (ci < C && o < K) v = w[(o * C + ci) * 9 + tap];
    } else {
      if (ci < K && o < C) v = w[(ci * C + o) * 9 + (8 - tap)];
    }
    wp[i] = round_tf32 ? __uint_as_float(tf32_round(v)) : v;
  }
}

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

// ---- planning (host): the derived fields of each pass ----

// Forward: out = y (N, K, Ho, Wo) from in = x (N, C, H, W).
inline GemmParams forward_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo,
                                 int64_t pad_h, int64_t pad_w) {
  GemmParams p{};
  p.N = N, p.Cin = C, p.Hin = H, p.Win = W;
  p.Kout = K, p.Hout = Ho, p.Wout = Wo;
  p.pad_h = pad_h, p.pad_w = pad_w;
  return p;
}
// Grad-input: out = dx (N, C, H, W) from in = dy (N, K, Ho, Wo), the flipped kernel with the
// channels swapped and padding 2 - pad (a negative padding only crops: it is an offset).
inline GemmParams grad_input_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo,
                                    int64_t pad_h, int64_t pad_w) {
  GemmParams p{};
  p.N = N, p.Cin = K, p.Hin = Ho, p.Win = Wo;
  p.Kout = C, p.Hout = H, p.Wout = W;
  p.pad_h = 2 - pad_h, p.pad_w = 2 - pad_w;
  return p;
}
// The tile a pass uses: at most 64 output channels -> NarrowTile16.
inline bool use_narrow_tile(const GemmParams& p) { return p.Kout <= NarrowTile16::kBN; }

template <class T>
GemmParams plan_gemm(GemmParams p, int vec) {
  p.k_tiles = ceil_div(p.Kout, T::kBN);
  p.kout_pad = p.k_tiles * T::kBN;
  p.chunks = ceil_div(p.Cin, T::kChunk);
  p.row_tiles = ceil_div(p.Hout, T::kRows);
  p.col_tiles = ceil_div(p.Wout, T::kCols);
  p.tiles = p.N * p.row_tiles * p.col_tiles * p.k_tiles;
  p.vec = vec;
  return p;
}

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

// ---- END KERNELS ----

constexpr int kPrepThreads = 256;

// Widest copy (floats) that rows of length row_len starting at base allow.

bool takes_3x3(const ConvShape& s, Device) { return conv3x3_applies(s); }
void check_tensors(const char* op, const ConvShape& s, ExpectedTensors ts) {
  check_conv3x3_tensors(op, s, takes_3x3, "a 3x3 stride-1 NCHW 2-D convolution", ts);
}

template <class T, bool kSplit>
void launch_gemm(float* out, const float* in, const float* wp, const float* bias, const GemmParams& p, int dev) {
  const auto kernel = conv3x3_gemm_kernel<T, kSplit>;
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(T::kSmemBytes)));
  // One block per SM (the accumulators take most registers); each loops over tiles.
  const int64_t grid = std::min<int64_t>(p.tiles, sm_count(dev));
  kernel<<<static_cast<unsigned>(grid), T::kThreads, T::kSmemBytes, stream(dev)>>>(out, in, wp, bias, p);
  TG_LAUNCH_CHECK();
}

// out = conv3x3(in, w re-laid out): the forward pass, or (transposed weights) the input gradient.
template <class T, bool kSplit>
void run_gemm(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, GemmParams p,
              bool for_grad_input) {
  const int dev = out.device().index;
  set_device(dev);
  p = plan_gemm<T>(p, row_copy_width(in.data<float>(), p.Win));

  Tensor wp = Tensor::empty({p.chunks * T::kChunk, 9, p.kout_pad}, {.dtype = DType::f32, .device = out.device()});
  prepare_weights_kernel<<<grid_for(wp.numel(), kPrepThreads), kPrepThreads, 0, stream(dev)>>>(
      wp.data<float>(), w.data<float>(), w.size(0), w.size(1), p.chunks * T::kChunk, p.kout_pad, for_grad_input,
      !kSplit);
  TG_LAUNCH_CHECK();
  launch_gemm<T, kSplit>(out.data<float>(), in.data<float>(), wp.data<float>(), bias, p, dev);
  // wp is freed stream-ordered, after the kernel that reads it.
}

void run_gemm(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, const GemmParams& p,
              bool for_grad_input) {
  const bool split = precision() == Precision::FP32;
  if (use_narrow_tile(p)) {
    if (split) run_gemm<NarrowTile16, true>(out, in, w, bias, p, for_grad_input);
    else run_gemm<NarrowTile16, false>(out, in, w, bias, p, for_grad_input);
  } else {
    if (split) run_gemm<WideTile16, true>(out, in, w, bias, p, for_grad_input);
    else run_gemm<WideTile16, false>(out, in, w, bias, p, for_grad_input);
  }
}

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
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(T::kSmemBytes)));
  kernel<<<static_cast<unsigned>(p.k_tiles * p.c_tiles * splits), T::kThreads, T::kSmemBytes, stream(dev)>>>(
      part, dy.data<float>(), x.data<float>(), p);
  TG_LAUNCH_CHECK();
  sum_partials(dw.data<float>(), part, dw.numel(), splits, stream(dev));
}

}  // namespace

// FP32 mode: the forward / grad-input tensor-core chains run over all input channels (2
// accumulating mma per 8 channels and tap; truncating adds, ~1.9e-8 rel. error each, see
// conv3x3_wgrad_kernel): 128 channels -> 288 adds, ~5e-6. More
// channels would exceed 1e-5, so those go to the general (FFMA) kernels.
constexpr int64_t kMaxFp32Channels = 128;
int row_copy_width(const float* base, int64_t row_len, int64_t first_col) {
  const auto a = reinterpret_cast<uintptr_t>(base);
  for (int vec : {4, 2})
    if (a % (4 * vec) == 0 && row_len % vec == 0 && ((first_col % vec) + vec) % vec == 0) return vec;
  return 1;
}

void check_conv3x3_tensors(const char* op, const ConvShape& s, bool (*applies)(const ConvShape&, Device),
                           const char* needs, ExpectedTensors ts) {
  for (const auto& [t, shape] : ts) TG_CHECK(t->defined(), op, ": undefined tensor where ", shape, " was expected");
  const Device d = ts.begin()->first->device();
  TG_CHECK(applies(s, d), op, ": needs ", needs, "; got x ", s.x_shape(), ", w ", s.w_shape(), " on ", d);
  for (const auto& [t, shape] : ts) {
    TG_CHECK(t->dtype() == DType::f32, op, ": expected f32 tensors, got ", describe(*t));
    TG_CHECK(t->device() == d && d.is_cuda(), op, ": expected every tensor on one GPU (", d, "), got ", describe(*t));
    TG_CHECK(t->shape() == shape, op, ": tensor ", describe(*t), " does not match the problem x ", s.x_shape(),
             ", w ", s.w_shape(), " -> y ", s.y_shape(), ": expected ", shape);
  }
}


bool conv3x3_applies(const ConvShape& s) {
  if (precision() == Precision::FP32 && (s.C > kMaxFp32Channels || s.K > kMaxFp32Channels)) return false;
  return s.spatial_dims == 2 && s.layout == Layout::NCHW && s.kernel[0] == 1 && s.kernel[1] == 3 &&
         s.kernel[2] == 3 && s.stride[0] == 1 && s.stride[1] == 1 && s.stride[2] == 1 && s.dilation[0] == 1 &&
         s.dilation[1] == 1 && s.dilation[2] == 1 && s.in[0] == 1 && s.out[0] == 1 && s.pad[0] == 0 &&
         s.pad[1] >= 0 && s.pad[2] >= 0 && s.N >= 1 && s.C >= 1 && s.K >= 1 && s.in[1] >= 1 && s.in[2] >= 1 &&
         s.out[1] >= 1 && s.out[2] >= 1 &&
         // In-tile pixel offsets are 32-bit (rows x width): rows up to 2^28 wide.
         s.in[2] + 2 * s.pad[2] <= (int64_t{1} << 28);
}

// Forward and grad-input: TF32 on Hopper has two wgmma kernels, both operands from shared memory
// (conv3x3_wgmma_ss, the default) or activations from registers (conv3x3_wgmma, which also serves
// FP32 mode); the mma.sync kernel (run_gemm) serves other GPUs. KernelPolicy::conv3x3 (tests,
// benchmark) can pick the register-A or the mma.sync kernel instead.
void conv3x3_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s) {
  check_tensors("conv3x3_forward", s, {{&y, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}});
  if (b.defined()) check_tensors("conv3x3_forward", s, {{&y, s.y_shape()}, {&b, Shape{s.K}}});
  const Conv3x3Policy::Data data = kernel_policy().conv3x3.data;
  if (data == Conv3x3Policy::Data::Auto && conv3x3_wgmma_ss_applies(s, y.device()))
    return conv3x3_wgmma_ss_forward(y, x, w, b, s);
  if (data != Conv3x3Policy::Data::MmaSync && conv3x3_wgmma_applies(s, y.device()))
    return conv3x3_wgmma_forward(y, x, w, b, s);  // sm_90a, both modes
  run_gemm(y, x, w, b.defined() ? b.data<float>() : nullptr,
           forward_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
           /*for_grad_input=*/false);
}

void conv3x3_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s) {
  check_tensors("conv3x3_grad_input", s, {{&dx, s.x_shape()}, {&dy, s.y_shape()}, {&w, s.w_shape()}});
  const Conv3x3Policy::Data data = kernel_policy().conv3x3.data;
  if (data == Conv3x3Policy::Data::Auto && conv3x3_wgmma_ss_applies(s, dx.device()))
    return conv3x3_wgmma_ss_grad_input(dx, dy, w, s);
  if (data != Conv3x3Policy::Data::MmaSync && conv3x3_wgmma_applies(s, dx.device()))
    return conv3x3_wgmma_grad_input(dx, dy, w, s);  // sm_90a, both modes
  run_gemm(dx, dy, w, nullptr,
           grad_input_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
           /*for_grad_input=*/true);
}

void conv3x3_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s) {
  check_tensors("conv3x3_grad_weight", s, {{&dw, s.w_shape()}, {&dy, s.y_shape()}, {&x, s.x_shape()}});
  if (precision() == Precision::FP32) return run_wgrad<true>(dw, dy, x, s);
  // TF32 on Hopper: the wgmma kernel, unless KernelPolicy::conv3x3 asks for the mma.sync one.
  if (kernel_policy().conv3x3.weight == Conv3x3Policy::Weight::Auto && conv3x3_wgmma_dw_applies(s, dw.device())) {
    return conv3x3_wgmma_grad_weight(dw, dy, x, s);
  }
  run_wgrad<false>(dw, dy, x, s);
}

}  // namespace tg::cuda
