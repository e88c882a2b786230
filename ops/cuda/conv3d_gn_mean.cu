// Fused Conv3d(3x3x3) -> GroupNorm -> mean (workload C): the launchers, the FFMA kernels and the
// small statistics kernels. y is recomputed wherever it is needed and never written. The launchers
// pick the tensor-core kernels (conv3d_gn_mean_mma.cu) for their shape class and for dW without
// dx; the FFMA kernels serve other channel counts and dx and are FP32-accurate under either
// tg::precision(). Design and precision contract: docs/kernels/conv3d_gn_mean.md.
//
// Tiles: kP depths x TH rows x TW columns of one sample; a block stages the input footprint in smem
// (zeros past the input, depth innermost), then "phase A": a thread owns one (h, w) and CA channels
// and computes CA x kP outputs in registers (weights as [ci][kh][kw][kd][c]).
//  stats_kernel      phase A, sums of z and z^2 (z = y - bias) in thread-private slots, fixed-order
//                    block sum -> f64 partials per (sample, block); blocks never straddle samples.
//  stats_reduce      partials in block order -> S1, S2 (N, K) in f64, bias folded back in.
//  finish / coef /   group stats, the output, the dL/dy = A + B y coefficients, dgamma, dbeta,
//  param_grads       db (closed form).
//  grad_conv_kernel  persistent: phase A writes dy = A + B y to smem; phase B accumulates dW in
//                    registers (thread-private slots between tiles); phase C (dx wanted) writes
//                    the transposed conv of the footprint as a per-tile partial.
//  dw_reduce         per-block dW partials in block order -> dw.
//  dx_reduce         every x element sums the tile footprints that cover it, in order.
// Deterministic: no atomics; every reduction has a fixed order for a given device.
#include <algorithm>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "core/precision.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv3d_gn_mean_mma.h"
#include "ops/cuda/fused.h"

