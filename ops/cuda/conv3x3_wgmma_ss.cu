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
// Block tiles (one block per SM, persistent over tiles), kMGroups x kRowGroups warpgroups; warpgroup
// (mg, rg) owns output channels 64 mg.. of the tile in output row rg: one wgmma.mma_async.m64nNk8
// .f32.tf32.tf32 per tap (N / 2 f32 accumulators per thread). Per pipeline stage (8 input
// channels; 4 stages, loads 2 steps ahead):
//   128 x 2 x 128 (more than 64 output channels, e.g. workload A's forward): 4 warpgroups (512
//     threads), 128 output channels x 2 rows x 128 columns, N = 128 (64 accumulators): halo
//     2 quads x 4 rows x 136 columns x 16 B = 17 KB, weights 9 x 2 x 128 x 16 B = 36 KB;
//   64 x 4 x 128 (<= 64 output channels, e.g. workload A's input gradient): 4 warpgroups, 64
//     output channels x 4 rows x 128 columns, N = 128: halo 2 x 6 x 136 x 16 B = 26 KB, weights
//     18 KB;
//   64 x 2 x 256 (the first tile, kept for comparison): 2 warpgroups (256 threads), 64 x 2 x 256,
//     N = 256 (128 accumulators): halo 2 x 4 x 264 x 16 B = 33 KB, weights 18 KB.
//   All do 2304 tensor clocks of work per stage at the peak rate. The 4-byte halo copies are the
//   expensive part of a stage (64 x 2 x 256 on an H200, workload A's forward: 2.67-2.83 ms; ncu:
//   long_scoreboard 2.00, lg_throttle 1.34 stalls per instruction, 8 warps per SM, 0.30 eligible):
//   128 x 2 x 128 transposes each halo once for 128 output channels instead of twice (half the
//   copies per output), 64 x 4 x 128 needs 6 halo rows for 4 output rows instead of 4 for 2
//   (-23%), and both have 16 warps to share the fill and hide latency.
//   Halo layout [channel quad (2)][halo row][halo column][4 channels], weights
//   [tap (9)][k half (2)][output channel (kM)][4 input channels].
//
// Operands of the wgmma of tap (r, s), warpgroup (mg, rg) (both K-major, no swizzle; ops/cuda/wgmma.cuh
// states the layout: element (row, k) at start + (row / 8) SBO + (row % 8) 16 + (k / 4) LBO + (k % 4) 4):
//   A = weights: start = weights + tap * kM * 32 B + mg * 1 KB, rows = output channels m: 16-byte
//       rows [m][4 channels], SBO = 128 B (next 8 output channels), LBO = kM * 16 B (channels
//       4..7 of the chunk). The pre-pass writes exactly this image per (chunk, channel tile), rounded
//       to TF32, so a stage's weights are one contiguous 16-byte cp.async run.
//   B = halo: rows = output pixels n = column 0..N-1 of output row rg; pixel n of tap (r, s)
//       reads halo (row rg + r, column n + s), whose 4 channels are one 16-byte row.
//       start = halo + ((rg + r) * kCopyCols + s) * 16 B, SBO = 128 B (8 consecutive columns),
//       LBO = one channel quad of the halo. Every tap shift is just another start address
//       (16-byte aligned); no data moves.
//   D: thread (warp wi of the warpgroup, g = lane / 4, t = lane % 4) holds output channel
//       k0 + 64 mg + 16 wi + g + 8 h and columns 8 j + 2 t + e in acc[4 j + 2 h + e] (j < N / 8).
//
// Halo fill: 4-byte cp.async, each float to its transposed slot; zero-filled (src-size 0) for
// padding, borders and channels past Cin. A (channel quad, halo row) is filled by 1 warp (2 in
// 128 x 2 x 128; 64 x 4 x 128 leaves 4 of its 16 warps out): lane (c = lane % 4, p = lane / 4) takes channel 4 quad + c, columns
// p + 8 i. One copy instruction writes 8 pixels x 4 channels = 128 contiguous bytes of shared
// memory and reads 4 rows x 32 bytes of global memory. Weights: 4.5 x 16-byte cp.async per stage
// and thread. (A fill by 16-byte loads staged through registers, transposed, and stored a step
// later was measured slower on an H200, 3.375 vs 2.672 ms: the synchronous loads stopped
// overlapping the wgmma. It was removed; git history has it.)
//
// TF32 truncation: the halo holds the raw floats; the tensor core reads their top 19 bits, i.e.
// truncates x (relative error in [0, 2^-10), rms ~4.2e-4 for log-uniform mantissas) while the
// weights are rounded once by the pre-pass (rms ~2.1e-4). With random signs the output's rel. L2
// error is ~ the products' rms relative error, independent of the reduction length (576 for
// C = 64): sqrt(4.2^2 + 2.1^2) e-4 ~ 4.6e-4 < 1e-3 (the TF32 tolerance). cuBLAS / cuDNN TF32 treat
// activations the same way. FP32 mode is not offered (conv3x3_wgmma_ss_applies says false).
//
// Ordering (PTX ISA, wgmma and the async proxy):
//   - step s: cp.async.wait_group 1 (this thread's copies of step s landed) -> fence.proxy.async
//     -> __syncthreads (everyone's landed and are visible to wgmma) -> wgmma.fence -> 9 wgmma ->
//     commit -> copies of step s + 2 into stage (s + 2) % 4 -> wgmma.wait_group 1 (retires step
//     s - 1). The copies are issued behind the wgmma so the tensor cores never wait for them.
//   - stage (s + 2) % 4 was last read by step s - 2, which every warpgroup retired (its wait at
//     the end of step s - 1) before the barrier of step s: refilled only after every wgmma
//     reading it retired.
//   - tile end: wait_group 0, accumulators re-bound (fence_operand), stored; the next tile's first
//     wgmma has scale-d = 0 (no zeroing) and follows a wgmma.fence (the epilogue read them).
//
// Shared-memory traffic per stage (2304 tensor clocks at peak): 64 x 2 x 256 reads 18 x (A 2 KB +
//   B 8 KB) = 180 KB of operands (B is read once per wgmma and serves all 4 warps' M rows) and
//   fills 52 KB: 1848 of 2304 wavefront-clocks (80% of the port at the tensor peak). The N = 128
//   tiles read 36 x (2 + 4 KB) = 216 KB and fill 44-53 KB: 2080-2150 (90-93% at the peak, ~56% at
//   the 2.06 ms target).
// L2 -> SM: 44-53 KB per 2304 clocks at peak, ~3 TB/s over 132 SMs at 300 TFLOP/s; the weights
// are 35-68% of it (mostly L2 hits: 295 KB in all).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/conv3x3.h"
#include "ops/cuda/conv3x3_staging.cuh"
#include "ops/cuda/conv3x3_wgmma_ss.h"
#include "ops/cuda/hopper.h"
#include "ops/cuda/wgmma.cuh"

