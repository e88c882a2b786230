// Forward and grad-input (the same kernel on flipped, transposed weights) of 3x3 stride-1 NCHW
// convolutions on Hopper (sm_90a), TF32 only, wgmma with BOTH operands in shared memory.
// Design, tiling, precision and limits: docs/kernels/conv3x3.md ("TF32 forward and grad-input").
//
// GEMM: M = 64 output channels (A = weights), N = 256 pixels of one output row (B = halo);
// k8 step = one tap x 8 input channels. 2 warpgroups, warpgroup w owns output row w of the tile
// (64 channels x 2 rows x 256 columns): one wgmma.m64n256k8 per tap, 128 accumulators.
// Both operands K-major, no swizzle (layout: arch/wgmma.cuh); a tap (r, s) only moves B's start
// to halo + ((w + r) * 264 + s) * 16 B. The weights' pre-pass writes the stage image exactly.
// D: thread (warp wi, g = lane / 4, t = lane % 4) holds channel k0 + 16 wi + g + 8 h, columns
// 8 j + 2 t + e in acc[4 j + 2 h + e]. FP32 mode is not offered (conv3x3_wgmma_ss_applies).
//
// Ordering, per stage two mbarriers:
//   full[stage]: every thread's cp.async.mbarrier.arrive.noinc + thread 0's expect_tx (256 + 1);
//   empty[stage]: lane 0 of each warp after its wgmma.wait_group retired the step (count 8).
//   Step s: wait full -> fence.proxy.async -> wgmma.fence -> 9 wgmma -> commit -> wait empty of
//   stage (s + 2) % 4 -> copies of step s + 2 -> wgmma.wait_group 1 -> arrive on empty of
//   (s - 1) % 4. No block barrier per step. Tile end: wait_group 0, fence_operand, staged store
//   through the warp's own scratch (outside the stages); next tile's first wgmma: scale-d = 0.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tma.cuh"
#include "ops/cuda/arch/wgmma.cuh"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv3x3/staging.cuh"
#include "ops/cuda/conv3x3/fprop_tf32_sm90.h"

