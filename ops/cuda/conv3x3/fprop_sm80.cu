// The mma.sync forward / grad-input kernel of the 3x3 stride-1 NCHW fast path (implicit GEMM on
// m16n8k8 TF32), its weight pre-pass and launcher (run_gemm). The dispatch in conv3x3/dispatch.cu sends
// Hopper to the wgmma kernels and other GPUs here. Design and precision: docs/kernels/conv3x3.md.
//
// Forward (grad-input = the same kernel on flipped, channel-transposed weights): M = output
//   pixels, N = output channels, reduction = input channels x 9 taps. A block owns 2x128 or
//   4x128 pixels of one image and 128 or 64 output channels; warp tiles 64 x 32 or 64 x 64.
//   Per stage (3 cp.async stages, persistent) 8 input channels of the halo and their 9 taps'
//   weights; each tap is one k8 step reading the halo shifted by (r, s).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/mma_sync.cuh"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tf32.cuh"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv3x3/pipeline_sm80.cuh"
#include "ops/cuda/conv3x3/staging.cuh"

namespace tg::cuda::conv3x3_detail {
namespace {

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
  static constexpr int kOutChannels = kBN;  // per tile (conv3x3/staging.cuh walks tiles by it)
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

// Issues the copies of the cursor's (tile, chunk) into `stage`.
template <class T>
__device__ __forceinline__ void load_step(float* stage, const float* __restrict__ in, const float* __restrict__ wp,
                                          const GemmParams& p, const LoadCursor& cur, int xoff) {
  load_chunk_halo<T>(stage, in, p, cur, xoff);

  // Weights of the chunk: 8 channels x 9 taps = 72 consecutive rows of kBN output channels.
  constexpr int kRows = T::kChunk * 9, kPerRow = T::kBN / 4;
  const int64_t c0 = cur.chunk * T::kChunk;
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

constexpr int kPrepThreads = 256;

template <class T, bool kSplit>
void launch_gemm(float* out, const float* in, const float* wp, const float* bias, const GemmParams& p, int dev) {
  const auto kernel = conv3x3_gemm_kernel<T, kSplit>;
  allow_dynamic_smem(kernel, int(T::kSmemBytes));
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

}  // namespace

void run_gemm(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, const GemmParams& p,
              bool for_grad_input, Precision precision) {
  const bool split = precision == Precision::FP32;
  if (use_narrow_tile(p)) {
    if (split) run_gemm<NarrowTile16, true>(out, in, w, bias, p, for_grad_input);
    else run_gemm<NarrowTile16, false>(out, in, w, bias, p, for_grad_input);
  } else {
    if (split) run_gemm<WideTile16, true>(out, in, w, bias, p, for_grad_input);
    else run_gemm<WideTile16, false>(out, in, w, bias, p, for_grad_input);
  }
}

}  // namespace tg::cuda::conv3x3_detail