namespace tg::cuda {
namespace {

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
int channel_chunk(int64_t K) { return K % 24 == 0 ? 12 : 8; }
int64_t padded_channels(int64_t K) { return (K + 7) / 8 * 8; }  // K itself when K % 24 == 0

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
int best_channel_stride(int64_t min_stride, int xs_h, int C) {
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
void set_tile_layout(TileGeom& g) {
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

TileGeom make_tile_geom(const Conv3dGnMeanProblem& p, int threads) {
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
__device__ void stage_weights(float* ws, const float* __restrict__ w, const TileGeom& g) {
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
__device__ void stage_x_tile(float* xs, const float* __restrict__ x, const TileOrigin& o, const TileGeom& g) {
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

// ---- forward: statistics ------------------------------------------------------------------

// Adds this item's sums of z and z^2 over its valid outputs to the thread's slots
// [2 CA][NT] (thread-private: no synchronization).
template <int CA, int NT, int PP>
__device__ __forceinline__ void stats_item(float* slots, const float* ws, const float* xs, const TileGeom& g,
                                           const TileOrigin& o, int chunk, int hh, int ww) {
  float acc[CA][PP];
  conv_tile<CA, PP>(acc, ws + chunk * CA, xs + hh * g.xs_h + ww * kXD, g);
  const bool hw_valid = o.h0 + hh < g.OH && o.w0 + ww < g.OW;
#pragma unroll
  for (int c = 0; c < CA; ++c) {
    float a = 0.f, q = 0.f;
#pragma unroll
    for (int p = 0; p < PP; ++p) {
      const float z = (hw_valid && o.d0 + p < g.OD) ? acc[c][p] : 0.f;
      a += z;
      q = fmaf(z, z, q);
    }
    slots[c * NT + threadIdx.x] += a;
    slots[(CA + c) * NT + threadIdx.x] += q;
  }
}

// Grid: N * B blocks; block (n, b) covers tiles [b T / B, (b + 1) T / B) of sample n and
// writes partial[(n * B + b) * 2 + stat][Kpad] in f64.
// NT threads: 256, or 128 where the tiles of a 128-thread block waste fewer threads (30 x 30
// planes: 2 rows x 30 x 2 chunks = 120 items, rows split exactly), 4 blocks per SM then.
template <int CA, int NT>
__global__ void __launch_bounds__(NT, 512 / NT)
stats_kernel(double* __restrict__ partial, const float* __restrict__ x, const float* __restrict__ w, int64_t B,
             TileGeom g) {
  extern __shared__ float4 smem_stats[];
  float* ws = reinterpret_cast<float*>(smem_stats);
  float* xs = ws + g.off_x;
  float* slots = ws + g.off_slots;  // [2 CA][NT]
  stage_weights(ws, w, g);
  for (int k = 0; k < 2 * CA; ++k) slots[k * NT + threadIdx.x] = 0.f;
  const int64_t n = blockIdx.x / B, b = blockIdx.x % B;
  const int64_t ts0 = b * g.tiles_per_sample / B, ts1 = (b + 1) * g.tiles_per_sample / B;
  const int tid = threadIdx.x;
  const int chunk = tid / g.plane, pos = tid % g.plane, hh = pos / g.TW, ww = pos % g.TW;
  for (int64_t ts = ts0; ts < ts1; ++ts) {
    const TileOrigin o = tile_origin(n * g.tiles_per_sample + ts, g);
    __syncthreads();  // everyone is done with the previous tile's xs
    stage_x_tile(xs, x, o, g);
    __syncthreads();
    if (tid < g.items) {
      // Block-uniform: a last depth chunk with <= 2 outputs left runs the half-size tile.
      if (g.OD - o.d0 > 2) stats_item<CA, NT, kP>(slots, ws, xs, g, o, chunk, hh, ww);
      else stats_item<CA, NT, 2>(slots, ws, xs, g, o, chunk, hh, ww);
    }
  }
  __syncthreads();
  // Channel c's sums live in the slots of the plane threads of its chunk: add them in order.
  for (int e = tid; e < 2 * g.Kpad; e += NT) {
    const int stat = e / g.Kpad, c = e % g.Kpad, ch = c / CA, cl = c % CA;
    const float* src = slots + (stat * CA + cl) * NT + ch * g.plane;
    double s = 0;
    for (int k = 0; k < g.plane; ++k) s += src[k];
    partial[(blockIdx.x * 2 + stat) * static_cast<int64_t>(g.Kpad) + c] = s;
  }
}

// One thread per (n, c): block partials in order, then y = z + b folded back in exactly.
__global__ void stats_reduce_kernel(double* __restrict__ S1, double* __restrict__ S2, const double* __restrict__ partial,
                                    const float* __restrict__ bias, int64_t N, int K, int Kpad, int64_t B, double V) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * K) return;
  const int64_t n = i / K;
  const int c = static_cast<int>(i % K);
  const double* pp = partial + n * B * 2 * Kpad + c;
  double a = 0, q = 0;
  for (int64_t b = 0; b < B; ++b) {
    a += pp[(2 * b) * Kpad];
    q += pp[(2 * b + 1) * Kpad];
  }
  const double bc = bias ? static_cast<double>(bias[c]) : 0.0;
  S1[i] = a + V * bc;
  S2[i] = q + 2.0 * bc * a + V * bc * bc;
}

// ---- materialized path (problems outside the fused shape class, and f64) -------------------

template <class T>
__global__ void sums_kernel(double* __restrict__ S1, double* __restrict__ S2, const T* __restrict__ y, int64_t V) {
  const T* row = y + static_cast<int64_t>(blockIdx.x) * V;  // one (n, c)
  double a = 0, q = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const double e = row[v];
    a += e;
    q += e * e;
  }
  __shared__ double sa[kWarps], sq[kWarps];
  a = warp_sum(a);
  q = warp_sum(q);
  if ((threadIdx.x & 31) == 0) {
    sa[threadIdx.x / 32] = a;
    sq[threadIdx.x / 32] = q;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double ta = 0, tq = 0;
    for (int k = 0; k < kWarps; ++k) {
      ta += sa[k];
      tq += sq[k];
    }
    S1[blockIdx.x] = ta;
    S2[blockIdx.x] = tq;
  }
}

// y <- A[n,c] + B[n,g] * y, in place.   y (N, K, V)
template <class T>
__global__ void affine_dy_kernel(T* __restrict__ y, const T* __restrict__ A, const T* __restrict__ B, int64_t total,
                                 int64_t K, int64_t G, int64_t cpg, int64_t V) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t nc = i / V, n = nc / K, c = nc % K;
    y[i] = A[nc] + B[n * G + c / cpg] * y[i];
  }
}

// ---- group statistics, output, backward coefficients (tiny) --------------------------------

struct SmallGeom {
  int64_t N, K, G, cpg;
  double V, eps;
};

template <class T>
__device__ __forceinline__ double param_or(const T* p, int64_t c, double fallback) {
  return p ? static_cast<double>(p[c]) : fallback;
}

template <class T>
__global__ void finish_kernel(T* __restrict__ out, double* __restrict__ mean, double* __restrict__ rstd,
                              const double* __restrict__ S1, const double* __restrict__ S2,
                              const T* __restrict__ gamma, const T* __restrict__ beta, SmallGeom g) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= g.N) return;
  double acc = 0;
  for (int64_t gi = 0; gi < g.G; ++gi) {
    double a = 0, q = 0;
    for (int64_t c = gi * g.cpg; c < (gi + 1) * g.cpg; ++c) {
      a += S1[n * g.K + c];
      q += S2[n * g.K + c];
    }
    const double m = a / (g.cpg * g.V);
    const double var = fmax(q / (g.cpg * g.V) - m * m, 0.0);
    const double r = 1.0 / sqrt(var + g.eps);
    mean[n * g.G + gi] = m;
    rstd[n * g.G + gi] = r;
    for (int64_t c = gi * g.cpg; c < (gi + 1) * g.cpg; ++c)
      acc += param_or(gamma, c, 1.0) * (S1[n * g.K + c] / g.V - m) * r + param_or(beta, c, 0.0);
  }
  out[n] = static_cast<T>(acc / g.K);
}