namespace tg::cuda {
namespace {

// ---- kernels (primitives: ops/cuda/arch/ and conv3x3/staging.cuh) ----

// The block tile: 2 warpgroups (256 threads); warpgroup wg computes the tile's 64 output channels
// in output row wg, 256 columns: one m64n256k8 wgmma per tap.
struct SsTile {
  static constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups;
  static constexpr int kRows = kWarpgroups;  // output rows per tile: one per warpgroup
  static constexpr int kCols = 256;          // output columns per tile: the wgmma N
  static constexpr int kM = 64;              // output channels per tile: the wgmma M
  static constexpr int kOutChannels = kM;    // (conv3x3/staging.cuh walks tiles by it)
  static constexpr int kAcc = kCols / 2;     // f32 accumulators per thread
  static constexpr int kChunk = 8;           // input channels per stage: one k8 step per tap
  static constexpr int kStages = 4;          // a stage is refilled 2 steps after its use
  static constexpr int kHaloRows = kRows + 2;
  static constexpr int kHaloCols = kCols + 2;                 // columns the taps read
  static constexpr int kCopyCols = 8 * ceil_div(kHaloCols, 8);  // halo row stride in 16-byte pixels (264)
  static constexpr int kQuadFloats = kHaloRows * kCopyCols * 4;  // one channel quad of the halo
  static constexpr int kXStage = 2 * kQuadFloats;                 // halo floats per stage
  static constexpr int kTapFloats = 2 * kM * 4;                   // A image of one tap
  static constexpr int kWStage = 9 * kTapFloats;
  static constexpr int kStageFloats = kXStage + kWStage;
  static constexpr uint32_t kALbo = kM * 16, kASbo = 128;            // weights: next channel quad, next 8 rows
  static constexpr uint32_t kBLbo = kQuadFloats * 4, kBSbo = 128;    // halo: next channel quad, next 8 pixels
  // Staged stores: each warp's own scratch (outside the stages, so that no other warp's wgmma
  // can still be reading it) holds 8 output channels x 64 columns, rows padded to kScratchStride
  // floats (= 8 mod 32: the fragment-order 8-byte writes are conflict-free).
  static constexpr int kScratchCols = 64, kScratchStride = 72, kScratchFloats = 8 * kScratchStride;
  static constexpr size_t kScratchOffset = sizeof(float) * kStages * kStageFloats;
  static constexpr size_t kBarrierOffset = kScratchOffset + sizeof(float) * (kThreads / 32) * kScratchFloats;
  static constexpr size_t kSmemBytes = kBarrierOffset + 8 * 2 * kStages;  // + full and empty, per stage
  static_assert(kThreads / 32 == 2 * kHaloRows, "one warp per (channel quad, halo row) of a stage");
  static_assert(kScratchStride % 32 == 8 && kScratchStride >= kScratchCols, "conflict-free scratch rows");
  static_assert(kXStage % 32 == 0 && kStageFloats % 32 == 0, "operand images on 128-byte boundaries");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
};
using T = SsTile;

// One implicit-GEMM pass: out (N, Kout, Hout, Wout) = conv3x3(in (N, Cin, Hin, Win), prepared w)
// with input row = output row + tap row - pad_h (likewise columns); pads may be negative.
struct SsParams {
  int64_t N, Cin, Hin, Win;
  int64_t Kout, Hout, Wout;
  int64_t pad_h, pad_w;
  int64_t chunks;  // ceil(Cin / 8)
  int64_t row_tiles, col_tiles, k_tiles, tiles;
  bool pairs;  // Wout even and out 8-byte aligned: two adjacent columns per store
};

// Issues the 4-byte copies of the cursor's (tile, chunk) halo into `stage`, each float to its
// transposed slot; zero-filled (src-size 0) for padding, borders and channels past Cin. Warp v
// copies channel quad v / 4, halo row v % 4: lane (c = lane % 4, px = lane / 4) takes channel
// 4 quad + c, columns px + 8 i (i < 33, the last only for px < 2). One copy instruction writes
// 8 pixels x 4 channels = 128 contiguous bytes of shared memory and reads 4 rows x 32 bytes of
// global memory.
__device__ __forceinline__ void load_halo(float* stage, const float* __restrict__ in, const SsParams& p,
                                          const LoadCursor& cur) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad = warp / T::kHaloRows, hrow = warp % T::kHaloRows;
  const int c = lane % 4, px = lane / 4;
  const int64_t ci = cur.chunk * T::kChunk + 4 * quad + c;
  const int64_t ih = cur.tc.oh0 - p.pad_h + hrow;
  const int64_t iw_first = cur.tc.ow0 - p.pad_w + px;  // column of copy 0
  const bool row_ok = ci < p.Cin && ih >= 0 && ih < p.Hin;
  // Copy i reads column iw_first + 8 i: inside the row for 8 i in [col_lo, col_hi) (32-bit
  // compares against constants in the unrolled loop).
  const int col_lo = static_cast<int>(clamp_i64(-iw_first, -8, T::kCopyCols));
  const int col_hi = static_cast<int>(clamp_i64(p.Win - iw_first, -8, T::kCopyCols));
  // (ci, ih, iw_first); only read through where the copy is valid.
  const float* row = in + (row_ok ? ((cur.tc.n * p.Cin + ci) * p.Hin + ih) * p.Win + iw_first : 0);
  float* dst = stage + ((quad * T::kHaloRows + hrow) * T::kCopyCols + px) * 4 + c;
  constexpr int kCopies = T::kCopyCols / 8;                  // copies of lanes px < kLongLanes; one fewer after
  constexpr int kLongLanes = T::kHaloCols - 8 * (kCopies - 1);  // (the last copy's columns no tap reads)
  if (__all_sync(0xffffffffu, row_ok && col_lo <= 0 && col_hi > 8 * (kCopies - 1))) {
    // Every copy of this warp inside the input (all but the tiles at the image's left and right
    // edges): plain copies at constant offsets from one source and one destination register, one
    // instruction each (the general loop below spends ~7 on the bounds, the zero-fill select and
    // the address). Decided per warp, so no warp's lanes take different paths.
#pragma unroll
    for (int i = 0; i < kCopies - 1; ++i) cp_async<4>(dst + 32 * i, row + 8 * i, true);
    if (px < kLongLanes) cp_async<4>(dst + 32 * (kCopies - 1), row + 8 * (kCopies - 1), true);
    return;
  }
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    if (i == kCopies - 1 && px >= kLongLanes) break;  // columns no tap reads
    const bool ok = row_ok && 8 * i >= col_lo && 8 * i < col_hi;
    cp_async<4>(dst + 32 * i, ok ? row + 8 * i : in, ok);
  }
}

