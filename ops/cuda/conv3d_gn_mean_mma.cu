// Tensor-core kernels of the fused Conv3d(3x3x3) -> GroupNorm -> mean (workload C): the conv as an
// implicit GEMM on mma.sync m16n8k8 TF32; y lives in accumulator registers only.
// Design, precision contract and the floor: docs/kernels/conv3d_gn_mean.md.
//
// Shapes: C_in in {1, 3}, K = 8 NT (instantiated: K = 24), any N, D, H, W. Tiles are TD depths x
// TH rows (even) x kTW = 32 columns of one sample; the footprint x[:, TD+2, TH+2, 34] is staged
// double-buffered by cp.async (only elements inside the input; both buffers zeroed once per block,
// the rest is read only by skipped or masked outputs and must merely be finite). Row, plane and
// channel strides 11, 3, 7 mod 32 keep every fragment gather conflict-free. Taps
// k = ci*27 + kd*9 + kh*3 + kw, padded with zero-weight taps (C_in 3 forward: TapGroups3 order).
//
//  weight_fragments  w -> per-lane fragments, split once (forward B, backward A).
//  stats_mma         persistent; per tile one barrier; per-lane sums of z and z^2 (z = y - bias)
//                    from the accumulators, warp butterfly, warps in order (f64) -> (tile, 2, K).
//  tile_stats_reduce tiles of a sample in order -> S1, S2 (bias folded back in).
//  grad_w_mma        (1) y^T = W^T patch^T, (2) dy = A' + B z in place (its accumulator fragment
//                    is (3)'s B fragment, positions 2t -> t, 2t+1 -> t+4), (3) dW += patch^T dy;
//                    per-tile chains into thread-private smem slots (the tensor core truncates).
//  dw_blocks_reduce  block partials in block order, f64.
// Deterministic: no atomics; every sum has a fixed order.
#include <algorithm>
#include <cstdint>

#include "core/cuda_context.h"
#include "ops/cuda/arch/cp_async.cuh"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/arch/mma_sync.cuh"
#include "ops/cuda/arch/tf32.cuh"
#include "ops/cuda/conv3d_gn_mean_mma.h"