namespace tg::cuda {
namespace {

// ---- primitives (besides ops/cuda/wgmma.cuh and conv3x3_staging.cuh) ----

// (ptr[0], ptr[1]) = (v0, v1) if pred (ptr 8-byte aligned), predicated like store_if.
__device__ __forceinline__ void store2_if(float* ptr, float v0, float v1, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p st.global.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(ptr), "f"(v0),
      "f"(v1), "r"(static_cast<int>(pred))
      : "memory");
}

__device__ __forceinline__ float* dynamic_smem() {
  extern __shared__ __align__(128) float smem_buffer[];
  return smem_buffer;
}

// ---- kernels (BEGIN KERNELS: everything down to END KERNELS uses only the primitives above) ----

// A block tile: kMGroups x kRowGroups warpgroups; warpgroup (mg, rg) computes output channels
// [64 mg, 64 mg + 64) of the tile x output row rg x kCols columns (one m64nNk8 wgmma per tap).
template <int kMGroups_, int kRowGroups_, int kCols_>
struct SsTile {
  static constexpr int kMGroups = kMGroups_, kRowGroups = kRowGroups_;
  static constexpr int kWarpgroups = kMGroups * kRowGroups, kThreads = 128 * kWarpgroups;
  static constexpr int kRows = kRowGroups;   // output rows per tile
  static constexpr int kCols = kCols_;       // output columns per tile: the wgmma N
  static constexpr int kM = 64 * kMGroups;   // output channels per tile
  static constexpr int kOutChannels = kM;    // (conv3x3_staging.cuh walks tiles by it)
  static constexpr int kAcc = kCols / 2;     // f32 accumulators per thread
  static constexpr int kChunk = 8;           // input channels per stage: one k8 step per tap
  static constexpr int kStages = 4;          // a stage is refilled 2 steps after its use
  static constexpr int kHaloRows = kRows + 2;
  static constexpr int kHaloCols = kCols + 2;                 // columns the taps read
  static constexpr int kCopyGroups = ceil_div(kHaloCols, 8);  // 8-column copies per halo row
  static constexpr int kCopyCols = 8 * kCopyGroups;           // halo row stride in 16-byte pixels
  static constexpr int kQuadFloats = kHaloRows * kCopyCols * 4;  // one channel quad of the halo
  static constexpr int kXStage = 2 * kQuadFloats;                 // halo floats per stage
  static constexpr int kTapFloats = 2 * kM * 4;                   // A image of one tap
  static constexpr int kWStage = 9 * kTapFloats;
  static constexpr int kStageFloats = kXStage + kWStage;
  static constexpr uint32_t kALbo = kM * 16, kASbo = 128;            // weights: next channel quad, next 8 rows
  static constexpr uint32_t kBLbo = kQuadFloats * 4, kBSbo = 128;    // halo: next channel quad, next 8 pixels
  static constexpr size_t kSmemBytes = sizeof(float) * kStages * kStageFloats;
  // Halo fill: a fill unit = one (channel quad, halo row); kWarpsPerUnit warps share one, each
  // taking kUnitCopies consecutive 8-column copies; warps past kFillWarps fill no halo.
  static constexpr int kFillUnits = 2 * kHaloRows;
  static constexpr int kWarpsPerUnit = kThreads / 32 / kFillUnits;
  static constexpr int kFillWarps = kFillUnits * kWarpsPerUnit;
  static constexpr int kUnitCopies = ceil_div(kCopyGroups, kWarpsPerUnit);
  static_assert(kWarpsPerUnit >= 1, "a warp per (quad, halo row) at least");
  static_assert(kXStage % 32 == 0 && kStageFloats % 32 == 0, "operand images on 128-byte boundaries");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
};
// The tiles (output channels x rows x columns). 128 x 2 x 128 (4 warpgroups): more than 64 output
// channels, e.g. workload A's forward; the halo is transposed once for 128 output channels, and 16
// warps share the fill. 64 x 4 x 128 (4 warpgroups): up to 64 output channels, e.g. workload A's
// input gradient; 6 halo rows for 4 output rows. 64 x 2 x 256 (2 warpgroups): the first tile
// (workload A's forward on an H200: 2.67-2.83 ms; ncu: long_scoreboard 2.00, lg_throttle 1.34
// stalls per instruction, 8 warps per SM, 0.30 eligible), kept for comparison.
using SsTile128x2x128 = SsTile<2, 2, 128>;
using SsTile64x4x128 = SsTile<1, 4, 128>;
using SsTile64x2x256 = SsTile<1, 2, 256>;

// One implicit-GEMM pass: out (N, Kout, Hout, Wout) = conv3x3(in (N, Cin, Hin, Win), prepared w)
// with input row = output row + tap row - pad_h (likewise columns); pads may be negative.
struct SsParams {
  int64_t N, Cin, Hin, Win;
  int64_t Kout, Hout, Wout;
  int64_t pad_h, pad_w;
  int64_t chunks;  // ceil(Cin / 8)
  int64_t row_tiles, col_tiles, k_tiles, tiles;
  bool pairs;  // Wout even and out 8-byte aligned: two adjacent columns per store
  int stagger_ns, stagger_phases;  // EXPERIMENT
};

// Issues the 4-byte copies of the cursor's (tile, chunk) halo into `stage`, each float to its
// transposed slot; zero-filled (src-size 0) for padding, borders and channels past Cin. This
// warp: one channel quad x one halo row, kUnitCopies copies of 8 columns from column col0; lane
// (c = lane % 4, px = lane / 4) takes channel 4 quad + c, columns col0 + 8 i. One copy
// instruction writes 8 pixels x 4 channels = 128 contiguous bytes of shared memory and reads
// 4 rows x 32 bytes of global memory.
template <class T>
__device__ __forceinline__ void load_halo(float* stage, const float* __restrict__ in, const SsParams& p,
                                          const LoadCursor& cur) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (T::kFillWarps < T::kThreads / 32 && warp >= T::kFillWarps) return;
  const int unit = warp / T::kWarpsPerUnit, part = warp % T::kWarpsPerUnit;
  const int quad = unit / T::kHaloRows, hrow = unit % T::kHaloRows;
  const int c = lane % 4, px = lane / 4;
  const int col0 = 8 * T::kUnitCopies * part + px;  // halo column of copy 0
  const int64_t ci = cur.chunk * T::kChunk + 4 * quad + c;
  const int64_t ih = cur.tc.oh0 - p.pad_h + hrow;
  const int64_t iw_first = cur.tc.ow0 - p.pad_w + col0;  // input column of copy 0
  const bool row_ok = ci < p.Cin && ih >= 0 && ih < p.Hin;
  // Copy i reads column iw_first + 8 i: inside the row for 8 i in [col_lo, col_hi) (32-bit
  // compares against constants in the unrolled loop).
  const int col_lo = static_cast<int>(clamp_i64(-iw_first, -8, 8 * T::kUnitCopies));
  const int col_hi = static_cast<int>(clamp_i64(p.Win - iw_first, -8, 8 * T::kUnitCopies));
  // (ci, ih, iw_first); only read through where the copy is valid.
  const float* row = in + (row_ok ? ((cur.tc.n * p.Cin + ci) * p.Hin + ih) * p.Win + iw_first : 0);
  float* dst = stage + ((quad * T::kHaloRows + hrow) * T::kCopyCols + col0) * 4 + c;
#pragma unroll
  for (int i = 0; i < T::kUnitCopies; ++i) {
    // Columns no tap reads (and the next warp's); the first test is a compile-time bound on col0.
    if (8 * T::kUnitCopies * (T::kWarpsPerUnit - 1) + 8 * i + 8 > T::kHaloCols && col0 + 8 * i >= T::kHaloCols) break;
    const bool ok = row_ok && 8 * i >= col_lo && 8 * i < col_hi;
    cp_async<4>(dst + 32 * i, ok ? row + 8 * i : in, ok);
  }
}

