// Shared pieces of the FFMA kernels of the fused Conv3d(3x3x3) -> GroupNorm -> mean (workload C):
// the tile geometry, staging of weights and input footprints, phase A (the register-tiled conv
// of one tile), and the host helpers of the launchers in conv3d_gn_mean/dispatch.cu,
// conv3d_gn_mean/stats_ffma.cu and conv3d_gn_mean/grad_ffma.cu. Design and precision contract:
// docs/kernels/conv3d_gn_mean.md.
//
// Tiles: kP depths x TH rows x TW columns of one sample; a block stages the input footprint in smem
// (zeros past the input, depth innermost), then "phase A": a thread owns one (h, w) and CA channels
// and computes CA x kP outputs in registers (weights as [ci][kh][kw][kd][c]).
#pragma once
#include <algorithm>
#include <cstdint>

#include "../../../core/cuda_context.h"
#include "../arch/hopper.h"
#include "../arch/int_math.h"
#include "../conv.h"
#include "../fused.h"

namespace tg::cuda::conv3d_gn_mean_detail {

constexpr int kThreads = 256;  // every kernel of this file but the 128-thread stats variant
constexpr int kWarps = kThreads / 32;
constexpr int kP = 4;          // output depths per thread (the register tile along d)
constexpr int kCG = 8;         // channels per phase-B owner
constexpr int kCinChunk = 4;   // input channels per pass of phase C
constexpr int kXD = kP + 2;    // depths of a tile's input footprint (innermost in the x tile)
constexpr int kMaxWeightFloats = 8192;         // 32 KB of weights in shared memory
constexpr int kMaxGradSmemBytes = 112 * 1024;  // two blocks per SM (228 KB, 1 KB reserved each)

// Channels per thread in phase A: 12 (two chunks for K = 24), or 8 for other K. The padded
// channel count is a multiple of both the chunk and kCG.
inline int channel_chunk(int64_t K) { return K % 24 == 0 ? 12 : 8; }
inline int64_t padded_channels(int64_t K) { return (K + 7) / 8 * 8; }  // K itself when K % 24 == 0

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;  // complete in lane 0
}

// ---- tiles ---------------------------------------------------------------------------------

struct TileGeom {
  int C, K, Kpad, CA, chunks, G, cpg;
  int64_t N, D, H, W, OD, OH, OW;
  int TH, TW, FH, FW;          // output tile kP x TH x TW; its input footprint (TH+2, TW+2)
  int threads;                 // block size the tile was cut for (phase-A items <= threads)
  int plane, items;            // TH * TW; phase-A items chunks * plane
  int64_t NDT, NHT, NWT, tiles_per_sample, tiles;
  int xs_h, xs_c;              // x tile strides in floats: [C][FH][FW][kXD], depth innermost
  int ds;                      // dy tile: floats per position (Kpad + 4: conflict-free float4)
  int R, owners, PS;           // phase B: rows (ci, kd, kh) = 9 C; owners R Kpad / kCG; subsets
  int off_coef, off_x, off_slots, off_dy;  // shared-memory regions, in floats
  int stats_smem_floats, grad_smem_floats;
  bool with_dx;
};

// Even stride >= min_stride for the input channels of the x tile that spreads the phase-B
// reads of one warp (rows r = 9 ci + 3 kd + kh, bank = ci xs_c + kh xs_h + kd) over the most
// banks.
inline int best_channel_stride(int64_t min_stride, int xs_h, int C) {
  int best = 0, best_worst = 1 << 30;
  for (int k = 0; k < 16; ++k) {
    const int sc = round_up(min_stride, 2) + 2 * k;
    int count[32] = {};
    for (int r = 0; r < std::min(32, 9 * C); ++r) {
      const int ci = r / 9, kd = (r / 3) % 3, kh = r % 3;
      ++count[(ci * sc + kh * xs_h + kd) % 32];
    }
    const int worst = *std::max_element(count, count + 32);
    if (worst < best_worst) best = sc, best_worst = worst;
  }
  return best;
}

