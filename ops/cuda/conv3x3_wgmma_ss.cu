// 3x3 stride-1 convolutions in NCHW on Hopper's warpgroup MMA with BOTH operands in shared memory
// (wgmma "SS", sm_90a), TF32: the forward pass and the input gradient (the same kernel on
// flipped, transposed weights). The warps only copy and issue wgmma: no operand passes through
// registers (the register-A kernel, conv3x3_wgmma.cu, spent its issue slots and latency on the
// A-fragment LDS and rounding: tensor pipe 47%, 2.74 ms for workload A on an H200).
//
// Floor, workload A (x 8x64x512x1024, w 128x64x3x3, y 8x128x510x1022, pad 0), per pass:
//   2 * 4.17M pixels * 128 * 576 = 615 GFLOP; x 1.07 GB + y 2.13 GB = 0.75 ms at 4.3 TB/s (H200).
//   TF32 dense wgmma peak ~495 TFLOP/s (1024 FMA/clk/SM): 1.24 ms. Target: forward <= 2.06 ms
//   (298 TFLOP/s = 60% of the peak). Compute-bound: the design is about feeding the tensor cores.
//
// GEMM view (transposed against conv3x3_wgmma.cu): M = output channels (the weights are A),
// N = output pixels (the input halo is B), reduction = input channels x 9 taps; one k8 step = one
// tap x 8 input channels.
//
// Block tile (256 threads = 2 warpgroups, one block per SM, persistent over tiles): 64 output
// channels x 2 output rows x 256 columns; warpgroup w owns output row w: one
// wgmma.mma_async.m64n256k8.f32.tf32.tf32 per tap (128 f32 accumulators per thread).
// Per pipeline stage (8 input channels; 4 stages, loads 2 steps ahead):
//   halo (B)   [channel quad (2)][halo row (4)][halo column (264, 258 used)][4 channels] 33 KB
//   weights (A)[tap (9)][k half (2)][output channel (64)][4 input channels]              18 KB
//   = 51.8 KB per stage, 207 KB for 4; + 18 KB of staged-store scratch (8 warps x 8 x 72 floats) = 225 KB (of 227 KB).
// Tiles of 128 output channels x 2 rows x 128 columns (4 warpgroups: the halo transposed once per
// 128 channels) and 64 x 4 x 128 (6 halo rows per 4 output rows) were measured slower on an H200
// (workload A forward 2.92 / 2.90 ms vs 2.71): m64n128 wgmma read the weights twice as often and
// the weights stage doubled; see bench/journal/notes_conv3x3.md.
//
// Operands of the wgmma of tap (r, s), warpgroup w (both K-major, no swizzle; ops/cuda/arch/wgmma.cuh
// states the layout: element (row, k) at start + (row / 8) SBO + (row % 8) 16 + (k / 4) LBO + (k % 4) 4):
//   A = weights: start = weights + tap * 2 KB, rows = output channels m: 16-byte rows
//       [m][4 channels], SBO = 128 B (next 8 output channels), LBO = 64 * 16 = 1 KB (channels
//       4..7 of the chunk). The pre-pass writes exactly this image per (chunk, channel tile), rounded
//       to TF32, so a stage's weights are one contiguous block: one bulk copy.
//   B = halo: rows = output pixels n = column 0..255 of output row w; pixel n of tap (r, s)
//       reads halo (row w + r, column n + s), whose 4 channels are one 16-byte row.
//       start = halo + ((w + r) * 264 + s) * 16 B, SBO = 128 B (8 consecutive columns), LBO =
//       4 * 264 * 16 B = 16.5 KB (the second channel quad). Every tap shift is just another start
//       address (16-byte aligned); no data moves.
//   D: thread (warp wi of the warpgroup, g = lane / 4, t = lane % 4) holds output channel
//       k0 + 16 wi + g + 8 h and columns 8 j + 2 t + e in acc[4 j + 2 h + e] (j < 32).
//
// Halo fill: 4-byte cp.async, each float to its transposed slot (see load_halo; one instruction
// per copy where a warp's halo row lies inside the input). Weights: one TMA bulk copy of the
// stage's 18 KB image per stage, issued by thread 0, landing on the stage's mbarrier (was 4.5
// 16-byte cp.async per thread: forward 2.35 -> 2.31-2.32 ms on an H200, ncu, alternated twice).
// (A fill by 16-byte loads staged through registers,
// transposed, and stored a step later was measured slower on an H200, 3.375 vs 2.672 ms: the
// synchronous loads stopped overlapping the wgmma. It was removed; git history has it.)
//
// Where the time goes (H200, workload A forward, variants with parts switched off; notes_conv3x3.md
// round 6): wgmma alone (no fills, no stores) 1.28 ms (~480 TFLOP/s: the no-swizzle layout and
// the tap offsets cost nothing), + fills 1.93 ms, + stores from the fragments 2.71 ms. The stores
// run while the tensor cores idle (the accumulators are the next tile's); staged (store_tile)
// they take the forward to 2.32-2.41 ms alone, 2.56 ms inside the full benchmark run. Every step
// as two m64n128 halves, so that each half's stores overlap the other half's wgmma, was 7% slower
// and the overlap itself gained nothing (notes_conv3x3.md, session 7): what the stores compete
// with is the fills and loads, not idle tensor time.
//
// TF32 truncation: the halo holds the raw floats; the tensor core reads their top 19 bits, i.e.
// truncates x (relative error in [0, 2^-10), rms ~4.2e-4 for log-uniform mantissas) while the
// weights are rounded once by the pre-pass (rms ~2.1e-4). With random signs the output's rel. L2
// error is ~ the products' rms relative error, independent of the reduction length (576 for
// C = 64): sqrt(4.2^2 + 2.1^2) e-4 ~ 4.6e-4 < 1e-3 (the TF32 tolerance). cuBLAS / cuDNN TF32 treat
// activations the same way. FP32 mode is not offered (conv3x3_wgmma_ss_applies says false).
//
// Ordering (PTX ISA, wgmma, mbarrier and the async proxy), per stage two mbarriers:
//   - full[stage]: every thread, after issuing its copies into the stage, executes
//     cp.async.mbarrier.arrive.noinc (the arrival happens when those copies have landed);
//     thread 0 also announces the weights' bytes (expect_tx). Count: 256 + 1.
//   - empty[stage]: lane 0 of every warp arrives after the warp's wgmma.wait_group retired the
//     step that read the stage. Count: 8.
//   - step s (stage s % 4): wait full -> fence.proxy.async -> wgmma.fence -> 9 wgmma -> commit
//     -> wait empty of stage (s + 2) % 4 (step s - 2 retired by every warp; first use: no wait)
//     -> copies of step s + 2 into it, arrive on its full -> wgmma.wait_group 1 (retires step
//     s - 1) -> arrive on empty of stage (s - 1) % 4. The copies are issued behind the wgmma so
//     the tensor cores never wait for them, and no warp waits for another to reach its step:
//     a __syncthreads per step (until session 10) cost 6-7% of workload A's forward.
//   - tile end: wait_group 0, accumulators re-bound (fence_operand), staged through the warp's
//     own scratch (outside the stages) and stored. (Until session 10 the scratch lay in stage
//     (s + 3) % 4, which the other warpgroup's wgmma of step s - 1 may still have been reading.)
//     The next tile's first wgmma has scale-d = 0 (no zeroing) and follows a wgmma.fence (the
//     epilogue read them).
//
// Shared-memory traffic per stage (9 taps; 2 x m64n256k8 per tap = 2304 tensor clocks at peak):
//   operand reads 18 x (A 2 KB + B 8 KB) = 180 KB = 1440 wavefronts (B is read once per wgmma and
//   serves all 4 warps' M rows), fills 51.8 KB = 405 wavefronts: 1845 of 2304 wavefront-clocks
//   (80% of the port at the tensor peak; the register-A kernel needed 93%).
// L2 -> SM: 51.8 KB per 2304 clocks at peak, ~3.2 TB/s over 132 SMs at 300 TFLOP/s (same order
// as the register-A kernel; the weights are 35% of it).
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
#include "ops/cuda/conv3x3.h"
#include "ops/cuda/conv3x3_staging.cuh"
#include "ops/cuda/conv3x3_wgmma_ss.h"