// For sample n and group gi: B (returned) and the group's sum of a_c = gout gamma_c / K.
// Same formulas as the CPU reference (ops/cpu/fused.cpp).
template <class T>
__device__ double group_b(const T* gout, const double* S1, const double* mean, const double* rstd, const T* gamma,
                          const SmallGeom& g, int64_t n, int64_t gi, double& sum_a) {
  const double m = mean[n * g.G + gi], r = rstd[n * g.G + gi];
  double sa = 0, sam = 0;
  for (int64_t c = gi * g.cpg; c < (gi + 1) * g.cpg; ++c) {
    const double a = static_cast<double>(gout[n]) * param_or(gamma, c, 1.0) / g.K;
    sa += a;
    sam += a * S1[n * g.K + c] / g.V;
  }
  sum_a = sa;
  return -(sam - m * sa) * r * r * r / (g.cpg * g.V);
}

template <class T>
__device__ double coef_a(const T* gout, const double* mean, const double* rstd, const T* gamma, const SmallGeom& g,
                         int64_t n, int64_t c, double bg, double sum_a) {
  const int64_t gi = c / g.cpg;
  const double a = static_cast<double>(gout[n]) * param_or(gamma, c, 1.0) / g.K;
  return rstd[n * g.G + gi] * (a - sum_a / g.cpg) / g.V - bg * mean[n * g.G + gi];
}

// One thread per (n, group): A (N, K), B (N, G).
template <class T>
__global__ void coef_kernel(T* __restrict__ A, T* __restrict__ B, const T* __restrict__ gout,
                            const double* __restrict__ S1, const double* __restrict__ mean,
                            const double* __restrict__ rstd, const T* __restrict__ gamma, SmallGeom g) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= g.N * g.G) return;
  const int64_t n = i / g.G, gi = i % g.G;
  double sum_a;
  const double bg = group_b(gout, S1, mean, rstd, gamma, g, n, gi, sum_a);
  B[i] = static_cast<T>(bg);
  for (int64_t c = gi * g.cpg; c < (gi + 1) * g.cpg; ++c)
    A[n * g.K + c] = static_cast<T>(coef_a(gout, mean, rstd, gamma, g, n, c, bg, sum_a));
}

// One thread per channel, samples in order: dgamma, dbeta, db (each optional), in f64.
template <class T>
__global__ void param_grads_kernel(T* __restrict__ dgamma, T* __restrict__ dbeta, T* __restrict__ db,
                                   const T* __restrict__ gout, const double* __restrict__ S1,
                                   const double* __restrict__ mean, const double* __restrict__ rstd,
                                   const T* __restrict__ gamma, SmallGeom g) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= g.K) return;
  const int64_t gi = c / g.cpg;
  double dg = 0, dbt = 0, dbias = 0;
  for (int64_t n = 0; n < g.N; ++n) {
    const double s = static_cast<double>(gout[n]) / g.K;
    dg += s * (S1[n * g.K + c] / g.V - mean[n * g.G + gi]) * rstd[n * g.G + gi];
    dbt += s;
    if (db) {
      double sum_a;
      const double bg = group_b(gout, S1, mean, rstd, gamma, g, n, gi, sum_a);
      dbias += coef_a(gout, mean, rstd, gamma, g, n, c, bg, sum_a) * g.V + bg * S1[n * g.K + c];
    }
  }
  if (dgamma) dgamma[c] = static_cast<T>(dg);
  if (dbeta) dbeta[c] = static_cast<T>(dbt);
  if (db) db[c] = static_cast<T>(dbias);
}

// ---- backward: dW (and dx) with y recomputed per tile --------------------------------------

// Phase A of the backward: dy = A' + B z for this item into dys [kP][TH][TW][ds], zero where
// the output does not exist (so phases B and C may read the whole tile).
template <int CA, int PP>
__device__ __forceinline__ void dy_item(float* dys, const float* coef, const float* ws, const float* xs,
                                        const TileGeom& g, const TileOrigin& o, int chunk, int hh, int ww) {
  float acc[CA][PP];
  conv_tile<CA, PP>(acc, ws + chunk * CA, xs + hh * g.xs_h + ww * kXD, g);
  const bool hw_valid = o.h0 + hh < g.OH && o.w0 + ww < g.OW;
  const float* ca = coef + chunk * CA;             // A + B bias
  const float* cb = coef + g.Kpad + chunk * CA;    // B
#pragma unroll
  for (int p = 0; p < kP; ++p) {
    const bool valid = p < PP && hw_valid && o.d0 + p < g.OD;
    float* dst = dys + ((p * g.TH + hh) * g.TW + ww) * g.ds + chunk * CA;
#pragma unroll
    for (int c = 0; c < CA; c += 4) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (valid) {
        const int pp = p < PP ? p : 0;  // keeps the index in range; unused when !valid
        v.x = fmaf(cb[c + 0], acc[c + 0][pp], ca[c + 0]);
        v.y = fmaf(cb[c + 1], acc[c + 1][pp], ca[c + 1]);
        v.z = fmaf(cb[c + 2], acc[c + 2][pp], ca[c + 2]);
        v.w = fmaf(cb[c + 3], acc[c + 3][pp], ca[c + 3]);
      }
      *reinterpret_cast<float4*>(dst + c) = v;
    }
  }
}

