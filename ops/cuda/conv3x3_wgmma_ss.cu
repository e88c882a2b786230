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
//   halo (B)   [channel quad (2)][halo row (4)][halo column (265, 258 used)][4 channels] 33 KB
//   weights (A)[tap (9)][k half (2)][output channel (64)][4 input channels]              18 KB
//   = 52.2 KB per stage, 209 KB for 4 (of 227 KB).
//
// Operands of the wgmma of tap (r, s), warpgroup w (both K-major, no swizzle; ops/cuda/wgmma.cuh
// states the layout: element (row, k) at start + (row / 8) SBO + (row % 8) 16 + (k / 4) LBO + (k % 4) 4):
//   A = weights: start = weights + tap * 2 KB, rows = output channels m: 16-byte rows
//       [m][4 channels], SBO = 128 B (next 8 output channels), LBO = 64 * 16 = 1 KB (channels
//       4..7 of the chunk). The pre-pass writes exactly this image per (chunk, channel tile), rounded
//       to TF32, so a stage's weights are one contiguous 16-byte cp.async run.
//   B = halo: rows = output pixels n = column 0..255 of output row w; pixel n of tap (r, s)
//       reads halo (row w + r, column n + s), whose 4 channels are one 16-byte row.
//       start = halo + ((w + r) * 265 + s) * 16 B, SBO = 128 B (8 consecutive columns), LBO =
//       4 * 265 * 16 B = 16.6 KB (the second channel quad). Every tap shift is just another start
//       address (16-byte aligned); no data moves.
//   D: thread (warp wi of the warpgroup, g = lane / 4, t = lane % 4) holds output channel
//       k0 + 16 wi + g + 8 h and columns 8 j + 2 t + e in acc[4 j + 2 h + e] (j < 32).
//
// Halo fill, vector (input 16-byte aligned and H W % 4 == 0, e.g. workload A both ways): a unit =
// one aligned group of 4 input columns x the 4 channels of a quad: 4 x 16-byte ld.global (one per
// channel; a warp reads 4 rows x 128 contiguous bytes), the 4 x 4 transpose is free (register
// choice), 4 x 16-byte st.shared (one per column: its 4 channels). 528 units per stage (2 quads x
// 4 rows x 66 groups: 258 columns that start up to 3 columns into an aligned group), ~2 per
// thread. The loads of step s + 2 are issued in step s behind its wgmma; the registers are stored
// in step s + 1 (again behind the queued wgmma), so their latency never stalls the tensor cores.
// Edge groups are masked per column (zeros for padding and neighbouring rows' data); the halo
// row stride is 265 pixels so that a store instruction's 8-lane phases are conflict-free.
// Per stage and thread ~2 x (4 LDG.128 + 4 STS.128 + ~30 address / mask instructions) instead of
// 33 LDGSTS at ~9 instructions each.
// Halo fill, scalar (any other alignment): 4-byte cp.async, each float to its transposed slot;
// zero-filled (src-size 0) for padding, borders and channels past Cin. Warp v of the block copies
// channel quad v / 4, halo row v % 4: lane (c = lane % 4, p = lane / 4) takes channel 4 quad + c,
// columns p + 8 i (i < 33, the last only for p < 2). One copy instruction writes 8 pixels x 4
// channels = 128 contiguous bytes of shared memory and reads 4 rows x 32 bytes of global memory.
// Weights: 4.5 x 16-byte cp.async per stage and thread, either way.
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
//     Vector fill: after the wgmma of step s, st.shared of step s + 1's halo (registers loaded in
//     step s - 1) into stage (s + 1) % 4 (last read by step s - 3), then the loads of step s + 2's
//     halo into registers; the fence.proxy.async + barrier of step s + 1 publish the stores.
//   - stage (s + 2) % 4 was last read by step s - 2, which every warpgroup retired (its wait at
//     the end of step s - 1) before the barrier of step s: refilled only after every wgmma
//     reading it retired.
//   - tile end: wait_group 0, accumulators re-bound (fence_operand), stored; the next tile's first
//     wgmma has scale-d = 0 (no zeroing) and follows a wgmma.fence (the epilogue read them).
//
// Shared-memory traffic per stage (9 taps; 2 x m64n256k8 per tap = 2304 tensor clocks at peak):
//   operand reads 18 x (A 2 KB + B 8 KB) = 180 KB = 1440 wavefronts (B is read once per wgmma and
//   serves all 4 warps' M rows), fills 52.2 KB = 408 wavefronts: 1848 of 2304 wavefront-clocks
//   (80% of the port at the tensor peak; the register-A kernel needed 93%).
// L2 -> SM: 52.2 KB per 2304 clocks at peak, ~3.2 TB/s over 132 SMs at 300 TFLOP/s (same order
// as the register-A kernel; the weights are 35% of it).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/conv3x3.h"
#include "ops/cuda/conv3x3_staging.cuh"
#include "ops/cuda/conv3x3_wgmma_ss.h"
#include "ops/cuda/hopper.h"
#include "ops/cuda/wgmma.cuh"

