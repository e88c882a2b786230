// Forward statistics of the fused Conv3d(3x3x3) -> GroupNorm -> mean (workload C) on FFMA:
// conv3d_gn_mean_stats, which takes the tensor-core kernels (conv3d_gn_mean/stats_sm80.cu) for
// their shape class, these FFMA kernels for the fused shape class, else the materialized path.
// y is recomputed and never written. Design: docs/kernels/conv3d_gn_mean.md.
//
//  stats_kernel      phase A, sums of z and z^2 (z = y - bias) in thread-private slots, fixed-order
//                    block sum -> f64 partials per (sample, block); blocks never straddle samples.
//  stats_reduce      partials in block order -> S1, S2 (N, K) in f64, bias folded back in.
//  sums_kernel       the materialized path's sums over a computed y.
// Deterministic: no atomics; every reduction has a fixed order for a given device.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "core/precision.h"
#include "ops/cuda/conv3d_gn_mean/mma_sm80.h"
#include "ops/cuda/conv3d_gn_mean/tiles_ffma.cuh"

namespace tg::cuda {

using namespace conv3d_gn_mean_detail;

namespace {

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

}  // namespace

void conv3d_gn_mean_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                          const Conv3dGnMeanProblem& p, Conv3dGnMeanKernels kernels) {
  const int dev = x.device().index;
  set_device(dev);
  if (p.conv.N == 0) return;
  cudaStream_t st = stream(dev);
  if (use_tensor_cores(p, x.dtype(), kernels)) {
    conv3d_gn_mean_mma_stats(S1, S2, x, w, b, p, p.precision == Precision::TF32);
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
  const Tensor y = conv_output(x, w, b, p);
  dispatch_floating("conv3d_gn_mean_stats", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    sums_kernel<T><<<static_cast<unsigned>(p.conv.N * p.conv.K), kThreads, 0, st>>>(
        S1.data<double>(), S2.data<double>(), y.data<T>(), p.volume());
    TG_LAUNCH_CHECK();
  });
}

}  // namespace tg::cuda