namespace tg::cuda {
namespace {


__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

// ==== BEGIN KERNELS (plain C++ and CUDA built-ins only: the host emulator compiles this part)

constexpr int kTW = 32;        // output columns per tile: two m16 tiles along w
constexpr int kFW = kTW + 2;   // footprint columns
constexpr int kRS = 43;        // x tile row stride (floats), 11 mod 32
constexpr int kPlaneMod = 3;   // plane stride mod 32
constexpr int kChannelMod = 7; // channel stride mod 32
constexpr int kNP = kTW / 8;   // backward: 8-position chunks per row
constexpr int kMaxTileFloats = 12288;  // x tile cap (48 KB): 4+ forward / 2 backward blocks per SM

template <int C>
struct Taps {
  static constexpr int kTaps = 27 * C;
  static constexpr int kSteps = (kTaps + 7) / 8;       // k8 steps of the conv GEMM
  static constexpr int kTapTiles = (kTaps + 15) / 16;  // m16 tiles of the dW GEMM
};

// The forward's tap order (its GEMM's K) for C_in = 3: taps grouped by (ci, kd, kw) and the
// groups paired, so that a unit (output rows h, h + 1) gathers each input row of a group once
// and feeds it to the tensor core as a whole A fragment in two places. Lane t (owning the
// fragment's K columns t and t + 4) holds 7 groups G0..G6 (row i of the table below, byte t):
// pair (G2p, G2p+1) fills steps 3p + kh (kh = 0, 1, 2) with columns t <- G2p, t + 4 <- G2p+1
// at that kh, so the fragment of output row h + hr at step 3p + kh is input row r = hr + kh of
// both groups: F_r = {G2p row r at g, g + 8; G2p+1 row r at g, g + 8}, and F_1, F_2 serve both
// output rows. G6 takes steps 9 (kh 0 | 1) and 10 (kh 2 | padding). Per unit: 7 groups x 4
// rows x 2 column halves x 2 positions = 112 gathers instead of 11 steps x 16 = 176 (and as
// many fewer TF32 roundings / FP32 splits), with no register copies for the pairs' fragments.
// The absent 28th group and slot 21 are zero-weight padding. Other C_in keep w's own order.
struct TapGroups3 {
  static constexpr int kGroups = 27, kPerLane = 7;  // byte 27: no group
  // Row i: the groups of lanes t = 0..3 (byte t). Chosen (offline search) so that each gather
  // of a warp -- 8 positions x the 4 lanes' groups at offsets ci CS + kd PS + kw, i.e.
  // 7 ci + 3 kd + kw mod 32 -- touches 32 distinct banks or the same word.
  __host__ __device__ static constexpr uint32_t row(int i) {
    return i == 0 ? 0x0c020100u : i == 1 ? 0x11050403u : i == 2 ? 0x14131206u : i == 3 ? 0x16150807u
         : i == 4 ? 0x170b0a09u : i == 5 ? 0x19180e0du : 0x1b1a100fu;
  }
  __host__ __device__ static constexpr int group(int i, int t) { return static_cast<int>((row(i) >> (8 * t)) & 0xffu); }
};

template <int C>
constexpr bool kGroupedTaps = C == 3;

// w's tap (ci*27 + kd*9 + kh*3 + kw) at row k of the forward's B operand, or -1 for padding.
template <int C>
__host__ __device__ inline int forward_tap(int k) {
  if constexpr (!kGroupedTaps<C>) {
    return k < 27 * C ? k : -1;
  } else {
    const int c = k % 8, t = c % 4, j = 2 * (k / 8) + c / 4;  // lane t's slot j
    int i, kh;
    if (j < 18) {
      i = 2 * (j / 6) + j % 2, kh = j % 6 / 2;
    } else {
      i = 6, kh = j - 18;
    }
    if (kh > 2) return -1;
    const int q = TapGroups3::group(i, t);
    if (q >= TapGroups3::kGroups) return -1;
    return (q / 9) * 27 + (q % 9 / 3) * 9 + kh * 3 + q % 3;
  }
}

// n / d for 0 <= n < 2^31 as one wide multiply and a shift: m = ceil(2^(31 + l) / d) with
// l = ceil(log2 d) is below 2^32, and floor(n m / 2^(31 + l)) = floor(n / d) for every 31-bit
// n (Granlund & Montgomery, 1994). Tile indices are below 2^31 (checked by the launchers).
struct FastDiv {
  uint32_t d, m;
  int shift;
};

inline FastDiv make_fast_div(int64_t d) {
  int l = 0;
  while ((int64_t{1} << l) < d) ++l;
  const uint64_t p = uint64_t{1} << (31 + l);
  return {static_cast<uint32_t>(d), static_cast<uint32_t>((p + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d)),
          31 + l};
}

__device__ __forceinline__ uint32_t fast_div(uint32_t n, const FastDiv& f) {
  return static_cast<uint32_t>((static_cast<uint64_t>(n) * f.m) >> f.shift);
}

struct MmaGeom {
  int64_t N, D, H, W, OD, OH, OW;
  int K, TD, TH, FD, FH;  // tile: TD x TH x kTW outputs; footprint FD x FH x kFW inputs
  int64_t NDT, NHT, NWT, tiles_per_sample, tiles;
  FastDiv div_wt, div_ht, div_dt;  // by NWT, NHT, NDT
  int PS, CS, xs_floats;  // x tile: plane and channel strides, size (rows are kRS apart)
};

inline int stride_with_residue(int64_t at_least, int residue) {
  int64_t s = at_least;
  while (s % 32 != residue) ++s;
  return static_cast<int>(s);
}

// Tile shape: the fewest computed rows (padding past OD, OH) with a small charge for the
// footprint's halo (re-staged rows), within the shared-memory cap.
inline MmaGeom make_mma_geom(int64_t N, int C, int K, const int64_t in[3], const int64_t out[3]) {
  MmaGeom g{};
  g.N = N, g.D = in[0], g.H = in[1], g.W = in[2];
  g.OD = out[0], g.OH = out[1], g.OW = out[2];
  g.K = K;
  double best = -1;
  for (int td = 1; td <= 4; ++td)
    for (int th = 2; th <= 16; th += 2) {
      const int fh = th + 2, fd = td + 2;
      const int ps = stride_with_residue(int64_t{fh} * kRS, kPlaneMod);
      const int cs = stride_with_residue(int64_t{fd} * ps, kChannelMod);
      if (int64_t{C} * cs > kMaxTileFloats) continue;
      const double rows = static_cast<double>(ceil_div(g.OD, td) * td) * static_cast<double>(ceil_div(g.OH, th) * th);
      const double cost = rows * (1.0 + 0.08 * (fd * fh) / static_cast<double>(td * th));
      if (best < 0 || cost < best) {
        best = cost;
        g.TD = td, g.TH = th, g.FD = fd, g.FH = fh, g.PS = ps, g.CS = cs;
      }
    }
  g.xs_floats = C * g.CS;
  g.NDT = ceil_div(g.OD, g.TD), g.NHT = ceil_div(g.OH, g.TH), g.NWT = ceil_div(g.OW, kTW);
  g.tiles_per_sample = g.NDT * g.NHT * g.NWT;
  g.tiles = g.N * g.tiles_per_sample;
  g.div_wt = make_fast_div(g.NWT), g.div_ht = make_fast_div(g.NHT), g.div_dt = make_fast_div(g.NDT);
  return g;
}

// Forward warps per block: all of the tile's row pairs with the fewest idle warp slots. At most
// 5: three blocks of 5 warps (15 of the SM's 16 warp slots at 128+ registers) may use 136
// registers each, which the FP32 kernel needs to stay clear of spills.
constexpr int kMaxForwardWarps = 5;
inline int forward_warps(int units) {
  int best = 1, best_idle = 1 << 30;
  for (int w = std::min(4, units); w <= kMaxForwardWarps; ++w) {
    const int idle = static_cast<int>(ceil_div(units, w)) * w - units;
    if (idle < best_idle) best = w, best_idle = idle;
  }
  return best;
}

// Operands of x for TERMS tensor ops per product:
// TERMS 3: hi = x truncated to TF32 (exact), lo = x - hi (exact in FP32; the tensor core keeps
//          its top 11 bits): lo*hi' + hi*lo' + hi*hi', three m16n8k8 TF32 ops.
// TERMS 2: hi as for 3; lo = the bf16 pair (hi, x - hi) that meets the weight's pair (lo', hi')
//          in ONE m16n8k16 bf16 op: hi*lo' + (x - hi)*hi', each cross term kept to bf16's 8
//          bits (the cross terms are <= 2^-10 of the product: ~2^-18 error per product), then
//          hi*hi' as one TF32 op. Two tensor ops instead of three.
// TERMS 1: x plus half a TF32 ulp, so that the tensor core's truncation rounds to nearest.
template <int TERMS>
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
  if constexpr (TERMS == 1) {
    hi = __float_as_uint(x) + 0x1000u;
    lo = 0u;
  } else if constexpr (TERMS == 2) {
    hi = __float_as_uint(x) & 0xffffe000u;
    const float h = __uint_as_float(hi);
    lo = bf16_pair(h, x - h);
  } else {
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
  }
}

// Round to nearest TF32 (finite inputs), as a float whose low 13 bits are zero.
__device__ __forceinline__ float round_tf32(float v) { return __uint_as_float(tf32_bits(v)); }

// bf16 bits of v rounded to nearest even (finite inputs); plain integer arithmetic.
__device__ __forceinline__ uint32_t bf16_bits(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// d += a b with TERMS tensor ops: the small cross terms first, then hi * hi.
template <int TERMS>
__device__ __forceinline__ void mma_terms(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                          const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
  if constexpr (TERMS == 3) {
    mma_tf32(d, al, bh[0], bh[1]);
    mma_tf32(d, ah, bl[0], bl[1]);
  } else if constexpr (TERMS == 2) {
    mma_bf16(d, al, bl[0], bl[1]);
  }
  mma_tf32(d, ah, bh[0], bh[1]);
}

// w (K, C, 3, 3, 3) -> fragments, each operand split into TF32 hi = round(v) and lo:
//   fwd [kSteps][NT][32] float4 {hi b0, hi b1, lo b0, lo b1}: W (taps x channels), B operand;
//       lo = tf32(v - hi) for terms 3, the bf16 pair (lo' = v - hi, hi) for terms 2 (the
//       k16 partner of split<2>'s (hi, lo)), 0 for terms 1;
//   bwd [kSteps][MC][2][32] float4 {hi a0..a3} / {lo a0..a3}: W^T (channels x taps), A operand
//       (terms 2 or 3: lo = tf32(v - hi); terms 1: 0).
// Lanes 16 bytes apart: each LDS.128 of a warp is 4 conflict-free wavefronts.
template <int C, int NT>
__global__ void weight_fragments_kernel(float4* __restrict__ fwd, float4* __restrict__ bwd,
                                        const float* __restrict__ w, int terms) {
  using T = Taps<C>;
  constexpr int MC = (NT + 1) / 2;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = i % 32, g = lane / 4, t = lane % 4;
  auto W = [&](int tap, int c) { return tap >= 0 && tap < T::kTaps && c < 8 * NT ? w[c * T::kTaps + tap] : 0.f; };
  auto hi = [&](float v) { return round_tf32(v); };
  auto lo = [&](float v) { return terms != 1 ? round_tf32(v - round_tf32(v)) : 0.f; };
  auto fwd_lo = [&](float v) {
    if (terms != 2) return lo(v);
    const float h = round_tf32(v);
    return __uint_as_float(bf16_bits(v - h) | bf16_bits(h) << 16);
  };
  if (i < T::kSteps * NT * 32) {
    const int n = (i / 32) % NT, s = i / (32 * NT);
    const float b0 = W(forward_tap<C>(8 * s + t), 8 * n + g), b1 = W(forward_tap<C>(8 * s + t + 4), 8 * n + g);
    fwd[i] = make_float4(hi(b0), hi(b1), fwd_lo(b0), fwd_lo(b1));
  }
  if (i < T::kSteps * MC * 32) {
    const int mc = (i / 32) % MC, s = i / (32 * MC);
    const float a0 = W(8 * s + t, 16 * mc + g), a1 = W(8 * s + t, 16 * mc + g + 8);
    const float a2 = W(8 * s + t + 4, 16 * mc + g), a3 = W(8 * s + t + 4, 16 * mc + g + 8);
    bwd[(s * MC + mc) * 64 + lane] = make_float4(hi(a0), hi(a1), hi(a2), hi(a3));
    bwd[(s * MC + mc) * 64 + 32 + lane] = make_float4(lo(a0), lo(a1), lo(a2), lo(a3));
  }
}

struct TileAt {
  int64_t n, d0, h0, w0;
};

// Tile t = ((n * NDT + dt) * NHT + ht) * NWT + wt, t < 2^31.
__device__ __forceinline__ TileAt tile_at(int64_t t, const MmaGeom& g) {
  const uint32_t q0 = static_cast<uint32_t>(t), q1 = fast_div(q0, g.div_wt), q2 = fast_div(q1, g.div_ht),
                 n = fast_div(q2, g.div_dt);
  const uint32_t wt = q0 - q1 * g.div_wt.d, ht = q1 - q2 * g.div_ht.d, dt = q2 - n * g.div_dt.d;
  return {int64_t{n}, int64_t{dt} * g.TD, int64_t{ht} * g.TH, int64_t{wt} * kTW};
}

// Offset of tap k in the x tile; a padding tap reads any finite x (its weight is 0).
template <int C>
__device__ __forceinline__ int tap_offset(int k, const MmaGeom& g) {
  if (k >= 27 * C) return 0;
  const int ci = k / 27, r = k % 27;
  return ci * g.CS + (r / 9) * g.PS + (r / 3 % 3) * kRS + r % 3;
}

// Per-lane tap offsets: by_t [kSteps][4] {tap 8s + t, 8s + t + 4} (conv GEMM, K = taps);
// by_g [kTapTiles][8] {tap 16m + g, 16m + g + 8} (dW GEMM, M = taps), or null.
template <int C>
__device__ void stage_tap_tables(int2* by_t, int2* by_g, const MmaGeom& g) {
  using T = Taps<C>;
  for (int i = threadIdx.x; i < T::kSteps * 4; i += blockDim.x)
    by_t[i] = make_int2(tap_offset<C>(8 * (i / 4) + i % 4, g), tap_offset<C>(8 * (i / 4) + i % 4 + 4, g));
  if (by_g)
    for (int i = threadIdx.x; i < T::kTapTiles * 8; i += blockDim.x)
      by_g[i] = make_int2(tap_offset<C>(16 * (i / 8) + i % 8, g), tap_offset<C>(16 * (i / 8) + i % 8 + 8, g));
}

// The tile's input footprint into xs [C][FD][FH][kFW] (strides CS, PS, kRS) by cp.async: the
// copies land while the block computes another tile (committing and waiting is the caller's).
// A warp copies one (ci, fd, fh) row at a time (coalesced: 32 lanes, then lanes 0, 1 for the
// last two columns). Only elements inside the input are copied: rows past D or H and columns
// past W are read only by outputs past OD, OH or OW, which the kernels skip or multiply by 0,
// so they may hold any finite value -- zeros (zero_x_tiles at kernel start) or an earlier
// tile's x. The walk is incremental (a row's global and shared offsets advance by constant
// steps, with a carry into fd / ci every FH rows; the bounds are tile constants): ~20
// instructions per row instead of a 64-bit multiply chain.
template <int C>
__device__ void stage_x_async(float* xs, const float* __restrict__ x, const TileAt& o, const MmaGeom& g) {
  const int lane = threadIdx.x & 31, nwarps = static_cast<int>(blockDim.x >> 5);
  const int64_t plane = g.H * g.W;
  // The lane's columns w0 + lane and w0 + 32 + lane, clamped into the row: a lane past W still
  // names a valid address but copies 0 bytes (cp.async's src-size; zero-filled, harmless).
  // The last two columns are copied only where the input reaches them (warp-uniform).
  const int64_t col0 = o.w0 + lane, col1 = o.w0 + 32 + lane;
  const uint32_t bytes0 = col0 < g.W ? 4u : 0u, bytes1 = col1 < g.W ? 4u : 0u;
  const bool tail = o.w0 + 32 < g.W;
  const int64_t c0 = col0 < g.W ? col0 : g.W - 1;
  const int tail_off = static_cast<int>((col1 < g.W ? col1 : g.W - 1) - c0);
  // Element offset of footprint row (0, 0, 0) at the lane's first column.
  const int64_t origin = ((o.n * C * g.D + o.d0) * g.H + o.h0) * g.W + c0;
  const int depths_in = static_cast<int>(g.D - o.d0 < g.FD ? g.D - o.d0 : g.FD);
  const int rows_in = static_cast<int>(g.H - o.h0 < g.FH ? g.H - o.h0 : g.FH);
  const int64_t row_step = nwarps * g.W, fd_step = plane - g.FH * g.W, ci_step = (g.D - g.FD) * plane;
  const int dst_row_step = nwarps * kRS, dst_fd_step = g.PS - g.FH * kRS, dst_ci_step = g.CS - g.FD * g.PS;
  int fh = static_cast<int>(threadIdx.x >> 5), fd = 0, ci = 0;  // the carry below normalizes fh
  int64_t src = origin + fh * g.W;
  uint32_t dst = shared_address(xs + fh * kRS + lane);
  for (;;) {
    while (fh >= g.FH) {
      fh -= g.FH, src += fd_step, dst += 4 * dst_fd_step;
      if (++fd == g.FD) fd = 0, ++ci, src += ci_step, dst += 4 * dst_ci_step;
    }
    if (ci >= C) break;
    if (fd < depths_in && fh < rows_in) {  // warp-uniform
      cp_async_4(dst, x + src, bytes0);
      if (tail && lane < kFW - 32) cp_async_4(dst + 128, x + src + tail_off, bytes1);
    }
    fh += nwarps, src += row_step, dst += 4 * dst_row_step;
  }
}

// Both x tile buffers to zero once per block, so that the elements stage_x_async skips hold
// finite values from the start (shared memory starts as anything, NaN patterns included).
// The caller's barrier orders these stores before the first copies.
__device__ void zero_x_tiles(float* xs0, const MmaGeom& g) {
  for (int i = threadIdx.x; i < 2 * g.xs_floats; i += blockDim.x) xs0[i] = 0.f;
}

// ---- forward: statistics ------------------------------------------------------------------

// One unit's conv GEMM in w's tap order: acc[m] (m16 tile m: row h + m / 2, columns
// 16 (m % 2) + 0..15, from base = position (row h, column g)) += x patch . W. Per k8 step a
// lane gathers its taps 8s + t and 8s + t + 4 (offsets from the per-lane table) for 4 tiles
// x 2 positions: 16 gathers per 4 NT tensor-op products.
template <int C, int NT, int TERMS>
__device__ __forceinline__ void forward_unit(float (&acc)[4][NT][4], const float* base, const int2* tab,
                                             const float4* wf, int lane) {
  using T = Taps<C>;
  const int tq = lane & 3;
#pragma unroll
  for (int s = 0; s < T::kSteps; ++s) {
    const int2 off = tab[s * 4 + tq];
    const float* p0 = base + off.x;  // tap 8s + t
    const float* p1 = base + off.y;  // tap 8s + t + 4
    uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float4 v = wf[(s * NT + n) * 32 + lane];
      bh[n][0] = __float_as_uint(v.x), bh[n][1] = __float_as_uint(v.y);
      bl[n][0] = __float_as_uint(v.z), bl[n][1] = __float_as_uint(v.w);
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int mo = (m >> 1) * kRS + (m & 1) * 16;
      uint32_t ah[4], al[4];
      split<TERMS>(p0[mo], ah[0], al[0]);      // (position g,     tap t)
      split<TERMS>(p0[mo + 8], ah[1], al[1]);  // (position g + 8, tap t)
      split<TERMS>(p1[mo], ah[2], al[2]);      // (position g,     tap t + 4)
      split<TERMS>(p1[mo + 8], ah[3], al[3]);  // (position g + 8, tap t + 4)
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_terms<TERMS>(acc[m][n], ah, al, bh[n], bl[n]);
    }
  }
}

// The same in the grouped tap order (TapGroups3, C_in = 3; gtab[4 i + t] = lane t's group i).
// F(r, ch) of a group pair is gathered and split once and is the A fragment of tile (row hr,
// half ch) at step kh = r - hr, i.e. twice for r = 1, 2 (checked in SASS: 112 LDS per unit).
template <int NT, int TERMS>
__device__ __forceinline__ void forward_unit_grouped(float (&acc)[4][NT][4], const float* base, const int* gtab,
                                                     const float4* wf, int lane) {
  const int* gt = gtab + (lane & 3);
  auto weights = [&](int s, uint32_t (&bh)[NT][2], uint32_t (&bl)[NT][2]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float4 v = wf[(s * NT + n) * 32 + lane];
      bh[n][0] = __float_as_uint(v.x), bh[n][1] = __float_as_uint(v.y);
      bl[n][0] = __float_as_uint(v.z), bl[n][1] = __float_as_uint(v.w);
    }
  };
  // Fragment elements 2 e, 2 e + 1 (K column t + 4 e; positions g, g + 8) from group row r.
  auto gather = [&](const float* pgr, int r, int ch, uint32_t (&ah)[4], uint32_t (&al)[4], int e) {
    split<TERMS>(pgr[r * kRS + 16 * ch], ah[2 * e], al[2 * e]);
    split<TERMS>(pgr[r * kRS + 16 * ch + 8], ah[2 * e + 1], al[2 * e + 1]);
  };
  // FP32 (2 ops) rolls the pair loop: fully unrolled, the 128-register cap spills (the
  // compiler hoists the next pair's gathers); TF32 unrolls it (fewer instructions, no spills).
#pragma unroll(TERMS == 1 ? 3 : 1)
  for (int p = 0; p < 3; ++p) {
    const float* pa = base + gt[4 * (2 * p)];
    const float* pb = base + gt[4 * (2 * p + 1)];
#pragma unroll
    for (int kh = 0; kh < 3; ++kh) {
      uint32_t bh[NT][2], bl[NT][2];
      weights(3 * p + kh, bh, bl);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        uint32_t ah[4], al[4];
        gather(pa, (m >> 1) + kh, m & 1, ah, al, 0);
        gather(pb, (m >> 1) + kh, m & 1, ah, al, 1);
#pragma unroll
        for (int n = 0; n < NT; ++n) mma_terms<TERMS>(acc[m][n], ah, al, bh[n], bl[n]);
      }
    }
  }
  // G6: step 9 = (kh 0 | kh 1), step 10 = (kh 2 | padding).
  const float* p6 = base + gt[4 * 6];