// Footprint, strides and shared-memory regions of a tile of TH x TW (set in g).
inline void set_tile_layout(TileGeom& g) {
  g.FH = g.TH + 2;
  g.FW = g.TW + 2;
  g.plane = g.TH * g.TW;
  g.items = g.chunks * g.plane;
  // A row is as long as TW + 32/6 columns, so that a warp's phase-A reads keep their bank
  // pattern across a row change; the channel stride is the even one (float2 alignment) with
  // the fewest phase-B bank conflicts among the 27 rows (ci, kd, kh) of a warp.
  g.xs_h = kXD * g.TW + 32;
  g.xs_c = best_channel_stride(int64_t{g.FH} * g.xs_h, g.xs_h, g.C);
  g.ds = g.Kpad + 4;
  g.R = 9 * g.C;
  g.owners = g.R * (g.Kpad / kCG);
  g.PS = std::max(1, g.threads / std::max(1, g.owners));
  g.off_coef = round_up(int64_t{g.C} * 27 * g.Kpad, 4);
  g.off_x = g.off_coef + round_up(2 * int64_t{g.Kpad}, 4);
  g.off_slots = g.off_x + round_up(int64_t{g.C} * g.xs_c, 4);
  g.off_dy = g.off_slots + std::max(2 * g.CA, 3 * kCG) * g.threads;
  g.stats_smem_floats = g.off_dy;
  g.grad_smem_floats = g.off_dy + round_up(int64_t{kP} * g.plane * g.ds, 4);
}

inline TileGeom make_tile_geom(const Conv3dGnMeanProblem& p, int threads) {
  const ConvShape& s = p.conv;
  TileGeom g{};
  g.C = static_cast<int>(s.C);
  g.K = static_cast<int>(s.K);
  g.Kpad = static_cast<int>(padded_channels(s.K));
  g.threads = threads;
  g.CA = channel_chunk(s.K);
  g.chunks = g.Kpad / g.CA;
  g.G = static_cast<int>(p.groups);
  g.cpg = static_cast<int>(p.channels_per_group());
  g.N = s.N;
  g.D = s.in[0], g.H = s.in[1], g.W = s.in[2];
  g.OD = s.out[0], g.OH = s.out[1], g.OW = s.out[2];
  // Columns: W' split evenly into pieces of at most 32 (and few enough that every item of a
  // tile has its own thread); rows: as many as fill the block, split evenly too, and fewer
  // where the shared memory of two blocks per SM would not hold them (large C_in).
  const int64_t max_tw = std::max<int64_t>(1, std::min<int64_t>(32, threads / g.chunks));
  g.NWT = (g.OW + max_tw - 1) / max_tw;
  g.TW = static_cast<int>((g.OW + g.NWT - 1) / g.NWT);
  for (int64_t max_th = std::clamp<int64_t>(threads / (int64_t{g.chunks} * g.TW), 1, g.OH);; --max_th) {
    g.NHT = (g.OH + max_th - 1) / max_th;
    g.TH = static_cast<int>((g.OH + g.NHT - 1) / g.NHT);
    set_tile_layout(g);
    if (max_th == 1 || g.grad_smem_floats * int64_t{sizeof(float)} <= kMaxGradSmemBytes) break;
  }
  g.NDT = (g.OD + kP - 1) / kP;
  g.tiles_per_sample = g.NDT * g.NHT * g.NWT;
  g.tiles = g.N * g.tiles_per_sample;
  return g;
}

// w (K, C, 3, 3, 3) -> shared [ci][kh][kw][kd][Kpad], zero in the padded channels.
__device__ inline void stage_weights(float* ws, const float* __restrict__ w, const TileGeom& g) {
  const int n = g.C * 27 * g.Kpad;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int c = i % g.Kpad, tap = i / g.Kpad;  // tap = ((ci*3 + kh)*3 + kw)*3 + kd
    const int kd = tap % 3, kw = (tap / 3) % 3, kh = (tap / 9) % 3, ci = tap / 27;
    ws[i] = c < g.K ? w[((static_cast<int64_t>(c) * g.C + ci) * 3 + kd) * 9 + kh * 3 + kw] : 0.f;
  }
}

struct TileOrigin {
  int64_t n, d0, h0, w0;
};

// Global tile t = ((n * NDT + dt) * NHT + ht) * NWT + wt.
__device__ __forceinline__ TileOrigin tile_origin(int64_t t, const TileGeom& g) {
  const int64_t wt = t % g.NWT, ht = (t / g.NWT) % g.NHT, dt = (t / (g.NWT * g.NHT)) % g.NDT;
  return {t / g.tiles_per_sample, dt * kP, ht * g.TH, wt * g.TW};
}

// The tile's input footprint into xs [C][FH][FW][kXD] (padded strides), zeros past the
// input. Consecutive threads read consecutive w: coalesced.
__device__ inline void stage_x_tile(float* xs, const float* __restrict__ x, const TileOrigin& o, const TileGeom& g) {
  const float* xn = x + o.n * g.C * g.D * g.H * g.W;  // (C, D, H, W)
  const int fplane = g.FH * g.FW, count = g.C * (kP + 2) * fplane;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int xw = i % g.FW, xh = (i / g.FW) % g.FH, xd = (i / fplane) % (kP + 2), ci = i / (fplane * (kP + 2));
    const int64_t gd = o.d0 + xd, gh = o.h0 + xh, gw = o.w0 + xw;
    float v = 0.f;
    if (gd < g.D && gh < g.H && gw < g.W) v = __ldg(xn + ((ci * g.D + gd) * g.H + gh) * g.W + gw);
    xs[ci * g.xs_c + xh * g.xs_h + xw * kXD + xd] = v;
  }
}