// Thread 0 asks the TMA unit for the cursor's chunk of weight images (one contiguous block of the
// prepared weights, laid out as in shared memory) into `stage`; `landed` completes when it is there.
__device__ __forceinline__ void load_weights(float* stage, uint64_t* landed, const float* __restrict__ wp,
                                             const SsParams& p, const LoadCursor& cur) {
  if (threadIdx.x != 0) return;
  constexpr uint32_t kBytes = sizeof(float) * T::kWStage;
  tma::mbar_arrive_expect_tx(landed, kBytes);
  tma::load_bytes(stage + T::kXStage, wp + (cur.chunk * p.k_tiles + cur.tc.k0 / T::kM) * T::kWStage, kBytes, landed);
}

// Issues the 9 taps of one stage for this warpgroup (output row wg of the tile), one m64n256k8
// each, as one commit group. x_addr / w_addr: shared addresses of the stage's halo and weights.
// accumulate: false for the first stage of a tile (its first wgmma overwrites the accumulators).
__device__ __forceinline__ void issue_stage(float (&acc)[T::kAcc], uint32_t x_addr, uint32_t w_addr, int wg,
                                            bool accumulate) {
  const uint64_t desc_a = wgmma::kmajor_desc(w_addr, T::kALbo, T::kASbo);
  const uint64_t desc_b = wgmma::kmajor_desc(x_addr + 16u * wg * T::kCopyCols, T::kBLbo, T::kBSbo);
  wgmma::fence();  // the accumulators were read (epilogue) or written by this thread before
#pragma unroll
  for (int tap = 0; tap < 9; ++tap) {
    const int r = tap / 3, s = tap % 3;
    wgmma::mma_ss_tf32<T::kCols>(acc, wgmma::desc_advance(desc_a, tap * T::kTapFloats * 4),
                                 wgmma::desc_advance(desc_b, 16 * (r * T::kCopyCols + s)), accumulate || tap > 0);
  }
  wgmma::commit();
}

