// Fused Conv3d(3x3x3) -> GroupNorm -> mean (workload C): which kernels serve a problem
// (conv3d_gn_mean_applies, conv3d_gn_mean_mma_applies), the group statistics and output
// (conv3d_gn_mean_finish), and the backward coefficients (conv3d_gn_mean_coefficients), with
// their small kernels. y is recomputed wherever it is needed and never written.
// Design and precision contract: docs/kernels/conv3d_gn_mean.md.
//
//  finish / coef /   group stats, the output, the dL/dy = A + B y coefficients, dgamma, dbeta,
//  param_grads       db (closed form).
// The statistics are in conv3d_gn_mean/stats_ffma.cu, the conv's backward in conv3d_gn_mean/grad_ffma.cu
// (FFMA; shared pieces in conv3d_gn_mean/tiles_ffma.cuh), the tensor-core kernels in
// conv3d_gn_mean_mma_*.cu.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/conv3d_gn_mean/mma_sm80.h"
#include "ops/cuda/conv3d_gn_mean/tiles_ffma.cuh"

namespace tg::cuda {

using namespace conv3d_gn_mean_detail;

namespace {

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

bool fused_geometry(const ConvShape& s) {
  for (int d = 0; d < 3; ++d)
    if (s.kernel[d] != 3 || s.stride[d] != 1 || s.pad[d] != 0 || s.dilation[d] != 1) return false;
  return s.spatial_dims == 3 && s.layout == Layout::NCHW;
}

template <class T>
const T* typed_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

SmallGeom small_geom(const Conv3dGnMeanProblem& p) {
  return {.N = p.conv.N, .K = p.conv.K, .G = p.groups, .cpg = p.channels_per_group(),
          .V = static_cast<double>(p.volume()), .eps = p.eps};
}

}  // namespace

namespace conv3d_gn_mean_detail {

// y = conv3d(x, w) + b through the general convolution kernels (the materialized path).
Tensor conv_output(const Tensor& x, const Tensor& w, const Tensor& b, const Conv3dGnMeanProblem& p) {
  Tensor y = Tensor::empty(p.conv.y_shape(), {.dtype = x.dtype(), .device = x.device()});
  conv_forward(y, x, w, b, p.conv, p.precision);
  return y;
}

// Whether the launchers take the tensor-core kernels, or the FFMA fused kernels.
bool use_tensor_cores(const Conv3dGnMeanProblem& p, DType dtype, Conv3dGnMeanKernels kernels) {
  if (kernels == Conv3dGnMeanKernels::ffma) return false;
  const bool ok = conv3d_gn_mean_mma_applies(p, dtype);
  TG_CHECK(ok || kernels != Conv3dGnMeanKernels::tensor_core, "conv3d_gn_mean: tensor-core kernels forced, but ",
           "they do not take C_in ", p.conv.C, ", K ", p.conv.K, " in ", dtype_name(dtype));
  return ok;
}

bool use_ffma(const Conv3dGnMeanProblem& p, DType dtype, Conv3dGnMeanKernels kernels) {
  const bool ok = conv3d_gn_mean_applies(p, dtype);
  TG_CHECK(ok || kernels != Conv3dGnMeanKernels::ffma, "conv3d_gn_mean: FFMA kernels forced, but they do not take ",
           "C_in ", p.conv.C, ", K ", p.conv.K, " in ", dtype_name(dtype));
  return ok;
}

}  // namespace conv3d_gn_mean_detail

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

}  // namespace tg::cuda