// Which halo fill serves shapes that allow both: the 4-byte cp.async fill (default) or the
// vector fill (16-byte loads staged through registers, stored a step later). Measured on an H200,
// workload A TF32, same run: forward 2.672 ms with cp.async, 3.375 ms with the vector fill
// (backward 7.07 vs 7.50): the asynchronous copies overlap the wgmma, the register staging does
// not, although it issues a third of the memory instructions. Kept buildable
// (-DTG_CONV3X3_SS_VECTOR_FILL=1) for that comparison; its tests then exercise it.
#ifndef TG_CONV3X3_SS_VECTOR_FILL
#define TG_CONV3X3_SS_VECTOR_FILL 0
#endif

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

// (d[0..3]) = 4 consecutive floats at src (16-byte aligned) if pred, else zeros. Read-only path:
// the kernel never writes its input.
__device__ __forceinline__ void load4_if(float (&d)[4], const float* src, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"
      " mov.b32 %3, 0;\n @p ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "l"(src), "r"(static_cast<int>(pred)));
}
// 16 bytes to shared memory (dst 16-byte aligned) with a plain (generic-proxy) store: a
// fence.proxy.async by this thread and a barrier must come before a wgmma reads them.
__device__ __forceinline__ void store4_shared(float* dst, float v0, float v1, float v2, float v3) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(wgmma::shared_address(dst)), "f"(v0), "f"(v1),
               "f"(v2), "f"(v3)
               : "memory");
}

__device__ __forceinline__ float* dynamic_smem() {
  extern __shared__ __align__(128) float smem_buffer[];
  return smem_buffer;
}

// ---- kernels (BEGIN KERNELS: everything down to END KERNELS uses only the primitives above) ----

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
  static constexpr int kHaloCols = kCols + 2;             // columns the taps read
  // Row stride of the halo in 16-byte pixels: the scalar fill copies groups of 8 (264 columns);
  // one more makes consecutive halo rows start 16 bytes apart modulo 128 so that the vector
  // fill's 16-byte stores (8 lanes = 4 rows x 2 pixel groups) hit 8 different bank quads.
  static constexpr int kCopyCols = 8 * ceil_div(kHaloCols, 8) + 1;  // 265
  static constexpr int kQuadFloats = kHaloRows * kCopyCols * 4;  // one channel quad of the halo
  static constexpr int kXStage = 2 * kQuadFloats;                 // halo floats per stage
  static constexpr int kTapFloats = 2 * kM * 4;                   // A image of one tap
  static constexpr int kWStage = 9 * kTapFloats;
  static constexpr int kStageFloats = kXStage + kWStage;
  static constexpr uint32_t kALbo = kM * 16, kASbo = 128;            // weights: next channel quad, next 8 rows
  static constexpr uint32_t kBLbo = kQuadFloats * 4, kBSbo = 128;    // halo: next channel quad, next 8 pixels
  static constexpr size_t kSmemBytes = sizeof(float) * kStages * kStageFloats;
  // Vector fill: a unit = 4 consecutive, 16-byte aligned input columns x the 4 channels of a
  // quad (4 loads of 16 bytes, 4 stores of 16 bytes). A halo row needs kGroups of them (258
  // columns starting up to 3 columns into an aligned group); units are numbered so that lanes
  // 2 i, 2 i + 1 take adjacent groups of halo row i % 4: unit u -> quad u / kQuadUnits, row
  // u / 2 % 4, group 2 (u % kQuadUnits / 8) + u % 2 (a thread keeps one row for all its units).
  static constexpr int kGroups = ceil_div(kHaloCols + 3, 8) * 2;  // 66
  static constexpr int kQuadUnits = kGroups * kHaloRows;          // 264
  static constexpr int kUnits = 2 * kQuadUnits;                   // 528
  static constexpr int kThreadUnits = ceil_div(kUnits, kThreads); // 3 (the third: 16 threads)
  static_assert(kThreads / 32 == 2 * kHaloRows, "one warp per (channel quad, halo row) of a stage");
  static_assert(kHaloRows == 4 && kThreads % 8 == 0 && kQuadUnits % 8 == 0, "vector fill unit numbering");
  static_assert(4 * kGroups <= kCopyCols, "vector fill stays inside a halo row (column 4 group + e - shift)");
  static_assert((kCopyCols * 16) % 128 == 16, "vector fill: rows 16 bytes apart modulo 128");
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
  bool vec;    // in 16-byte aligned, Hin Win % 4 == 0, Win < 2^30: the vector halo fill
};