#pragma unroll
  for (int s = 9; s < 11; ++s) {
    uint32_t bh[NT][2], bl[NT][2];
    weights(s, bh, bl);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      uint32_t ah[4], al[4];
      gather(p6, (m >> 1) + 2 * (s - 9), m & 1, ah, al, 0);
      if (s == 9) {
        gather(p6, (m >> 1) + 1, m & 1, ah, al, 1);
      } else {
        ah[2] = ah[3] = al[2] = al[3] = 0u;
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_terms<TERMS>(acc[m][n], ah, al, bh[n], bl[n]);
    }
  }
}

// Group offsets for forward_unit_grouped: gtab[4 i + t] = offset of lane t's group i in the x
// tile (0 for the absent group: any finite x, zero weights).
__device__ void stage_group_table(int* gtab, const MmaGeom& g) {
  for (int i = threadIdx.x; i < TapGroups3::kPerLane * 4; i += blockDim.x) {
    const int q = TapGroups3::group(i / 4, i % 4);
    gtab[i] = q < TapGroups3::kGroups ? (q / 9) * g.CS + (q % 9 / 3) * g.PS + q % 3 : 0;
  }
}

// Persistent blocks: block b computes tiles b, b + grid, ...; partial (tiles, 2, K) f64: a
// tile's sums of z and z^2 per channel, independent of the grid.
//
// Pipeline, one barrier per tile: [wait for my copies of tile t; barrier] -> the previous
// tile's cross-warp sums (warps in order, from red[buf ^ 1]) -> cp.async of the next tile's
// footprint into xs[buf ^ 1] (every warp has passed the barrier, so none still reads it) ->
// the units of tile t from xs[buf] -> warp sums by shuffles into red[buf]. The weights are
// staged once per block (in the first copy group).
template <int C, int NT, int TERMS>
__global__ void __launch_bounds__(kMaxForwardWarps * 32, 3)
stats_mma_kernel(double* __restrict__ partial, const float* __restrict__ x, const float4* __restrict__ wfrag,
                 MmaGeom g) {
  using T = Taps<C>;
  constexpr int K = 8 * NT;
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5, gq = lane >> 2, tq = lane & 3;
  extern __shared__ float4 smem_fwd[];
  float4* wf = smem_fwd;                                          // [kSteps][NT][32]
  int2* tab = reinterpret_cast<int2*>(wf + T::kSteps * NT * 32);  // [kSteps][4]
  double* red = reinterpret_cast<double*>(tab + T::kSteps * 4);   // [2][nwarps][2][K] warp sums
  float* xs0 = reinterpret_cast<float*>(red + 2 * nwarps * 2 * K);  // [2][xs_floats] x tiles

  for (int i = tid; i < T::kSteps * NT * 32; i += nthreads) cp_async_16_full(wf + i, wfrag + i);
  if constexpr (kGroupedTaps<C>) {
    static_assert(TapGroups3::kPerLane * 4 * sizeof(int) <= T::kSteps * 4 * sizeof(int2), "fits the table space");
    stage_group_table(reinterpret_cast<int*>(tab), g);
  } else {
    stage_tap_tables<C>(tab, nullptr, g);
  }
  zero_x_tiles(xs0, g);
  __syncthreads();  // zeros before the first copies
  int64_t t = blockIdx.x;
  stage_x_async<C>(xs0, x, tile_at(t, g), g);  // the grid never exceeds the tile count
  cp_async_commit();

  int buf = 0;
  for (; t < g.tiles; t += gridDim.x, buf ^= 1) {
    cp_async_wait<0>();
    __syncthreads();
    if (t != blockIdx.x)
      for (int i = tid; i < 2 * K; i += nthreads) {
        double sum = 0;
        for (int w = 0; w < nwarps; ++w) sum += red[((buf ^ 1) * nwarps + w) * 2 * K + i];
        partial[(t - gridDim.x) * 2 * K + i] = sum;
      }
    if (t + gridDim.x < g.tiles) stage_x_async<C>(xs0 + (buf ^ 1) * g.xs_floats, x, tile_at(t + gridDim.x, g), g);
    cp_async_commit();

    // The tile's valid output depths, rows and columns (all its own at the interior).
    const TileAt o = tile_at(t, g);
    // Packed in one register (depths <= 4, rows <= 16, cols <= 32): unpacked, the compiler
    // recomputed them from the tile index in every unit (~40 instructions) for lack of registers.
    const uint32_t limits = static_cast<uint32_t>(g.OD - o.d0 < g.TD ? g.OD - o.d0 : g.TD) |
                            static_cast<uint32_t>(g.OH - o.h0 < g.TH ? g.OH - o.h0 : g.TH) << 8 |
                            static_cast<uint32_t>(g.OW - o.w0 < kTW ? g.OW - o.w0 : kTW) << 16;
    const float* xs = xs0 + buf * g.xs_floats;
    float s1[NT][2], s2[NT][2];  // channels 8n + 2t + e
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) s1[n][e] = s2[n][e] = 0.f;

    // Units (depth d, row pair h / 2) = warp, warp + nwarps, ... of TD x TH / 2, walked without
    // divisions (h advances by 2 nwarps, carrying into d).
    const int pairs = g.TH / 2;
    int d = warp / pairs, h = 2 * (warp % pairs);
    for (; d < g.TD; h += 2 * nwarps) {
      while (h >= g.TH) h -= g.TH, ++d;
      if (d >= g.TD) break;
      const int depths = static_cast<int>(limits & 0xffu), rows = static_cast<int>(limits >> 8 & 0xffu);
      const int cols = static_cast<int>(limits >> 16);
      if (d >= depths || h >= rows) continue;  // warp-uniform
      const bool row1 = h + 1 < rows;
      const float* base = xs + d * g.PS + h * kRS + gq;  // position (row h, column g)
      float acc[4][NT][4];  // m16 tile m: row h + m / 2, columns 16 (m % 2) + 0..15
#pragma unroll
      for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int k = 0; k < 4; ++k) acc[m][n][k] = 0.f;
      if constexpr (kGroupedTaps<C>) {
        forward_unit_grouped<NT, TERMS>(acc, base, reinterpret_cast<const int*>(tab), wf, lane);
      } else {
        forward_unit<C, NT, TERMS>(acc, base, tab, wf, lane);
      }
      // acc[m][n] = z at (positions g, g + 8 of m16 tile m) x (channels 8n + 2t, 8n + 2t + 1);
      // columns past OW masked.
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        if (m >= 2 && !row1) break;
        const float mlo = 16 * (m & 1) + gq < cols ? 1.f : 0.f, mhi = 16 * (m & 1) + 8 + gq < cols ? 1.f : 0.f;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float z0 = acc[m][n][e] * mlo, z1 = acc[m][n][2 + e] * mhi;
            s1[n][e] += z0 + z1;
            s2[n][e] = fmaf(z0, z0, fmaf(z1, z1, s2[n][e]));
          }
      }
    }

    // Channel c's sums are spread over the 8 lanes g of t = (c % 8) / 2: a fixed butterfly
    // (every lane ends with the same bits), then lane g = 0 keeps the warp's sum.
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int mask = 4; mask < 32; mask *= 2) {
          s1[n][e] += shfl_xor(s1[n][e], mask);
          s2[n][e] += shfl_xor(s2[n][e], mask);
        }
    if (gq == 0) {
      double* r = red + (buf * nwarps + warp) * 2 * K;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          r[8 * n + 2 * tq + e] = s1[n][e];
          r[K + 8 * n + 2 * tq + e] = s2[n][e];
        }
    }
  }
  __syncthreads();
  for (int i = tid; i < 2 * K; i += nthreads) {
    double sum = 0;
    for (int w = 0; w < nwarps; ++w) sum += red[((buf ^ 1) * nwarps + w) * 2 * K + i];
    partial[(t - gridDim.x) * 2 * K + i] = sum;
  }
}