// Persistent blocks over consecutive tiles (any samples). Outputs:
//   dw_partial (gridDim.x, owners, kCG, 3): this block's dW, position subsets summed in order;
//   dx_partial (tiles, C, kP + 2, FH, FW) when g.with_dx: each tile's transposed conv.
template <int CA>
__global__ void __launch_bounds__(kThreads, 2)
grad_conv_kernel(float* __restrict__ dw_partial, float* __restrict__ dx_partial, const float* __restrict__ x,
                 const float* __restrict__ w, const float* __restrict__ bias, const float* __restrict__ A,
                 const float* __restrict__ B, TileGeom g) {
  extern __shared__ float4 smem_grad[];
  float* ws = reinterpret_cast<float*>(smem_grad);  // [C][3][3][3][Kpad]
  float* coef = ws + g.off_coef;                     // [2][Kpad]: A + B bias, and B, per channel
  float* xs = ws + g.off_x;                          // [C][kP+2][FH][FW], padded strides
  float* slots = ws + g.off_slots;                   // [kCG * 3][kThreads]: phase-B accumulators
  float* dys = ws + g.off_dy;                        // [kP][TH][TW][ds]
  stage_weights(ws, w, g);

  const int tid = threadIdx.x;
  const int chunk = tid / g.plane, pos = tid % g.plane, hh = pos / g.TW, ww = pos % g.TW;
  // Phase-B ownership, fixed for the block: rows r = 9 ci + 3 kd + kh are consecutive across
  // lanes (the x tile's channel stride is chosen to spread those rows over the banks).
  const bool owner = tid < g.owners * g.PS;
  const int o_id = tid % g.owners, ps = tid / g.owners;
  const int r = o_id % g.R, cg = o_id / g.R;
  const int ci_b = r / 9, kd_b = (r / 3) % 3, kh_b = r % 3;
  for (int k = 0; k < 3 * kCG; ++k) slots[k * kThreads + tid] = 0.f;

  const int64_t t_begin = blockIdx.x * g.tiles / gridDim.x, t_end = (blockIdx.x + 1) * g.tiles / gridDim.x;
  for (int64_t t = t_begin; t < t_end; ++t) {
    const TileOrigin o = tile_origin(t, g);
    __syncthreads();  // the previous tile's readers are done with xs, dys and coef
    stage_x_tile(xs, x, o, g);
    for (int c = tid; c < g.Kpad; c += kThreads) {
      float a = 0.f, b = 0.f;
      if (c < g.K) {
        b = B[o.n * g.G + c / g.cpg];
        a = fmaf(b, bias ? bias[c] : 0.f, A[o.n * g.K + c]);  // dy = A + B (z + bias)
      }
      coef[c] = a;
      coef[g.Kpad + c] = b;
    }
    __syncthreads();

    if (tid < g.items) {
      if (g.OD - o.d0 > 2) dy_item<CA, kP>(dys, coef, ws, xs, g, o, chunk, hh, ww);
      else dy_item<CA, 2>(dys, coef, ws, xs, g, o, chunk, hh, ww);
    }
    __syncthreads();

    // Phase B: dW[c][ci][kd][kh][kw] += sum over the tile of dy[c] * x, sliding along w.
    if (owner) {
      const int vw = static_cast<int>(min64(g.TW, g.OW - o.w0));
      const int vd = static_cast<int>(min64(kP, g.OD - o.d0)), vh = static_cast<int>(min64(g.TH, g.OH - o.h0));
      const int w_lo = ps * vw / g.PS, w_hi = (ps + 1) * vw / g.PS;
      // Per-tile sums first, then added to the slots: two short f32 sums instead of one of
      // thousands of terms per thread.
      float acc[kCG][3];
#pragma unroll
      for (int c = 0; c < kCG; ++c)
#pragma unroll
        for (int k = 0; k < 3; ++k) acc[c][k] = 0.f;
      if (w_lo < w_hi) {
        for (int dd = 0; dd < vd; ++dd)
          for (int h = 0; h < vh; ++h) {
            const float* xr = xs + ci_b * g.xs_c + (h + kh_b) * g.xs_h + dd + kd_b;
            const float* dr = dys + (dd * g.TH + h) * g.TW * g.ds + cg * kCG;
            float x0 = xr[w_lo * kXD], x1 = xr[(w_lo + 1) * kXD];
            for (int wq = w_lo; wq < w_hi; ++wq) {
              const float x2 = xr[(wq + 2) * kXD];
              const float4 lo = *reinterpret_cast<const float4*>(dr + wq * g.ds);
              const float4 hi = *reinterpret_cast<const float4*>(dr + wq * g.ds + 4);
              const float dv[kCG] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
              for (int c = 0; c < kCG; ++c) {
                acc[c][0] = fmaf(dv[c], x0, acc[c][0]);
                acc[c][1] = fmaf(dv[c], x1, acc[c][1]);
                acc[c][2] = fmaf(dv[c], x2, acc[c][2]);
              }
              x0 = x1;
              x1 = x2;
            }
          }
      }
#pragma unroll
      for (int c = 0; c < kCG; ++c)
#pragma unroll
        for (int k = 0; k < 3; ++k) slots[(c * 3 + k) * kThreads + tid] += acc[c][k];
    }

    // Phase C: dx over the tile's input footprint, gathered from dy in shared memory:
    // dx[ci][fd][fh][fw] = sum_{c,kd,kh,kw} w[c][ci][kd][kh][kw] dy[c][fd-kd][fh-kh][fw-kw].
    if (g.with_dx) {
      const int fplane = g.FH * g.FW;
      for (int i = tid; i < fplane; i += kThreads) {
        const int fh = i / g.FW, fw = i % g.FW;
        for (int ci0 = 0; ci0 < g.C; ci0 += kCinChunk) {
          float acc[kCinChunk][kP + 2];
#pragma unroll
          for (int a = 0; a < kCinChunk; ++a)
#pragma unroll
            for (int fd = 0; fd < kP + 2; ++fd) acc[a][fd] = 0.f;
          for (int kh = 0; kh < 3; ++kh) {
            const int h = fh - kh;
            if (h < 0 || h >= g.TH) continue;
            for (int kw = 0; kw < 3; ++kw) {
              const int wq = fw - kw;
              if (wq < 0 || wq >= g.TW) continue;
              const float* dp = dys + (h * g.TW + wq) * g.ds;
              for (int q = 0; q < g.Kpad; q += 4) {
                float4 dv[kP];
#pragma unroll
                for (int dd = 0; dd < kP; ++dd) dv[dd] = *reinterpret_cast<const float4*>(dp + dd * g.plane * g.ds + q);
#pragma unroll
                for (int a = 0; a < kCinChunk; ++a) {
                  const int ci = ci0 + a;
                  if (ci >= g.C) break;
#pragma unroll
                  for (int kd = 0; kd < 3; ++kd) {
                    const float4 wv =
                        *reinterpret_cast<const float4*>(ws + (((ci * 3 + kh) * 3 + kw) * 3 + kd) * g.Kpad + q);
#pragma unroll
                    for (int dd = 0; dd < kP; ++dd) {
                      float s = acc[a][dd + kd];
                      s = fmaf(wv.x, dv[dd].x, s);
                      s = fmaf(wv.y, dv[dd].y, s);
                      s = fmaf(wv.z, dv[dd].z, s);
                      s = fmaf(wv.w, dv[dd].w, s);
                      acc[a][dd + kd] = s;
                    }
                  }
                }
              }
            }
          }
          for (int a = 0; a < kCinChunk && ci0 + a < g.C; ++a) {
            float* dst = dx_partial + ((t * g.C + ci0 + a) * (kP + 2) * g.FH + fh) * g.FW + fw;
#pragma unroll
            for (int fd = 0; fd < kP + 2; ++fd) dst[static_cast<int64_t>(fd) * fplane] = acc[a][fd];
          }
        }
      }
    }
  }

  // The block's dW: the PS position subsets of each owner, added in order.
  __syncthreads();
  const int e_count = g.owners * kCG * 3;
  for (int e = tid; e < e_count; e += kThreads) {
    const int oo = e / (kCG * 3), ck = e % (kCG * 3);
    float s = 0.f;
    for (int k = 0; k < g.PS; ++k) s += slots[ck * kThreads + k * g.owners + oo];
    dw_partial[static_cast<int64_t>(blockIdx.x) * e_count + e] = s;
  }
}