// Scalar halo fill (any alignment): issues the 4-byte copies of the cursor's (tile, chunk) into
// `stage`, each float to its transposed slot (this warp: one channel quad x one halo row).
__device__ __forceinline__ void load_halo_scalar(float* stage, const float* __restrict__ in, const SsParams& p,
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
#pragma unroll
  for (int i = 0; i < T::kCopyCols / 8; ++i) {
    if (8 * i + 8 > T::kHaloCols && 8 * i + px >= T::kHaloCols) break;  // columns no tap reads
    const bool ok = row_ok && 8 * i >= col_lo && 8 * i < col_hi;
    cp_async<4>(dst + 32 * i, ok ? row + 8 * i : in, ok);
  }
}

// Vector halo fill, first half: this thread's units of the cursor's (tile, chunk) into registers
// (16-byte loads; zeros for padding, borders and channels past Cin). Needs p.vec: then every
// channel of a row has the same column alignment, `shift` = (input column of halo column 0) mod
// 4, and an aligned 16-byte group holding one column inside the tensor lies inside it.
struct HaloRegs {
  float v[T::kThreadUnits][4][4];  // [unit][channel of the quad][column of the group]
  int shift;                       // halo column of a unit's first column = 4 group - shift
};
__device__ __forceinline__ void load_halo_vec(HaloRegs& h, const float* __restrict__ in, const SsParams& p,
                                              const LoadCursor& cur) {
  const int hrow = threadIdx.x / 2 % T::kHaloRows;
  const int64_t ih = cur.tc.oh0 - p.pad_h + hrow;
  const int64_t iw_first = cur.tc.ow0 - p.pad_w;  // input column of halo column 0
  // Only the low 2 bits matter: unsigned 32-bit arithmetic (wrapping keeps them).
  const int shift = static_cast<int>((static_cast<uint32_t>(ih) * static_cast<uint32_t>(p.Win) +
                                      static_cast<uint32_t>(iw_first)) & 3u);
  h.shift = shift;
  // Column arithmetic in 32 bits (p.vec requires Win < 2^30).
  const int col_base = static_cast<int>(iw_first) - shift;  // input column of group 0 (16-byte aligned)
  const int win = static_cast<int>(p.Win);
  const bool row_ok = ih >= 0 && ih < p.Hin;
  const int64_t plane_bytes = 4 * p.Hin * p.Win;
  // Byte address of (channel 8 chunk, ih, col_base), formed in unsigned arithmetic for any ih
  // (rows outside the input are never read: their loads are predicated off).
  const uint64_t row_addr = reinterpret_cast<uint64_t>(in) +
                            4 * static_cast<uint64_t>(((cur.tc.n * p.Cin + cur.chunk * T::kChunk) * p.Hin + ih) * p.Win +
                                                      col_base);
  const int chans = static_cast<int>(std::min<int64_t>(p.Cin - cur.chunk * T::kChunk, T::kChunk));  // inside the input
#pragma unroll
  for (int i = 0; i < T::kThreadUnits; ++i) {
    const int u = threadIdx.x + i * T::kThreads;
    const int quad = u / T::kQuadUnits, group = 2 * (u % T::kQuadUnits / 8) + u % 2;
    const int col0 = col_base + 4 * group;
    const bool group_ok = row_ok && u < T::kUnits && col0 > -4 && col0 < win;
    const uint64_t src = row_addr + (quad ? 4 * plane_bytes : 0) + 16 * group;
#pragma unroll
    for (int c = 0; c < 4; ++c)
      load4_if(h.v[i][c], reinterpret_cast<const float*>(src + c * plane_bytes), group_ok && 4 * quad + c < chans);
    // Columns of an edge group outside the row (neighbouring rows' data, or padding) become 0
    // (selects: a branch around them made ptxas add more moves than it saved).
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool inside = static_cast<unsigned>(col0 + e) < static_cast<unsigned>(win);
#pragma unroll
      for (int c = 0; c < 4; ++c) h.v[i][c][e] = inside ? h.v[i][c][e] : 0.f;
    }
  }
}