// One thread per (n, c): the tiles of sample n in order; y = z + b folded back in exactly.
__global__ void tile_stats_reduce_kernel(double* __restrict__ S1, double* __restrict__ S2,
                                         const double* __restrict__ partial, const float* __restrict__ bias,
                                         int64_t N, int K, int64_t tiles_per_sample, double V) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * K) return;
  const int64_t n = i / K;
  const int c = static_cast<int>(i % K);
  const double* pp = partial + n * tiles_per_sample * 2 * K + c;
  double a = 0, q = 0;
  for (int64_t t = 0; t < tiles_per_sample; ++t) {
    a += pp[2 * K * t];
    q += pp[2 * K * t + K];
  }
  const double bc = bias ? static_cast<double>(bias[c]) : 0.0;
  S1[i] = a + V * bc;
  S2[i] = q + 2.0 * bc * a + V * bc * bc;
}

// ---- backward: dW with y recomputed --------------------------------------------------------

// Persistent blocks over consecutive tiles; dw_partial (gridDim.x, K, 27 C): the block's dW.
// dy = A[n,c] + B[n,g] (z + bias[c]) with z = conv without bias.
template <int C, int NT, int TERMS>
__global__ void __launch_bounds__(128, 2)
grad_w_mma_kernel(float* __restrict__ dw_partial, const float* __restrict__ x, const float4* __restrict__ wfrag,
                  const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias, int G,
                  int cpg, MmaGeom g) {
  using T = Taps<C>;
  constexpr int MC = (NT + 1) / 2, MT = T::kTapTiles, NSLOT = MT * NT * 4;
  extern __shared__ float4 smem_bwd[];
  float4* wf = smem_bwd;                                            // [kSteps][MC][2][32]
  int2* tab_k = reinterpret_cast<int2*>(wf + T::kSteps * MC * 64);  // [kSteps][4]
  int2* tab_m = tab_k + T::kSteps * 4;                              // [MT][8]
  float* xs0 = reinterpret_cast<float*>(tab_m + MT * 8);            // [2][xs_floats] x tiles
  float* slots = xs0 + 2 * g.xs_floats;                             // [NSLOT][nthreads]
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5, gq = lane >> 2, tq = lane & 3;

  for (int i = tid; i < T::kSteps * MC * 64; i += nthreads) cp_async_16_full(wf + i, wfrag + i);
  stage_tap_tables<C>(tab_k, tab_m, g);
  for (int i = 0; i < NSLOT; ++i) slots[i * nthreads + tid] = 0.f;
  zero_x_tiles(xs0, g);
  __syncthreads();  // zeros before the first copies

  // As in the forward: the next tile's footprint is copied (cp.async) into the other buffer
  // while this one computes; one barrier per tile.
  const int64_t t_begin = blockIdx.x * g.tiles / gridDim.x, t_end = (blockIdx.x + 1) * g.tiles / gridDim.x;
  if (t_begin < t_end) stage_x_async<C>(xs0, x, tile_at(t_begin, g), g);
  cp_async_commit();
  for (int64_t t = t_begin; t < t_end; ++t) {
    const int buf = static_cast<int>((t - t_begin) & 1);
    const TileAt o = tile_at(t, g);
    // dy = ca + cb z for this lane's channels 16 mc + 8 r + g.
    float ca[MC][2], cb[MC][2];
#pragma unroll
    for (int mc = 0; mc < MC; ++mc)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int c = 16 * mc + 8 * r + gq;
        ca[mc][r] = cb[mc][r] = 0.f;
        if (c < g.K) {
          const float bg = B[o.n * G + c / cpg];
          cb[mc][r] = bg;
          ca[mc][r] = fmaf(bg, bias ? bias[c] : 0.f, A[o.n * g.K + c]);
        }
      }
    cp_async_wait<0>();
    __syncthreads();  // tile t's footprint is visible; every warp is done with tile t - 1's buffer
    if (t + 1 < t_end) stage_x_async<C>(xs0 + (buf ^ 1) * g.xs_floats, x, tile_at(t + 1, g), g);
    cp_async_commit();
    const float* xs = xs0 + buf * g.xs_floats;

    float accw[MT][NT][4];  // dW (taps 16 mt + g (+8), channels 8 nt + 2t (+1))
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int k = 0; k < 4; ++k) accw[mt][nt][k] = 0.f;

    // Rows (d, h) = warp, warp + nwarps, ... of TD x TH without divisions; the valid depths
    // and rows packed in one register (kept across the row loop instead of recomputed).
    const uint32_t limits = static_cast<uint32_t>(g.OD - o.d0 < g.TD ? g.OD - o.d0 : g.TD) |
                            static_cast<uint32_t>(g.OH - o.h0 < g.TH ? g.OH - o.h0 : g.TH) << 8;
    int d = 0, h = warp;
    for (;; h += nwarps) {
      while (h >= g.TH) h -= g.TH, ++d;
      if (d >= g.TD) break;
      if (d >= static_cast<int>(limits & 0xffu) || h >= static_cast<int>(limits >> 8)) continue;  // warp-uniform
      const float* row = xs + d * g.PS + h * kRS;

      // (1) y^T (channels x 32 positions) = W^T (channels x taps) . patch^T (taps x positions).
      float accy[MC][kNP][4];  // (channels 16 mc + g (+8), positions 8q + 2t (+1))
#pragma unroll
      for (int mc = 0; mc < MC; ++mc)
#pragma unroll
        for (int q = 0; q < kNP; ++q)
#pragma unroll
          for (int k = 0; k < 4; ++k) accy[mc][q][k] = 0.f;
#pragma unroll
      for (int s = 0; s < T::kSteps; ++s) {
        const int2 off = tab_k[s * 4 + tq];
        const float* p0 = row + off.x + gq;  // (tap 8s + t,     position g)
        const float* p1 = row + off.y + gq;  // (tap 8s + t + 4, position g)
        uint32_t ah[MC][4], al[MC][4];
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) {
          const float4 vh = wf[(s * MC + mc) * 64 + lane], vl = wf[(s * MC + mc) * 64 + 32 + lane];
          ah[mc][0] = __float_as_uint(vh.x), ah[mc][1] = __float_as_uint(vh.y);
          ah[mc][2] = __float_as_uint(vh.z), ah[mc][3] = __float_as_uint(vh.w);
          al[mc][0] = __float_as_uint(vl.x), al[mc][1] = __float_as_uint(vl.y);
          al[mc][2] = __float_as_uint(vl.z), al[mc][3] = __float_as_uint(vl.w);
        }
#pragma unroll
        for (int q = 0; q < kNP; ++q) {
          uint32_t bh[2], bl[2];
          split<TERMS>(p0[8 * q], bh[0], bl[0]);
          split<TERMS>(p1[8 * q], bh[1], bl[1]);
#pragma unroll
          for (int mc = 0; mc < MC; ++mc) mma_terms<TERMS>(accy[mc][q], ah[mc], al[mc], bh, bl);
        }
      }

      // (2) dy, zero at positions past OW. accy[mc][q][2r + e] is channel 16 mc + 8 r + g at
      // position 8q + 2t + e: the B fragment (k = t + 4e, n = g) of n-tile 2 mc + r in (3).
      uint32_t dh[kNP][NT][2], dl[kNP][NT][2];