// dw (K, C, 3, 3, 3) = sum over blocks, in block order, of (owners, kCG, 3) partials.
__global__ void dw_reduce_kernel(float* __restrict__ dw, const float* __restrict__ partial, int64_t blocks, TileGeom g) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= g.K * g.C * 27) return;
  const int kw = i % 3, kh = (i / 3) % 3, kd = (i / 9) % 3, ci = (i / 27) % g.C, c = i / (27 * g.C);
  const int r = (ci * 3 + kd) * 3 + kh, o = (c / kCG) * g.R + r;
  const int e = (o * kCG + c % kCG) * 3 + kw, e_count = g.owners * kCG * 3;
  double s = 0;  // a long sum of f32 partials: accumulate in f64
  for (int64_t b = 0; b < blocks; ++b) s += partial[b * e_count + e];
  dw[i] = static_cast<float>(s);
}

// dx (N, C, D, H, W): each element sums the footprints of the tiles that cover it, in order.
__global__ void dx_reduce_kernel(float* __restrict__ dx, const float* __restrict__ partial, TileGeom g) {
  const int64_t total = g.N * g.C * g.D * g.H * g.W;
  const int fplane = g.FH * g.FW;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t xw = i % g.W, xh = (i / g.W) % g.H, xd = (i / (g.W * g.H)) % g.D;
    const int64_t ci = (i / (g.W * g.H * g.D)) % g.C, n = i / (g.W * g.H * g.D * g.C);
    // Tile dt covers depths [dt kP, dt kP + kP + 2), tile ht rows [ht TH, ht TH + TH + 2): at
    // most three tiles per dim (two unless a tile is one wide).
    const int64_t dt1 = min64(g.NDT - 1, xd / kP), ht1 = min64(g.NHT - 1, xh / g.TH), wt1 = min64(g.NWT - 1, xw / g.TW);
    float s = 0.f;
    for (int64_t dt = max64(0, dt1 - 2); dt <= dt1; ++dt) {
      const int64_t fd = xd - dt * kP;
      if (fd >= kP + 2) continue;
      for (int64_t ht = max64(0, ht1 - 2); ht <= ht1; ++ht) {
        const int64_t fh = xh - ht * g.TH;
        if (fh >= g.FH) continue;
        for (int64_t wt = max64(0, wt1 - 2); wt <= wt1; ++wt) {
          const int64_t fw = xw - wt * g.TW;
          if (fw >= g.FW) continue;
          const int64_t t = ((n * g.NDT + dt) * g.NHT + ht) * g.NWT + wt;
          s += partial[((t * g.C + ci) * (kP + 2) + fd) * fplane + fh * g.FW + fw];
        }
      }
    }
    dx[i] = s;
  }
}