// Writes a finished tile (+ bias). This thread holds output channels k0 + 16 wi + g + 8 h of
// output row oh0 + wg, columns ow0 + 8 j + 2 t + e in acc[4 j + 2 h + e]. Addresses are formed
// for rows, channels or columns outside the output too, and never stored to.
// p.pairs (the workload's case): staged through `scratch` (this warp's kScratchFloats) in 8 rounds
// of 8 channels x 64 columns: fragment-order 8-byte writes, then each store instruction writes
// 256 contiguous bytes of one output row (2 whole 128-byte lines) instead of 8 rows x 32 bytes: a
// quarter of the L2 write requests (the tensor cores idle during the epilogue).
// Otherwise (odd Wout or 4-byte aligned out): one float per store, from the fragments.
__device__ __forceinline__ void store_tile(float* __restrict__ out, const float* __restrict__ bias,
                                           const SsParams& p, const TileCoord& tc, const float (&acc)[T::kAcc],
                                           float* scratch, int wg, int wi, int lane) {
  const int g = lane / 4, t = lane % 4;
  const int64_t oh = tc.oh0 + wg;
  const int64_t cols_left64 = p.Wout - tc.ow0;  // columns of this tile inside the output
  const int cols_left = static_cast<int>(cols_left64 < T::kCols ? cols_left64 : T::kCols);
  constexpr int kRounds = T::kCols / T::kScratchCols, kFragCols = T::kScratchCols / 8;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t k_frag = tc.k0 + 16 * wi + g + 8 * h;  // this thread's fragment row
    const float b = bias && k_frag < p.Kout ? bias[k_frag] : 0.f;
    if (p.pairs) {
#pragma unroll
      for (int round = 0; round < kRounds; ++round) {
        // Fragment order in: row g, columns 8 jj + 2 t + e of this round's 64 columns.
#pragma unroll
        for (int jj = 0; jj < kFragCols; ++jj) {
          const int j = kFragCols * round + jj;
          st_shared_v2(scratch + g * T::kScratchStride + 8 * jj + 2 * t, acc[4 * j + 2 * h] + b,
                        acc[4 * j + 2 * h + 1] + b);
        }
        __syncwarp();
        // Rows out: lane l takes columns 2 l, 2 l + 1 of each of the 8 rows.
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const int64_t k = tc.k0 + 16 * wi + r + 8 * h;
          const bool row_ok = k < p.Kout && oh < p.Hout;
          const int col = T::kScratchCols * round + 2 * lane;
          float* row = out + ((tc.n * p.Kout + k) * p.Hout + oh) * p.Wout + tc.ow0;
          const float2 v = ld_shared_v2(scratch + r * T::kScratchStride + 2 * lane);
          store2_if(row + col, v.x, v.y, row_ok && col < cols_left);
        }
        __syncwarp();  // the next round overwrites the scratch
      }
    } else {
      const bool ok = k_frag < p.Kout && oh < p.Hout;
      float* row = out + ((tc.n * p.Kout + k_frag) * p.Hout + oh) * p.Wout + tc.ow0 + 2 * t;
#pragma unroll
      for (int j = 0; j < T::kCols / 8; ++j) {
        store_if(row + 8 * j, acc[4 * j + 2 * h] + b, ok && 8 * j + 2 * t < cols_left);
        store_if(row + 8 * j + 1, acc[4 * j + 2 * h + 1] + b, ok && 8 * j + 2 * t + 1 < cols_left);
      }
    }
  }
}