namespace tg::cuda {
namespace {

// ---- primitives: those of ops/cuda/arch/ and conv3x3_staging.cuh ----

// ---- kernels (BEGIN KERNELS: everything down to END KERNELS uses only the primitives above) ----

// The block tile: 2 warpgroups (256 threads); warpgroup wg computes the tile's 64 output channels
// in output row wg, 256 columns: one m64n256k8 wgmma per tap.
struct SsTile {
  static constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups;
  static constexpr int kRows = kWarpgroups;  // output rows per tile: one per warpgroup
  static constexpr int kCols = 256;          // output columns per tile: the wgmma N
  static constexpr int kM = 64;              // output channels per tile: the wgmma M
  static constexpr int kOutChannels = kM;    // (conv3x3_staging.cuh walks tiles by it)
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
    // the address; ncu put ~4% of workload A's forward stall samples on its address registers).
    // Decided per warp: lanes that took different paths slowed the grad-input kernel by 27%.
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
// quarter of the L2 write requests. Stored from the fragments, the epilogue took ~0.8 of the
// 2.7 ms forward of workload A on an H200 (tensor cores idle meanwhile).
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
// each stage as the header's "Ordering" says (with a __syncthreads per step instead, workload A's
// forward took 2.41-2.47 ms against 2.26-2.29: H100, alternated in one process).
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
  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      tma::mbar_init(&full[s], T::kThreads + 1);  // every thread's copies + the weights' expect_tx arrival
      tma::mbar_init(&empty[s], T::kThreads / 32);
    }
    tma::mbar_init_fence();
  }
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

// ---- END KERNELS ----

constexpr int kPrepThreads = 256;

void check_tensors(const char* op, const ConvShape& s, ExpectedTensors ts) {
  check_conv3x3_tensors(op, s, conv3x3_wgmma_ss_applies, kNeedsTf32Wgmma, ts);
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

  TG_CUDA_CHECK(cudaFuncSetAttribute(conv3x3_wgmma_ss_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(T::kSmemBytes)));
  // One block per SM (the accumulators take half the registers, the stages most of the smem).
  const int64_t grid = std::min<int64_t>(p.tiles, sm_count(dev));
  conv3x3_wgmma_ss_kernel<<<static_cast<unsigned>(grid), T::kThreads, T::kSmemBytes, stream(dev)>>>(
      out.data<float>(), in.data<float>(), wp.data<float>(), bias, p);
  TG_LAUNCH_CHECK();
  // wp is freed stream-ordered, after the kernel that reads it.
}

}  // namespace

bool conv3x3_wgmma_ss_applies(const ConvShape& s, Device d) {
  return d.is_cuda() && precision() == Precision::TF32 && conv3x3_applies(s) && device_runs_wgmma(d.index);
}

void conv3x3_wgmma_ss_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                              const ConvShape& s) {
  check_tensors("conv3x3_wgmma_ss_forward", s, {{&y, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}});
  if (b.defined()) check_tensors("conv3x3_wgmma_ss_forward", s, {{&y, s.y_shape()}, {&b, Shape{s.K}}});
  run(y, x, w, b.defined() ? b.data<float>() : nullptr,
      forward_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
      /*for_grad_input=*/false);
}

void conv3x3_wgmma_ss_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s) {
  check_tensors("conv3x3_wgmma_ss_grad_input", s, {{&dx, s.x_shape()}, {&dy, s.y_shape()}, {&w, s.w_shape()}});
  run(dx, dy, w, nullptr, grad_input_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
      /*for_grad_input=*/true);
}

}  // namespace tg::cuda