#pragma unroll
      for (int q = 0; q < kNP; ++q) {
        const int64_t wpos = o.w0 + 8 * q + 2 * tq;
        const float v0 = wpos < g.OW ? 1.f : 0.f, v1 = wpos + 1 < g.OW ? 1.f : 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int mc = nt >> 1, r = nt & 1;
          const float y0 = fmaf(cb[mc][r], accy[mc][q][2 * r], ca[mc][r]) * v0;
          const float y1 = fmaf(cb[mc][r], accy[mc][q][2 * r + 1], ca[mc][r]) * v1;
          split<TERMS>(y0, dh[q][nt][0], dl[q][nt][0]);
          split<TERMS>(y1, dh[q][nt][1], dl[q][nt][1]);
        }
      }

      // (3) dW (taps x channels) += patch^T (taps x positions) . dy (positions x channels),
      // positions of each chunk in the order 2t -> k = t, 2t + 1 -> k = t + 4.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int2 off = tab_m[mt * 8 + gq];
        const float* q0 = row + off.x + 2 * tq;  // tap 16 mt + g
        const float* q1 = row + off.y + 2 * tq;  // tap 16 mt + g + 8
#pragma unroll
        for (int q = 0; q < kNP; ++q) {
          uint32_t ah[4], al[4];
          split<TERMS>(q0[8 * q], ah[0], al[0]);      // (tap g,     position 2t)
          split<TERMS>(q1[8 * q], ah[1], al[1]);      // (tap g + 8, position 2t)
          split<TERMS>(q0[8 * q + 1], ah[2], al[2]);  // (tap g,     position 2t + 1)
          split<TERMS>(q1[8 * q + 1], ah[3], al[3]);  // (tap g + 8, position 2t + 1)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_terms<TERMS>(accw[mt][nt], ah, al, dh[q][nt], dl[q][nt]);
        }
      }
    }

    // The tile's dW into the thread's slots: FP32 adds of short per-tile chains.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int k = 0; k < 4; ++k) slots[((mt * NT + nt) * 4 + k) * nthreads + tid] += accw[mt][nt][k];
  }

  // Block partial: dW (c, tap) sits in slot (mt, nt, 2 (tap % 16 / 8) + c % 2) of lane
  // 4 (tap % 8) + (c % 8) / 2 in every warp; warps added in order.
  __syncthreads();
  const int count = 8 * NT * T::kTaps;
  for (int e = tid; e < count; e += nthreads) {
    const int c = e / T::kTaps, tap = e % T::kTaps;
    const int slot = ((tap / 16) * NT + c / 8) * 4 + 2 * (tap % 16 / 8) + c % 2;
    const float* src = slots + slot * nthreads + 4 * (tap % 8) + (c % 8) / 2;
    float sum = 0.f;
    for (int w = 0; w < nwarps; ++w) sum += src[32 * w];
    dw_partial[static_cast<int64_t>(blockIdx.x) * count + e] = sum;
  }
}