// ---- host side --------------------------------------------------------------------------

// Grid of a one-thread-per-item kernel (no grid-stride loop, unlike grid_for's capped grids).
unsigned item_blocks(int64_t items, int threads) {
  const int64_t blocks = std::max<int64_t>(1, (items + threads - 1) / threads);
  TG_CHECK(blocks < (int64_t{1} << 31), "conv3d_gn_mean: ", items, " items exceed one grid");
  return static_cast<unsigned>(blocks);
}

// Blocks of `kernel` that fit on the whole device at once.
template <class Kernel>
int64_t resident_blocks(Kernel kernel, int threads, int smem_bytes, int device) {
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  int per_sm = 0;
  TG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  return std::max<int64_t>(1, int64_t{per_sm} * sm_count(device));
}

bool fused_geometry(const ConvShape& s) {
  for (int d = 0; d < 3; ++d)
    if (s.kernel[d] != 3 || s.stride[d] != 1 || s.pad[d] != 0 || s.dilation[d] != 1) return false;
  return s.spatial_dims == 3 && s.layout == Layout::NCHW;
}

const float* ptr_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

template <class T>
const T* typed_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

SmallGeom small_geom(const Conv3dGnMeanProblem& p) {
  return {.N = p.conv.N, .K = p.conv.K, .G = p.groups, .cpg = p.channels_per_group(),
          .V = static_cast<double>(p.volume()), .eps = p.eps};
}

template <int CA, int NT>
void launch_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                  const TileGeom& g, double V, int dev, cudaStream_t st) {
  const int smem = g.stats_smem_floats * static_cast<int>(sizeof(float));
  // Blocks per sample: the fewest that fill the device with the least rounding, counting
  // time as (waves of resident blocks) x (tiles per block).
  const int64_t slots = resident_blocks(stats_kernel<CA, NT>, NT, smem, dev);
  int64_t B = 1, best_cost = -1;
  for (int64_t q = 1; q <= std::min<int64_t>(g.tiles_per_sample, 4096); ++q) {
    const int64_t cost = ((g.N * q + slots - 1) / slots) * ((g.tiles_per_sample + q - 1) / q);
    if (best_cost < 0 || cost < best_cost) B = q, best_cost = cost;
  }
  Tensor partial = Tensor::empty({g.N * B * 2 * g.Kpad}, {.dtype = DType::f64, .device = x.device()});
  stats_kernel<CA, NT><<<static_cast<unsigned>(g.N * B), NT, smem, st>>>(partial.data<double>(), x.data<float>(),
                                                                          w.data<float>(), B, g);
  TG_LAUNCH_CHECK();
  stats_reduce_kernel<<<item_blocks(g.N * g.K, kThreads), kThreads, 0, st>>>(
      S1.data<double>(), S2.data<double>(), partial.data<double>(), ptr_or_null(b), g.N, g.K, g.Kpad, B, V);
  TG_LAUNCH_CHECK();
}

// Share of the phase-A thread slots of a tiling that compute a real output (h, w).
double phase_a_efficiency(const TileGeom& g) {
  return static_cast<double>(g.OH * g.OW * g.chunks) / static_cast<double>(g.NHT * g.NWT * g.threads);
}