// acc[c][p] = sum_{ci,kd,kh,kw} w[c][ci][kd][kh][kw] * x[ci][p + kd][hh + kh][ww + kw] (tile
// coordinates) for CA channels starting at ws and PP depths; xhw = xs + hh * xs_h + ww * kXD.
// The PP + 2 depths of one (ci, kh, kw) are contiguous: (PP + 2) / 2 float2 loads, and
// consecutive lanes (consecutive ww, 6 words apart) hit distinct banks in each half-warp.
// The (ci, kh) loop stays rolled: unrolled, the compiler hoists every row's loads and their
// addresses, which costs tens of registers and halves occupancy.
template <int CA, int PP>
__device__ __forceinline__ void conv_tile(float (&acc)[CA][PP], const float* ws, const float* xhw, const TileGeom& g) {
#pragma unroll
  for (int c = 0; c < CA; ++c)
#pragma unroll
    for (int p = 0; p < PP; ++p) acc[c][p] = 0.f;
#pragma unroll 1
  for (int cikh = 0; cikh < 3 * g.C; ++cikh) {
    const int ci = cikh / 3, kh = cikh - 3 * ci;
    const float* xr = xhw + ci * g.xs_c + kh * g.xs_h;
    float xv[3][PP + 2];  // [kw][depth]
#pragma unroll
    for (int kw = 0; kw < 3; ++kw)
#pragma unroll
      for (int j = 0; j < PP + 2; j += 2) {
        const float2 v = *reinterpret_cast<const float2*>(xr + kw * kXD + j);
        xv[kw][j] = v.x;
        xv[kw][j + 1] = v.y;
      }
    const float* wrow = ws + cikh * 9 * g.Kpad;  // [kw][kd][Kpad]
#pragma unroll
    for (int kw = 0; kw < 3; ++kw)
#pragma unroll
      for (int kd = 0; kd < 3; ++kd) {
        const float* wk = wrow + (kw * 3 + kd) * g.Kpad;
#pragma unroll
        for (int c = 0; c < CA; c += 4) {
          const float4 wv = *reinterpret_cast<const float4*>(wk + c);
#pragma unroll
          for (int p = 0; p < PP; ++p) {
            acc[c + 0][p] = fmaf(wv.x, xv[kw][p + kd], acc[c + 0][p]);
            acc[c + 1][p] = fmaf(wv.y, xv[kw][p + kd], acc[c + 1][p]);
            acc[c + 2][p] = fmaf(wv.z, xv[kw][p + kd], acc[c + 2][p]);
            acc[c + 3][p] = fmaf(wv.w, xv[kw][p + kd], acc[c + 3][p]);
          }
        }
      }
  }
}

// Grid of a one-thread-per-item kernel (no grid-stride loop, unlike grid_for's capped grids).
inline unsigned item_blocks(int64_t items, int threads) {
  const int64_t blocks = std::max<int64_t>(1, (items + threads - 1) / threads);
  TG_CHECK(blocks < (int64_t{1} << 31), "conv3d_gn_mean: ", items, " items exceed one grid");
  return static_cast<unsigned>(blocks);
}

// Blocks of `kernel` that fit on the whole device at once.
template <class Kernel>
int64_t resident_blocks(Kernel kernel, int threads, int smem_bytes, int device) {
  allow_dynamic_smem(kernel, smem_bytes);
  int per_sm = 0;
  TG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  return std::max<int64_t>(1, int64_t{per_sm} * sm_count(device));
}

inline const float* ptr_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

// Whether the launchers take the tensor-core kernels, or the FFMA fused kernels (conv3d_gn_mean/dispatch.cu).
bool use_tensor_cores(const Conv3dGnMeanProblem& p, DType dtype, Conv3dGnMeanKernels kernels);
bool use_ffma(const Conv3dGnMeanProblem& p, DType dtype, Conv3dGnMeanKernels kernels);
// y = conv3d(x, w) + b through the general convolution kernels (the materialized path).
Tensor conv_output(const Tensor& x, const Tensor& w, const Tensor& b, const Conv3dGnMeanProblem& p);

}  // namespace tg::cuda::conv3d_gn_mean_detail