// Issues the copies of the cursor's chunk of weight images into `stage` (one contiguous block of
// the prepared weights, laid out as in shared memory).
template <class T>
__device__ __forceinline__ void load_weights(float* stage, const float* __restrict__ wp, const SsParams& p,
                                             const LoadCursor& cur) {
  const float* src = wp + (cur.chunk * p.k_tiles + cur.tc.k0 / T::kM) * T::kWStage;
  float* wdst = stage + T::kXStage;
  constexpr int kVectors = T::kWStage / 4;
#pragma unroll
  for (int i = 0; i < (kVectors + T::kThreads - 1) / T::kThreads; ++i) {
    const int v = threadIdx.x + i * T::kThreads;
    // Only the last round can run past the image (threadIdx.x < kThreads): one test, not one per round.
    if (kVectors % T::kThreads != 0 && i == kVectors / T::kThreads && v >= kVectors) break;
    cp_async<16>(wdst + 4 * v, src + 4 * v, true);
  }
}

// Issues the 9 taps of one stage for this warpgroup (output channels 64 mg.., output row rg of
// the tile), one m64nNk8 each, as one commit group. x_addr / w_addr: shared addresses of the
// stage's halo and weights. accumulate: false for the first stage of a tile (its first wgmma
// overwrites the accumulators).
template <class T>
__device__ __forceinline__ void issue_stage(float (&acc)[T::kAcc], uint32_t x_addr, uint32_t w_addr, int mg, int rg,
                                            bool accumulate) {
  const uint64_t desc_a = wgmma::kmajor_desc(w_addr + 64u * 16u * mg, T::kALbo, T::kASbo);
  const uint64_t desc_b = wgmma::kmajor_desc(x_addr + 16u * rg * T::kCopyCols, T::kBLbo, T::kBSbo);
  wgmma::fence();  // the accumulators were read (epilogue) or written by this thread before
#pragma unroll
  for (int tap = 0; tap < 9; ++tap) {
    const int r = tap / 3, s = tap % 3;
    wgmma::mma_ss_tf32<T::kCols>(acc, wgmma::desc_advance(desc_a, tap * T::kTapFloats * 4),
                                 wgmma::desc_advance(desc_b, 16 * (r * T::kCopyCols + s)), accumulate || tap > 0);
  }
  wgmma::commit();
}