// out = conv3x3(in, wp) (+ bias). Persistent: the grid loops over tiles and the pipeline runs
// over the block's (tile, chunk) steps without a break, ordered by the full / empty mbarriers of
// each stage as the header's "Ordering" says (no __syncthreads per step).
__global__ void __launch_bounds__(T::kThreads, 1)
    conv3x3_wgmma_ss_kernel(float* __restrict__ out,         // (N, Kout, Hout, Wout)
                            const float* __restrict__ in,    // (N, Cin, Hin, Win)
                            const float* __restrict__ wp,    // (chunks, k_tiles, 9, 2, 64, 4)
                            const float* __restrict__ bias,  // (Kout) or null
                            SsParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float* smem = dynamic_smem<128>();
  const uint32_t smem_addr = shared_address(smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wg = warp / 4, wi = warp % 4;  // warpgroup (= output row of the tile), warp within it

  float acc[T::kAcc];
#pragma unroll
  for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.f;
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(smem) + T::kBarrierOffset);
  uint64_t* empty = full + T::kStages;
  // full: every thread's copies + the weights' expect_tx arrival.
  if (threadIdx.x == 0) tma::init_stage_ring(full, empty, T::kStages, T::kThreads + 1, T::kThreads / 32);
  __syncthreads();
  uint32_t full_parity = 0, empty_parity = 0;  // bit s: parity of stage s's next completion

  LoadCursor cur{blockIdx.x, 0, tile_coord<T>(blockIdx.x, p)};
  const auto load = [&](int stage) {  // the cursor's step into `stage`
    load_halo(smem + stage * T::kStageFloats, in, p, cur);
    load_weights(smem + stage * T::kStageFloats, &full[stage], wp, p, cur);
    cp_async_arrive_noinc(&full[stage]);
    advance<T>(cur, p);
  };
  // Steps 0 and 1 into stages 0 and 1 (the cursor runs past the block's last tile when its
  // steps are all loaded).
  for (int s = 0; s < 2 && cur.tile < p.tiles; ++s) load(s);
  int compute_stage = 0;
  int64_t step = 0;  // this block's steps so far
  // One (tile, chunk) step: wait for its stage, issue its 9 taps, then (while they and the
  // previous step's run) load the halo and weights of the step after next into the stage of step
  // - 2 once every warp has retired that, and retire the previous step.
  const auto run_step = [&](bool accumulate) {
    tma::mbar_wait(&full[compute_stage], (full_parity >> compute_stage) & 1);
    full_parity ^= 1u << compute_stage;
    wgmma::fence_proxy_async();  // the copies (generic proxy) before the wgmma's operand reads
    const uint32_t stage_addr = smem_addr + 4u * compute_stage * T::kStageFloats;
    static_assert(T::kStages == 4, "step s + 2 goes into the stage of step s - 2");
    const int previous_stage = (compute_stage + 3) % 4, load_stage = (compute_stage + 2) % 4;
    compute_stage = (compute_stage + 1) % 4;
    issue_stage(acc, stage_addr, stage_addr + 4u * T::kXStage, wg, accumulate);
    if (cur.tile < p.tiles) {
      if (step >= 2) {  // the stage's previous use was step - 2
        tma::mbar_wait(&empty[load_stage], (empty_parity >> load_stage) & 1);
        empty_parity ^= 1u << load_stage;
      }
      load(load_stage);
    }
    wgmma::wait<1>();  // step - 1 retired
    if (step >= 1) {
      __syncwarp();
      if (lane == 0) tma::mbar_arrive(&empty[previous_stage]);
    }
    ++step;
  };
  // The first chunk of a tile is peeled off the chunk loop so that wgmma are in flight on both
  // paths into the loop head (one loop over (tile, chunk) steps made ptxas drain the warpgroup on
  // the back edge in the register-A kernel, warning C7517).
#pragma unroll 1
  for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
    run_step(/*accumulate=*/false);  // scale-d = 0: the tile's accumulators start over
#pragma unroll 1
    for (int64_t chunk = 1; chunk < p.chunks; ++chunk) run_step(/*accumulate=*/true);
    wgmma::wait<0>();
#pragma unroll
    for (int i = 0; i < T::kAcc; ++i) wgmma::fence_operand(acc[i]);
    float* scratch = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(smem) + T::kScratchOffset) +
                     warp * T::kScratchFloats;
    store_tile(out, bias, p, tile_coord<T>(tile, p), acc, scratch, wg, wi, lane);
  }
  // Every copy issued was for a step this block ran (and waited for): nothing is outstanding.
#else
  __trap();  // conv3x3_wgmma_ss_applies is false for builds without sm_90a code
#endif
}

// wp (chunks, k_tiles, 9 taps, 2 k halves, kM, 4) from w (K, C, 3, 3), rounded to TF32: element
// (chunk, kt, tap, h, m, q) belongs to input channel ci = 8 chunk + 4 h + q and output channel
// o = kM kt + m, zero outside. Forward: w[o][ci][tap]. Grad-input (the convolution of dy with the
// flipped kernel, channels swapped: Cin = K, Kout = C): w[ci][o][8 - tap].
__global__ void prepare_ss_weights_kernel(float* __restrict__ wp, const float* __restrict__ w, int64_t K, int64_t C,
                                          int64_t chunks, int64_t k_tiles, bool for_grad_input) {
  const int64_t total = chunks * k_tiles * T::kWStage;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t q = i % 4, m = i / 4 % T::kM, h = i / (4 * T::kM) % 2, tap = i / T::kTapFloats % 9;
    const int64_t kt = i / T::kWStage % k_tiles, chunk = i / (T::kWStage * k_tiles);
    const int64_t ci = T::kChunk * chunk + 4 * h + q, o = kt * T::kM + m;
    float v = 0.f;
    if (!for_grad_input) {
      if (ci < C && o < K) v = w[(o * C + ci) * 9 + tap];
    } else {
      if (ci < K && o < C) v = w[(ci * C + o) * 9 + (8 - tap)];
    }
    wp[i] = __uint_as_float(tf32_round(v));
  }
}

// ---- planning (host) ----