// Vector halo fill, second half: the registers of load_halo_vec to `stage`, transposed (one
// 16-byte store = the 4 channels of one halo column). Lanes 0..7 of a store write 4 rows x 2
// groups: rows start 16 bytes apart modulo 128 (kCopyCols), groups 64 bytes apart, so the 8
// stores of a phase cover 8 different 16-byte bank quads (no conflict when all rows share one
// shift, as for W % 4 == 0; W % 4 == 2 maps them 1:1 as well).
__device__ __forceinline__ void store_halo_vec(float* stage, const HaloRegs& h) {
  const int hrow = threadIdx.x / 2 % T::kHaloRows;
#pragma unroll
  for (int i = 0; i < T::kThreadUnits; ++i) {
    const int u = threadIdx.x + i * T::kThreads;
    if (T::kUnits % T::kThreads != 0 && u >= T::kUnits) break;
    const int quad = u / T::kQuadUnits, group = 2 * (u % T::kQuadUnits / 8) + u % 2;
    // Halo column 4 group + e - shift; group 0's first `shift` columns lie left of the halo.
    float* dst = stage + ((quad * T::kHaloRows + hrow) * T::kCopyCols + 4 * group - h.shift) * 4;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (4 * group + e >= h.shift) store4_shared(dst + 4 * e, h.v[i][0][e], h.v[i][1][e], h.v[i][2][e], h.v[i][3][e]);
  }
}