template <int CA>
void launch_grad_conv(const Tensor& dw, const Tensor& dx, const Tensor& x, const Tensor& w, const Tensor& b,
                      const Tensor& A, const Tensor& B, TileGeom g, int dev, cudaStream_t st) {
  g.with_dx = dx.defined();
  const int smem = g.grad_smem_floats * static_cast<int>(sizeof(float));
  const int64_t blocks = std::min(g.tiles, resident_blocks(grad_conv_kernel<CA>, kThreads, smem, dev));
  const TensorOptions f32_opts{.dtype = DType::f32, .device = x.device()};
  Tensor dw_partial = Tensor::empty({blocks * g.owners * kCG * 3}, f32_opts);
  Tensor dx_partial;
  if (g.with_dx) dx_partial = Tensor::empty({g.tiles * g.C * (kP + 2) * g.FH * g.FW}, f32_opts);
  grad_conv_kernel<CA><<<static_cast<unsigned>(blocks), kThreads, smem, st>>>(
      dw_partial.data<float>(), g.with_dx ? dx_partial.data<float>() : nullptr, x.data<float>(), w.data<float>(),
      ptr_or_null(b), A.data<float>(), B.data<float>(), g);
  TG_LAUNCH_CHECK();
  if (dw.defined()) {
    dw_reduce_kernel<<<item_blocks(int64_t{g.K} * g.C * 27, kThreads), kThreads, 0, st>>>(
        dw.data<float>(), dw_partial.data<float>(), blocks, g);
    TG_LAUNCH_CHECK();
  }
  if (g.with_dx) {
    dx_reduce_kernel<<<grid_for(x.numel(), kThreads), kThreads, 0, st>>>(dx.data<float>(), dx_partial.data<float>(), g);
    TG_LAUNCH_CHECK();
  }
}

// y = conv3d(x, w) + b through the general convolution kernels (the materialized path).
Tensor conv_output(const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s) {
  Tensor y = Tensor::empty(s.y_shape(), {.dtype = x.dtype(), .device = x.device()});
  conv_forward(y, x, w, b, s);
  return y;
}

}  // namespace

// Whether the launchers take the tensor-core kernels, or the FFMA fused kernels.
static bool use_tensor_cores(const Conv3dGnMeanProblem& p, DType dtype, Conv3dGnMeanKernels kernels) {
  if (kernels == Conv3dGnMeanKernels::ffma) return false;
  const bool ok = conv3d_gn_mean_mma_applies(p, dtype);
  TG_CHECK(ok || kernels != Conv3dGnMeanKernels::tensor_core, "conv3d_gn_mean: tensor-core kernels forced, but ",
           "they do not take C_in ", p.conv.C, ", K ", p.conv.K, " in ", dtype_name(dtype));
  return ok;
}

static bool use_ffma(const Conv3dGnMeanProblem& p, DType dtype, Conv3dGnMeanKernels kernels) {
  const bool ok = conv3d_gn_mean_applies(p, dtype);
  TG_CHECK(ok || kernels != Conv3dGnMeanKernels::ffma, "conv3d_gn_mean: FFMA kernels forced, but they do not take ",
           "C_in ", p.conv.C, ", K ", p.conv.K, " in ", dtype_name(dtype));
  return ok;
}

bool conv3d_gn_mean_applies(const Conv3dGnMeanProblem& p, DType dtype) {
  const ConvShape& s = p.conv;
  if (dtype != DType::f32 || !fused_geometry(s) || s.N < 1 || s.C < 1 || s.K < 1) return false;
  if (s.C * 27 * padded_channels(s.K) > kMaxWeightFloats) return false;
  if (9 * s.C * (padded_channels(s.K) / kCG) > kThreads) return false;  // phase-B owners
  const TileGeom g = make_tile_geom(p, kThreads);
  return g.grad_smem_floats * int64_t{sizeof(float)} <= kMaxGradSmemBytes && g.items <= kThreads;
}

bool conv3d_gn_mean_mma_applies(const Conv3dGnMeanProblem& p, DType dtype) {
  const ConvShape& s = p.conv;
  if (dtype != DType::f32 || !fused_geometry(s) || s.N < 1) return false;
  // Instantiated tile classes; one block per tile in the forward grid.
  if (s.K != 24 || (s.C != 3 && s.C != 1)) return false;
  const int64_t tiles = s.N * ((s.out[0] + 3) / 4) * ((s.out[1] + 15) / 16) * ((s.out[2] + 31) / 32);
  return tiles < (int64_t{1} << 25);  // a lower bound: the chosen tiles are at most 32x as many
}

void conv3d_gn_mean_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                          const Conv3dGnMeanProblem& p, Conv3dGnMeanKernels kernels) {
  const int dev = x.device().index;
  set_device(dev);
  if (p.conv.N == 0) return;
  cudaStream_t st = stream(dev);
  if (use_tensor_cores(p, x.dtype(), kernels)) {
    conv3d_gn_mean_mma_stats(S1, S2, x, w, b, p, precision() == Precision::TF32);
    return;
  }
  if (use_ffma(p, x.dtype(), kernels)) {
    const double V = static_cast<double>(p.volume());
    const TileGeom g256 = make_tile_geom(p, kThreads), g128 = make_tile_geom(p, 128);
    // The smaller block when its tiles leave clearly fewer threads idle (and still fit).
    const bool small = g128.items <= 128 && phase_a_efficiency(g128) > 1.02 * phase_a_efficiency(g256);
    if (g256.CA == 12) {
      if (small) launch_stats<12, 128>(S1, S2, x, w, b, g128, V, dev, st);
      else launch_stats<12, kThreads>(S1, S2, x, w, b, g256, V, dev, st);
    } else {
      if (small) launch_stats<8, 128>(S1, S2, x, w, b, g128, V, dev, st);
      else launch_stats<8, kThreads>(S1, S2, x, w, b, g256, V, dev, st);
    }
    return;
  }
  const Tensor y = conv_output(x, w, b, p.conv);
  dispatch_floating("conv3d_gn_mean_stats", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    sums_kernel<T><<<static_cast<unsigned>(p.conv.N * p.conv.K), kThreads, 0, st>>>(
        S1.data<double>(), S2.data<double>(), y.data<T>(), p.volume());
    TG_LAUNCH_CHECK();
  });
}

