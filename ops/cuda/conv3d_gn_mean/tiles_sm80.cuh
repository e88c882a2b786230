// Shared device pieces of the tensor-core kernels of the fused Conv3d(3x3x3) -> GroupNorm -> mean
// (workload C; conv3d_gn_mean/stats_sm80.cu, conv3d_gn_mean/grad_sm80.cu): the tap order, the tile
// geometry, the split-TF32 products, the weight fragments and the cp.async staging of the input
// footprint. Design, precision contract and the floor: docs/kernels/conv3d_gn_mean.md.
//
// Shapes: C_in in {1, 3}, K = 8 NT (instantiated: K = 24), any N, D, H, W. Tiles are TD depths x
// TH rows (even) x kTW = 32 columns of one sample; the footprint x[:, TD+2, TH+2, 34] is staged
// double-buffered by cp.async (only elements inside the input; both buffers zeroed once per block,
// the rest is read only by skipped or masked outputs and must merely be finite). Row, plane and
// channel strides 11, 3, 7 mod 32 keep every fragment gather conflict-free. Taps
// k = ci*27 + kd*9 + kh*3 + kw, padded with zero-weight taps (C_in 3 forward: TapGroups3 order).
//  weight_fragments  w -> per-lane fragments, split once (forward B, backward A).
#pragma once
#include <algorithm>
#include <cstdint>

#include "../arch/cp_async.cuh"
#include "../arch/int_math.h"
#include "../arch/mma_sync.cuh"
#include "../arch/tf32.cuh"

namespace tg::cuda::conv3d_gn_mean_mma_detail {

__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

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
__device__ inline void stage_tap_tables(int2* by_t, int2* by_g, const MmaGeom& g) {
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
__device__ inline void stage_x_async(float* xs, const float* __restrict__ x, const TileAt& o, const MmaGeom& g) {
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
__device__ inline void zero_x_tiles(float* xs0, const MmaGeom& g) {
  for (int i = threadIdx.x; i < 2 * g.xs_floats; i += blockDim.x) xs0[i] = 0.f;
}

}  // namespace tg::cuda::conv3d_gn_mean_mma_detail