// dw[e] = sum over blocks, in block order, of dw_partial[b][e] (f64: hundreds of terms).
__global__ void dw_blocks_reduce_kernel(float* __restrict__ dw, const float* __restrict__ partial, int64_t blocks,
                                        int count) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= count) return;
  double s = 0;
  for (int64_t b = 0; b < blocks; ++b) s += partial[b * count + e];
  dw[e] = static_cast<float>(s);
}

// ==== END KERNELS

// Grid of a one-thread-per-item kernel (no grid-stride loop, unlike grid_for's capped grids).
unsigned item_blocks(int64_t items, int threads) {
  const int64_t blocks = std::max<int64_t>(1, (items + threads - 1) / threads);
  TG_CHECK(blocks < (int64_t{1} << 31), "conv3d_gn_mean: ", items, " items exceed one grid");
  return static_cast<unsigned>(blocks);
}

// Shared-memory bytes of each kernel.
template <int C, int NT>
int forward_smem_bytes(const MmaGeom& g, int threads) {
  using T = Taps<C>;
  const int warps = threads / 32;
  return T::kSteps * NT * 32 * 16 + T::kSteps * 4 * 8 + 2 * warps * 2 * 8 * NT * 8 + 2 * g.xs_floats * 4;
}

template <int C, int NT>
int backward_smem_bytes(const MmaGeom& g, int threads) {
  using T = Taps<C>;
  constexpr int MC = (NT + 1) / 2;
  return T::kSteps * MC * 64 * 16 + (T::kSteps * 4 + T::kTapTiles * 8) * 8 + 2 * g.xs_floats * 4 +
         T::kTapTiles * NT * 4 * threads * 4;
}