// Writes a finished tile (+ bias). This thread holds output channels k0 + 64 mg + 16 wi + g + 8 h
// of output row oh0 + rg, columns ow0 + 8 j + 2 t + e in acc[4 j + 2 h + e]. Addresses are formed
// for rows, channels or columns outside the output too, and never stored to.
template <class T>
__device__ __forceinline__ void store_tile(float* __restrict__ out, const float* __restrict__ bias,
                                           const SsParams& p, const TileCoord& tc, const float (&acc)[T::kAcc],
                                           int mg, int rg, int wi, int g, int t) {
  const int64_t oh = tc.oh0 + rg;
  const int64_t cols_left64 = p.Wout - tc.ow0 - 2 * t;  // this thread's column 8 j is inside if 8 j < this
  const int cols_left = static_cast<int>(cols_left64 < T::kCols ? cols_left64 : T::kCols);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t k = tc.k0 + 64 * mg + 16 * wi + g + 8 * h;
    const bool ok = k < p.Kout && oh < p.Hout;
    const float b = bias && k < p.Kout ? bias[k] : 0.f;
    float* row = out + ((tc.n * p.Kout + k) * p.Hout + oh) * p.Wout + tc.ow0 + 2 * t;
    if (p.pairs) {
#pragma unroll
      for (int j = 0; j < T::kCols / 8; ++j)
        store2_if(row + 8 * j, acc[4 * j + 2 * h] + b, acc[4 * j + 2 * h + 1] + b, ok && 8 * j < cols_left);
    } else {
#pragma unroll
      for (int j = 0; j < T::kCols / 8; ++j) {
        store_if(row + 8 * j, acc[4 * j + 2 * h] + b, ok && 8 * j < cols_left);
        store_if(row + 8 * j + 1, acc[4 * j + 2 * h + 1] + b, ok && 8 * j + 1 < cols_left);
      }
    }
  }
}