// Issues the copies of the cursor's chunk of weight images into `stage` (one contiguous block of
// the prepared weights, laid out as in shared memory).
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
__device__ __forceinline__ void store_tile(float* __restrict__ out, const float* __restrict__ bias,
                                           const SsParams& p, const TileCoord& tc, const float (&acc)[T::kAcc],
                                           int wg, int wi, int g, int t) {
  const int64_t oh = tc.oh0 + wg;
  const int64_t cols_left64 = p.Wout - tc.ow0 - 2 * t;  // this thread's column 8 j is inside if 8 j < this
  const int cols_left = static_cast<int>(cols_left64 < T::kCols ? cols_left64 : T::kCols);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t k = tc.k0 + 16 * wi + g + 8 * h;
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
// over the block's (tile, chunk) steps without a break. kVec: the vector halo fill (p.vec), whose
// loads run one step earlier than their stores (registers carry a step's halo across the step
// boundary, so the load latency hides behind the queued wgmma and the barrier); otherwise the
// scalar cp.async fill.
template <bool kVec>
__global__ void __launch_bounds__(T::kThreads, 1)
    conv3x3_wgmma_ss_kernel(float* __restrict__ out,         // (N, Kout, Hout, Wout)
                            const float* __restrict__ in,    // (N, Cin, Hin, Win)
                            const float* __restrict__ wp,    // (chunks, k_tiles, 9, 2, 64, 4)
                            const float* __restrict__ bias,  // (Kout) or null
                            SsParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float* smem = dynamic_smem();
  const uint32_t smem_addr = wgmma::shared_address(smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int wg = warp / 4, wi = warp % 4;  // warpgroup (= output row of the tile), warp within it

  float acc[T::kAcc];
#pragma unroll
  for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.f;

  HaloRegs halo;         // kVec: the halo of the step after the one being computed
  bool staged = false;   // ... holds a step to store
  LoadCursor cur{blockIdx.x, 0, tile_coord<T>(blockIdx.x, p)};
  // Steps 0 and 1: step 0's halo straight to stage 0, step 1's into registers (kVec).
#pragma unroll 1
  for (int s = 0; s < 2; ++s) {
    if (cur.tile < p.tiles) {  // the cursor runs past the block's last tile when its steps are all loaded
      if constexpr (kVec) {
        load_halo_vec(halo, in, p, cur);
        if (s == 0) store_halo_vec(smem, halo);
        staged = s == 1;
      } else {
        load_halo_scalar(smem + s * T::kStageFloats, in, p, cur);
      }
      load_weights(smem + s * T::kStageFloats, wp, p, cur);
      advance<T>(cur, p);
    }
    cp_async_commit();
  }
  int load_stage = 2, compute_stage = 0;
  // One (tile, chunk) step: publish its stage, issue its 9 taps, then (while they and the
  // previous step's run) store the next step's halo (kVec), load the halo and weights of the step
  // after (into the stage used 2 steps ago), and retire the previous step.
  const auto run_step = [&](bool accumulate) {
    cp_async_wait<1>();          // this thread's copies of this step have landed (one newer group may be open)
    wgmma::fence_proxy_async();  // ... and they and its halo stores are visible to the wgmma's operand reads
    __syncthreads();             // everyone's are; stage (step + 2) % 4 was last read by step - 2: retired
    const uint32_t stage_addr = smem_addr + 4u * compute_stage * T::kStageFloats;
    compute_stage = compute_stage == T::kStages - 1 ? 0 : compute_stage + 1;
    issue_stage(acc, stage_addr, stage_addr + 4u * T::kXStage, wg, accumulate);
    if constexpr (kVec) {
      // Stage (step + 1) % 4 was last read by step - 3; published by the next step's barrier.
      if (staged) store_halo_vec(smem + compute_stage * T::kStageFloats, halo);
      staged = false;
    }
    if (cur.tile < p.tiles) {
      if constexpr (kVec) {
        load_halo_vec(halo, in, p, cur);  // step + 2's halo; stored in the next step
        staged = true;
      } else {
        load_halo_scalar(smem + load_stage * T::kStageFloats, in, p, cur);
      }
      load_weights(smem + load_stage * T::kStageFloats, wp, p, cur);
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
    store_tile(out, bias, p, tile_coord<T>(tile, p), acc, wg, wi, g, t);
  }
  cp_async_wait<0>();  // nothing outstanding at exit (the last groups are empty)
#else
  __trap();  // conv3x3_wgmma_ss_applies is false for builds without sm_90a code
#endif
}

// wp (chunks, k_tiles, 9 taps, 2 k halves, 64, 4) from w (K, C, 3, 3), rounded to TF32: element
// (chunk, kt, tap, h, m, q) belongs to input channel ci = 8 chunk + 4 h + q and output channel
// o = 64 kt + m, zero outside. Forward: w[o][ci][tap]. Grad-input (the convolution of dy with the
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

inline SsParams plan(SsParams p, bool out_aligned_8, bool in_aligned_16) {
  p.k_tiles = ceil_div(p.Kout, T::kM);
  p.chunks = ceil_div(p.Cin, T::kChunk);
  p.row_tiles = ceil_div(p.Hout, T::kRows);
  p.col_tiles = ceil_div(p.Wout, T::kCols);
  p.tiles = p.N * p.row_tiles * p.col_tiles * p.k_tiles;
  p.pairs = p.Wout % 2 == 0 && out_aligned_8;
  p.vec = TG_CONV3X3_SS_VECTOR_FILL && in_aligned_16 && (p.Hin * p.Win) % 4 == 0 && p.Win < (int64_t(1) << 30);
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

// out = conv3x3(in, w re-laid out): the forward pass, or (transposed weights) the input gradient.
void run(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, SsParams p, bool for_grad_input) {
  const int dev = out.device().index;
  set_device(dev);
  p = plan(p, reinterpret_cast<uintptr_t>(out.data<float>()) % 8 == 0,
           reinterpret_cast<uintptr_t>(in.data<float>()) % 16 == 0);

  Tensor wp = Tensor::empty(Shape{p.chunks * p.k_tiles * T::kWStage}, {.dtype = DType::f32, .device = out.device()});
  prepare_ss_weights_kernel<<<grid_for(wp.numel(), kPrepThreads), kPrepThreads, 0, stream(dev)>>>(
      wp.data<float>(), w.data<float>(), w.size(0), w.size(1), p.chunks, p.k_tiles, for_grad_input);
  TG_LAUNCH_CHECK();

  auto* kernel = p.vec ? conv3x3_wgmma_ss_kernel<true> : conv3x3_wgmma_ss_kernel<false>;
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(T::kSmemBytes)));
  // One block per SM (the accumulators take half the registers, the stages most of the smem).
  const int64_t grid = std::min<int64_t>(p.tiles, sm_count(dev));
  kernel<<<static_cast<unsigned>(grid), T::kThreads, T::kSmemBytes, stream(dev)>>>(out.data<float>(), in.data<float>(),
                                                                                  wp.data<float>(), bias, p);
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