MmaGeom geom_of(const Conv3dGnMeanProblem& p) {
  const ConvShape& s = p.conv;
  return make_mma_geom(s.N, static_cast<int>(s.C), static_cast<int>(s.K), s.in, s.out);
}

// The weight fragments of both GEMMs (tiny; recomputed per call, w may have changed).
template <int C, int NT>
Tensor weight_fragments(const Tensor& w, int terms, cudaStream_t st) {
  using T = Taps<C>;
  constexpr int MC = (NT + 1) / 2;
  const int fwd = T::kSteps * NT * 32, bwd = T::kSteps * MC * 64;  // float4s
  Tensor frags = Tensor::empty({4 * int64_t{fwd + bwd}}, {.dtype = DType::f32, .device = w.device()});
  float4* base = reinterpret_cast<float4*>(frags.data<float>());
  const int items = std::max(fwd, bwd / 2);
  weight_fragments_kernel<C, NT><<<(items + 127) / 128, 128, 0, st>>>(base, base + fwd, w.data<float>(), terms);
  TG_LAUNCH_CHECK();
  return frags;
}

// smem bytes of dynamic shared memory per block, and the largest shared-memory carveout: the
// double-buffered tiles fill an SM for workload C (forward 3 x 72.5 KB, backward
// 2 x 110.6 KB of the 228 KB, plus 1 KB reserved per block).
template <class Kernel>
void allow_shared_memory(Kernel kernel, int smem) {
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  TG_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

// Persistent grid: as many blocks as fit on the device, trimmed to the fewest that keep the
// same number of tiles per block (same makespan, fewer weight copies).
template <class Kernel>
int64_t persistent_blocks(Kernel kernel, int threads, int smem, int64_t tiles, int dev) {
  int per_sm = 0;
  TG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int sms = sm_count(dev);
  TG_CHECK(per_sm > 0, "conv3d_gn_mean: a ", threads, "-thread block with ", smem, " bytes of shared memory does not fit");
  const int64_t slots = std::clamp<int64_t>(int64_t{per_sm} * sms, 1, tiles);
  return ceil_div(tiles, ceil_div(tiles, slots));
}

template <int C, int NT, int TERMS>
void launch_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                  const Conv3dGnMeanProblem& p, int dev, cudaStream_t st) {
  const MmaGeom g = geom_of(p);
  TG_CHECK(g.tiles < (int64_t{1} << 31), "conv3d_gn_mean: ", g.tiles, " tiles exceed one grid");
  const int threads = 32 * forward_warps(g.TD * g.TH / 2);
  const int smem = forward_smem_bytes<C, NT>(g, threads);
  auto kernel = stats_mma_kernel<C, NT, TERMS>;
  allow_shared_memory(kernel, smem);
  const int64_t blocks = persistent_blocks(kernel, threads, smem, g.tiles, dev);
  Tensor frags = weight_fragments<C, NT>(w, TERMS, st);
  Tensor partial = Tensor::empty({g.tiles * 2 * g.K}, {.dtype = DType::f64, .device = x.device()});
  kernel<<<static_cast<unsigned>(blocks), threads, smem, st>>>(
      partial.data<double>(), x.data<float>(), reinterpret_cast<const float4*>(frags.data<float>()), g);
  TG_LAUNCH_CHECK();
  tile_stats_reduce_kernel<<<item_blocks(g.N * g.K, 256), 256, 0, st>>>(
      S1.data<double>(), S2.data<double>(), partial.data<double>(), b.defined() ? b.data<float>() : nullptr, g.N,
      g.K, g.tiles_per_sample, static_cast<double>(p.volume()));
  TG_LAUNCH_CHECK();
}