// out = conv3x3(in, wp) (+ bias). Persistent: the grid loops over tiles and the pipeline runs
// over the block's (tile, chunk) steps without a break.
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    conv3x3_wgmma_ss_kernel(float* __restrict__ out,         // (N, Kout, Hout, Wout)
                            const float* __restrict__ in,    // (N, Cin, Hin, Win)
                            const float* __restrict__ wp,    // (chunks, k_tiles, 9, 2, kM, 4)
                            const float* __restrict__ bias,  // (Kout) or null
                            SsParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float* smem = dynamic_smem();
  const uint32_t smem_addr = wgmma::shared_address(smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int wg = warp / 4, wi = warp % 4;  // warpgroup, warp within it
  const int rg = wg % T::kRowGroups, mg = wg / T::kRowGroups;

  float acc[T::kAcc];
#pragma unroll
  for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.f;

  if (p.stagger_ns > 0)
    for (int i = 0; i < static_cast<int>(blockIdx.x) % p.stagger_phases; ++i) __nanosleep(p.stagger_ns);
  LoadCursor cur{blockIdx.x, 0, tile_coord<T>(blockIdx.x, p)};
  // Steps 0 and 1 into stages 0 and 1.
#pragma unroll 1
  for (int s = 0; s < 2; ++s) {
    if (cur.tile < p.tiles) {  // the cursor runs past the block's last tile when its steps are all loaded
      load_halo<T>(smem + s * T::kStageFloats, in, p, cur);
      load_weights<T>(smem + s * T::kStageFloats, wp, p, cur);
      advance<T>(cur, p);
    }
    cp_async_commit();
  }
  int load_stage = 2, compute_stage = 0;
  // One (tile, chunk) step: publish its stage, issue its 9 taps, then (while they and the
  // previous step's run) load the halo and weights of the step after next (into the stage used
  // 2 steps ago), and retire the previous step.
  const auto run_step = [&](bool accumulate) {
    cp_async_wait<1>();          // this thread's copies of this step have landed (one newer group may be open)
    wgmma::fence_proxy_async();  // ... and are visible to the wgmma's operand reads
    __syncthreads();             // everyone's are; stage (step + 2) % 4 was last read by step - 2: retired
    const uint32_t stage_addr = smem_addr + 4u * compute_stage * T::kStageFloats;
    compute_stage = compute_stage == T::kStages - 1 ? 0 : compute_stage + 1;
    issue_stage<T>(acc, stage_addr, stage_addr + 4u * T::kXStage, mg, rg, accumulate);
    if (cur.tile < p.tiles) {
      load_halo<T>(smem + load_stage * T::kStageFloats, in, p, cur);
      load_weights<T>(smem + load_stage * T::kStageFloats, wp, p, cur);
      advance<T>(cur, p);
    }
    cp_async_commit();
    load_stage = load_stage == T::kStages - 1 ? 0 : load_stage + 1;
    wgmma::wait<1>();  // step - 1 retired: its stage may be refilled after the next barrier
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
    store_tile<T>(out, bias, p, tile_coord<T>(tile, p), acc, mg, rg, wi, g, t);
  }
  cp_async_wait<0>();  // nothing outstanding at exit (the last groups are empty)
#else
  __trap();  // conv3x3_wgmma_ss_applies is false for builds without sm_90a code
#endif
}

// wp (chunks, k_tiles, 9 taps, 2 k halves, kM, 4) from w (K, C, 3, 3), rounded to TF32: element
// (chunk, kt, tap, h, m, q) belongs to input channel ci = 8 chunk + 4 h + q and output channel
// o = kM kt + m, zero outside. Forward: w[o][ci][tap]. Grad-input (the convolution of dy with the
// flipped kernel, channels swapped: Cin = K, Kout = C): w[ci][o][8 - tap].
template <class T>
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

template <class T>
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

void check_tensors(const char* op, const ConvShape& s, std::initializer_list<std::pair<const Tensor*, Shape>> ts) {
  for (const auto& [t, shape] : ts) TG_CHECK(t->defined(), op, ": undefined tensor where ", shape, " was expected");
  const Device d = ts.begin()->first->device();
  TG_CHECK(conv3x3_wgmma_ss_applies(s, d), op,
           ": needs a 3x3 stride-1 NCHW 2-D convolution in TF32 mode on a compute capability 9.0 GPU with sm_90a "
           "code; got x ",
           s.x_shape(), ", w ", s.w_shape(), " on ", d);
  for (const auto& [t, shape] : ts) {
    TG_CHECK(t->dtype() == DType::f32, op, ": expected f32 tensors, got ", describe(*t));
    TG_CHECK(t->device() == d, op, ": expected every tensor on one GPU (", d, "), got ", describe(*t));
    TG_CHECK(t->shape() == shape, op, ": tensor ", describe(*t), " does not match the problem x ", s.x_shape(),
             ", w ", s.w_shape(), " -> y ", s.y_shape(), ": expected ", shape);
  }
}

// out = conv3x3(in, w re-laid out) with block tile T: the forward pass, or (transposed weights)
// the input gradient.
template <class T>
void run_tile(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, SsParams p,
              bool for_grad_input) {
  const int dev = out.device().index;
  set_device(dev);
  p = plan<T>(p, reinterpret_cast<uintptr_t>(out.data<float>()) % 8 == 0);
  if (const char* e = std::getenv("TG_SS_STAGGER_NS")) p.stagger_ns = std::atoi(e);
  if (const char* e = std::getenv("TG_SS_STAGGER_PHASES")) p.stagger_phases = std::atoi(e);

  Tensor wp = Tensor::empty(Shape{p.chunks * p.k_tiles * T::kWStage}, {.dtype = DType::f32, .device = out.device()});
  prepare_ss_weights_kernel<T><<<grid_for(wp.numel(), kPrepThreads), kPrepThreads, 0, stream(dev)>>>(
      wp.data<float>(), w.data<float>(), w.size(0), w.size(1), p.chunks, p.k_tiles, for_grad_input);
  TG_LAUNCH_CHECK();

  auto* kernel = conv3x3_wgmma_ss_kernel<T>;
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(T::kSmemBytes)));
  // One block per SM (the accumulators take half the registers, the stages most of the smem).
  const int64_t grid = std::min<int64_t>(p.tiles, sm_count(dev));
  kernel<<<static_cast<unsigned>(grid), T::kThreads, T::kSmemBytes, stream(dev)>>>(out.data<float>(), in.data<float>(),
                                                                                  wp.data<float>(), bias, p);
  TG_LAUNCH_CHECK();
  // wp is freed stream-ordered, after the kernel that reads it.
}

// More than 64 output channels take the 128 x 2 x 128 tile, up to 64 the 64 x 4 x 128 one, unless
// TG_CONV3X3_SS_TILE names one (128x2x128, 64x4x128, 64x2x256: to measure them against each other).
// Read at every launch (one getenv next to a ~ms kernel) so that a test can switch it.
void run(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, SsParams p, bool for_grad_input) {
  const char* e = std::getenv("TG_CONV3X3_SS_TILE");
  const std::string_view tile = e != nullptr ? e : p.Kout > 64 ? "128x2x128" : "64x4x128";
  if (tile == "128x2x128")
    run_tile<SsTile128x2x128>(out, in, w, bias, p, for_grad_input);
  else if (tile == "64x4x128")
    run_tile<SsTile64x4x128>(out, in, w, bias, p, for_grad_input);
  else if (tile == "64x2x256")
    run_tile<SsTile64x2x256>(out, in, w, bias, p, for_grad_input);
  else
    TG_CHECK(false, "conv3x3_wgmma_ss: TG_CONV3X3_SS_TILE=", tile, " is none of 128x2x128, 64x4x128, 64x2x256");
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