void conv3d_gn_mean_finish(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& S1,
                           const Tensor& S2, const Tensor& gamma, const Tensor& beta, const Conv3dGnMeanProblem& p) {
  const int dev = out.device().index;
  set_device(dev);
  if (p.conv.N == 0) return;
  dispatch_floating("conv3d_gn_mean_finish", out.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    finish_kernel<T><<<item_blocks(p.conv.N, kThreads), kThreads, 0, stream(dev)>>>(
        out.data<T>(), mean.data<double>(), rstd.data<double>(), S1.data<double>(), S2.data<double>(),
        typed_or_null<T>(gamma), typed_or_null<T>(beta), small_geom(p));
    TG_LAUNCH_CHECK();
  });
}

void conv3d_gn_mean_coefficients(const Tensor& A, const Tensor& B, const Tensor& dgamma, const Tensor& dbeta,
                                 const Tensor& db, const Tensor& gout, const Tensor& S1, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& gamma, const Conv3dGnMeanProblem& p) {
  const int dev = gout.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const SmallGeom g = small_geom(p);
  dispatch_floating("conv3d_gn_mean_coefficients", gout.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (A.defined() && B.defined() && g.N > 0) {
      coef_kernel<T><<<item_blocks(g.N * g.G, kThreads), kThreads, 0, st>>>(
          A.data<T>(), B.data<T>(), gout.data<T>(), S1.data<double>(), mean.data<double>(), rstd.data<double>(),
          typed_or_null<T>(gamma), g);
      TG_LAUNCH_CHECK();
    }
    if (dgamma.defined() || dbeta.defined() || db.defined()) {
      param_grads_kernel<T><<<item_blocks(g.K, kThreads), kThreads, 0, st>>>(
          dgamma.defined() ? dgamma.data<T>() : nullptr, dbeta.defined() ? dbeta.data<T>() : nullptr,
          db.defined() ? db.data<T>() : nullptr, gout.data<T>(), S1.data<double>(), mean.data<double>(),
          rstd.data<double>(), typed_or_null<T>(gamma), g);
      TG_LAUNCH_CHECK();
    }
  });
}

void conv3d_gn_mean_grad_conv(const Tensor& dw, const Tensor& dx, const Tensor& x, const Tensor& w,
                              const Tensor& b, const Tensor& A, const Tensor& B, const Conv3dGnMeanProblem& p,
                              Conv3dGnMeanKernels kernels) {
  if (!dw.defined() && !dx.defined()) return;
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  if (p.conv.N == 0) {  // nothing to sum: the gradients are zero
    if (dw.defined()) TG_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), st));
    if (dx.defined()) TG_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), st));
    return;
  }
  // Tensor cores compute dw only; with dx wanted the FFMA kernel does both in one pass
  // (unless tensor cores are forced: then dx comes from the FFMA or materialized path below).
  Tensor dw_rest = dw;
  const bool mma = dw.defined() && use_tensor_cores(p, x.dtype(), kernels) &&
                   (!dx.defined() || kernels == Conv3dGnMeanKernels::tensor_core);
  if (mma) {
    conv3d_gn_mean_mma_grad_weight(dw, x, w, b, A, B, p, precision() == Precision::TF32);
    if (!dx.defined()) return;
    dw_rest = Tensor();
  }
  if (kernels == Conv3dGnMeanKernels::tensor_core ? conv3d_gn_mean_applies(p, x.dtype())
                                                  : use_ffma(p, x.dtype(), kernels)) {
    const TileGeom g = make_tile_geom(p, kThreads);
    if (g.CA == 12) launch_grad_conv<12>(dw_rest, dx, x, w, b, A, B, g, dev, st);
    else launch_grad_conv<8>(dw_rest, dx, x, w, b, A, B, g, dev, st);
    return;
  }
  Tensor dy = conv_output(x, w, b, p.conv);  // y, turned into dL/dy in place
  dispatch_floating("conv3d_gn_mean_grad_conv", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    affine_dy_kernel<T><<<grid_for(dy.numel(), kThreads), kThreads, 0, st>>>(
        dy.data<T>(), A.data<T>(), B.data<T>(), dy.numel(), p.conv.K, p.groups, p.channels_per_group(), p.volume());
    TG_LAUNCH_CHECK();
  });
  if (dw_rest.defined()) conv_grad_weight(dw_rest, dy, x, p.conv);
  if (dx.defined()) conv_grad_input(dx, dy, w, p.conv);
}

}  // namespace tg::cuda