template <int C, int NT, int TERMS>
void launch_grad_weight(const Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& A,
                        const Tensor& B, const Conv3dGnMeanProblem& p, int dev, cudaStream_t st) {
  using T = Taps<C>;
  constexpr int kThreads = 128;
  const MmaGeom g = geom_of(p);
  const int smem = backward_smem_bytes<C, NT>(g, kThreads);
  auto kernel = grad_w_mma_kernel<C, NT, TERMS>;
  allow_shared_memory(kernel, smem);
  int per_sm = 0;
  TG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  const int sms = sm_count(dev);
  const int64_t blocks = std::clamp<int64_t>(int64_t{per_sm} * sms, 1, g.tiles);
  const int count = g.K * T::kTaps;
  Tensor frags = weight_fragments<C, NT>(w, TERMS, st);
  Tensor partial = Tensor::empty({blocks * count}, {.dtype = DType::f32, .device = x.device()});
  const float4* wf_bwd = reinterpret_cast<const float4*>(frags.data<float>()) + T::kSteps * NT * 32;
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, st>>>(
      partial.data<float>(), x.data<float>(), wf_bwd, A.data<float>(), B.data<float>(),
      b.defined() ? b.data<float>() : nullptr, static_cast<int>(p.groups), static_cast<int>(p.channels_per_group()),
      g);
  TG_LAUNCH_CHECK();
  dw_blocks_reduce_kernel<<<(count + 255) / 256, 256, 0, st>>>(dw.data<float>(), partial.data<float>(), blocks, count);
  TG_LAUNCH_CHECK();
}

// Instantiated shape classes: (C_in, K / 8) in {(3, 3), (1, 3)}; conv3d_gn_mean_mma_applies
// (conv3d_gn_mean.cu) admits exactly these. TERMS: 1 in TF32 mode, else fp32_terms (2 for the
// forward, 3 for the backward).
template <template <int, int, int> class Launch, int kFp32Terms, class... Args>
void dispatch_shape(const Conv3dGnMeanProblem& p, bool tf32, Args&&... args) {
  const int64_t C = p.conv.C, K = p.conv.K;
  TG_CHECK(K == 24 && (C == 3 || C == 1), "conv3d_gn_mean: no tensor-core kernel for C_in ", C, ", K ", K);
  if (C == 3) {
    if (tf32) Launch<3, 3, 1>::run(args...);
    else Launch<3, 3, kFp32Terms>::run(args...);
  } else {
    if (tf32) Launch<1, 3, 1>::run(args...);
    else Launch<1, 3, kFp32Terms>::run(args...);
  }
}

template <int C, int NT, int TERMS>
struct StatsLaunch {
  template <class... Args>
  static void run(Args&&... args) { launch_stats<C, NT, TERMS>(args...); }
};

template <int C, int NT, int TERMS>
struct GradWeightLaunch {
  template <class... Args>
  static void run(Args&&... args) { launch_grad_weight<C, NT, TERMS>(args...); }
};

}  // namespace

void conv3d_gn_mean_mma_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                              const Conv3dGnMeanProblem& p, bool tf32) {
  const int dev = x.device().index;
  set_device(dev);
  if (p.conv.N == 0) return;
  dispatch_shape<StatsLaunch, 2>(p, tf32, S1, S2, x, w, b, p, dev, stream(dev));
}

void conv3d_gn_mean_mma_grad_weight(const Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& b,
                                    const Tensor& A, const Tensor& B, const Conv3dGnMeanProblem& p, bool tf32) {
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  if (p.conv.N == 0) {
    TG_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), st));
    return;
  }
  dispatch_shape<GradWeightLaunch, 3>(p, tf32, dw, x, w, b, A, B, p, dev, st);
}

}  // namespace tg::cuda