inline SsParams forward_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo,
                               int64_t pad_h, int64_t pad_w) {
  SsParams p{};
  p.N = N, p.Cin = C, p.Hin = H, p.Win = W;
  p.Kout = K, p.Hout = Ho, p.Wout = Wo;
  p.pad_h = pad_h, p.pad_w = pad_w;
  return p;
}
// Grad-input: out = dx (N, C, H, W) from in = dy (N, K, Ho, Wo), padding 2 - pad.
inline SsParams grad_input_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo,
                                  int64_t pad_h, int64_t pad_w) {
  SsParams p{};
  p.N = N, p.Cin = K, p.Hin = Ho, p.Win = Wo;
  p.Kout = C, p.Hout = H, p.Wout = W;
  p.pad_h = 2 - pad_h, p.pad_w = 2 - pad_w;
  return p;
}

SsParams plan(SsParams p, bool out_aligned_8) {
  p.k_tiles = ceil_div(p.Kout, T::kM);
  p.chunks = ceil_div(p.Cin, T::kChunk);
  p.row_tiles = ceil_div(p.Hout, T::kRows);
  p.col_tiles = ceil_div(p.Wout, T::kCols);
  p.tiles = p.N * p.row_tiles * p.col_tiles * p.k_tiles;
  p.pairs = p.Wout % 2 == 0 && out_aligned_8;
  return p;
}

// ---- host ----

constexpr int kPrepThreads = 256;

void check_tensors(const char* op, const ConvShape& s, Precision precision, ExpectedTensors ts) {
  check_conv3x3_tensors(op, s, precision, conv3x3_wgmma_ss_applies, kNeedsTf32Wgmma, ts);
}

// out = conv3x3(in, w re-laid out): the forward pass, or (transposed weights) the input gradient.
void run(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, SsParams p, bool for_grad_input) {
  const int dev = out.device().index;
  set_device(dev);
  p = plan(p, reinterpret_cast<uintptr_t>(out.data<float>()) % 8 == 0);

  Tensor wp = Tensor::empty(Shape{p.chunks * p.k_tiles * T::kWStage}, {.dtype = DType::f32, .device = out.device()});
  prepare_ss_weights_kernel<<<grid_for(wp.numel(), kPrepThreads), kPrepThreads, 0, stream(dev)>>>(
      wp.data<float>(), w.data<float>(), w.size(0), w.size(1), p.chunks, p.k_tiles, for_grad_input);
  TG_LAUNCH_CHECK();

  allow_dynamic_smem(conv3x3_wgmma_ss_kernel, int(T::kSmemBytes));
  // One block per SM (the accumulators take half the registers, the stages most of the smem).
  const int64_t grid = std::min<int64_t>(p.tiles, sm_count(dev));
  conv3x3_wgmma_ss_kernel<<<static_cast<unsigned>(grid), T::kThreads, T::kSmemBytes, stream(dev)>>>(
      out.data<float>(), in.data<float>(), wp.data<float>(), bias, p);
  TG_LAUNCH_CHECK();
  // wp is freed stream-ordered, after the kernel that reads it.
}

}  // namespace

bool conv3x3_wgmma_ss_applies(const ConvShape& s, Device d, Precision precision) {
  return d.is_cuda() && precision == Precision::TF32 && conv3x3_applies(s, precision) && device_runs_wgmma(d.index);
}

void conv3x3_wgmma_ss_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                              const ConvShape& s, Precision precision) {
  check_tensors("conv3x3_wgmma_ss_forward", s, precision, {{&y, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}});
  if (b.defined()) check_tensors("conv3x3_wgmma_ss_forward", s, precision, {{&y, s.y_shape()}, {&b, Shape{s.K}}});
  run(y, x, w, b.defined() ? b.data<float>() : nullptr,
      forward_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
      /*for_grad_input=*/false);
}

void conv3x3_wgmma_ss_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                                 Precision precision) {
  check_tensors("conv3x3_wgmma_ss_grad_input", s, precision,
                {{&dx, s.x_shape()}, {&dy, s.y_shape()}, {&w, s.w_shape()}});
  run(dx, dy, w, nullptr, grad_input_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
      /*for_grad_input=*/true);
}

}  // namespace tg::cuda
