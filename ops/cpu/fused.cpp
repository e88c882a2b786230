// CPU reference of conv3d_group_norm_mean: it materializes y with the CPU convolution (the
// reference needs clarity, not memory thrift) and does the closed-form statistics in double.
// The formulas are derived in ops/fused.h; the CUDA kernels implement the same ones.
// Threads: the convolutions (ops/cpu/conv.cpp) and the per-(n, k) loops over the volume;
// the closed-form steps over (N, K) numbers are serial.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/conv.h"
#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/fused.h"

namespace tg::cpu {
namespace {

// Per-channel parameter c of an optional tensor, or `fallback` when it is undefined.
template <class T>
double param_or(const T* p, int64_t c, double fallback) {
  return p ? static_cast<double>(p[c]) : fallback;
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// y = conv3d(x, w) + b, materialized.   (N, K, D', H', W')
Tensor conv_output(const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s) {
  Tensor y = Tensor::empty(s.y_shape(), {.dtype = x.dtype(), .device = x.device()});
  conv_forward(y, x, w, b, s);
  return y;
}

}  // namespace

void conv3d_gn_mean_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                          const Conv3dGnMeanProblem& p) {
  const Tensor y = conv_output(x, w, b, p.conv);
  const int64_t NK = p.conv.N * p.conv.K, V = p.volume();
  double* s1 = S1.data<double>();  // (N, K)
  double* s2 = S2.data<double>();  // (N, K)
  dispatch_floating("conv3d_gn_mean_stats", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* yp = y.data<T>();  // (N, K, V)
    parallel_for(NK, 2 * V, [&](int64_t nk) {
      double a = 0, q = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double e = yp[nk * V + v];
        a += e;
        q += e * e;
      }
      s1[nk] = a;
      s2[nk] = q;
    });
  });
}

void conv3d_gn_mean_finish(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& S1,
                           const Tensor& S2, const Tensor& gamma, const Tensor& beta, const Conv3dGnMeanProblem& p) {
  const int64_t N = p.conv.N, K = p.conv.K, G = p.groups, cpg = p.channels_per_group();
  const double V = static_cast<double>(p.volume());
  const double* s1 = S1.data<double>();  // (N, K)
  const double* s2 = S2.data<double>();  // (N, K)
  double* mu = mean.data<double>();      // (N, G)
  double* rs = rstd.data<double>();      // (N, G)
  dispatch_floating("conv3d_gn_mean_finish", out.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* gm = data_or_null<T>(gamma);
    const T* bt = data_or_null<T>(beta);
    T* o = out.data<T>();  // (N)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t g = 0; g < G; ++g) {
        double a = 0, q = 0;
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
          a += s1[n * K + c];
          q += s2[n * K + c];
        }
        const double m = a / (cpg * V);
        const double var = std::max(q / (cpg * V) - m * m, 0.0);  // biased, like GroupNorm
        const double r = 1.0 / std::sqrt(var + p.eps);
        mu[n * G + g] = m;
        rs[n * G + g] = r;
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c)
          acc += param_or(gm, c, 1.0) * (s1[n * K + c] / V - m) * r + param_or(bt, c, 0.0);
      }
      o[n] = static_cast<T>(acc / K);
    }
  });
}

void conv3d_gn_mean_coefficients(const Tensor& A, const Tensor& B, const Tensor& dgamma, const Tensor& dbeta,
                                 const Tensor& db, const Tensor& gout, const Tensor& S1, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& gamma, const Conv3dGnMeanProblem& p) {
  const int64_t N = p.conv.N, K = p.conv.K, G = p.groups, cpg = p.channels_per_group();
  const double V = static_cast<double>(p.volume());
  const double* s1 = S1.data<double>();   // (N, K)
  const double* mu = mean.data<double>(); // (N, G)
  const double* rs = rstd.data<double>(); // (N, G)
  dispatch_floating("conv3d_gn_mean_coefficients", gout.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* gm = data_or_null<T>(gamma);
    const T* go = gout.data<T>();  // (N)
    std::vector<double> a_nc(static_cast<size_t>(N * K)), b_ng(static_cast<size_t>(N * G));
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < G; ++g) {
        // a_c = dL/d(mu_c - mu_g) rstd-free weight: gout * gamma_c / K.
        const double m = mu[n * G + g], r = rs[n * G + g];
        double sum_a = 0, sum_a_mu = 0;
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
          const double a = go[n] * param_or(gm, c, 1.0) / K;
          sum_a += a;
          sum_a_mu += a * s1[n * K + c] / V;
        }
        // rstd depends on y through var: d rstd / d y = -rstd^3 (y - mu_g) / (cpg V).
        const double bg = -(sum_a_mu - m * sum_a) * r * r * r / (cpg * V);
        b_ng[n * G + g] = bg;
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
          const double a = go[n] * param_or(gm, c, 1.0) / K;
          a_nc[n * K + c] = r * (a - sum_a / cpg) / V - bg * m;
        }
      }
    }
    if (A.defined())
      for (int64_t i = 0; i < N * K; ++i) A.data<T>()[i] = static_cast<T>(a_nc[i]);
    if (B.defined())
      for (int64_t i = 0; i < N * G; ++i) B.data<T>()[i] = static_cast<T>(b_ng[i]);
    for (int64_t c = 0; c < K; ++c) {
      const int64_t g = c / cpg;
      double dg = 0, dbt = 0, dbias = 0;
      for (int64_t n = 0; n < N; ++n) {
        dg += go[n] / K * (s1[n * K + c] / V - mu[n * G + g]) * rs[n * G + g];
        dbt += go[n] / K;
        // sum_v dL/dy = A V + B S1.
        dbias += a_nc[n * K + c] * V + b_ng[n * G + g] * s1[n * K + c];
      }
      if (dgamma.defined()) dgamma.data<T>()[c] = static_cast<T>(dg);
      if (dbeta.defined()) dbeta.data<T>()[c] = static_cast<T>(dbt);
      if (db.defined()) db.data<T>()[c] = static_cast<T>(dbias);
    }
  });
}

void conv3d_gn_mean_grad_conv(const Tensor& dw, const Tensor& dx, const Tensor& x, const Tensor& w,
                              const Tensor& b, const Tensor& A, const Tensor& B, const Conv3dGnMeanProblem& p) {
  if (!dw.defined() && !dx.defined()) return;
  Tensor dy = conv_output(x, w, b, p.conv);  // y, turned into dL/dy in place
  const int64_t N = p.conv.N, K = p.conv.K, G = p.groups, cpg = p.channels_per_group(), V = p.volume();
  dispatch_floating("conv3d_gn_mean_grad_conv", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    T* d = dy.data<T>();  // (N, K, V)
    const T* a = A.data<T>();  // (N, K)
    const T* bb = B.data<T>(); // (N, G)
    parallel_for(N * K, V, [&](int64_t nc) {
      const int64_t n = nc / K, c = nc % K;
      const T ac = a[n * K + c], bg = bb[n * G + c / cpg];
      T* row = d + (n * K + c) * V;
      for (int64_t v = 0; v < V; ++v) row[v] = ac + bg * row[v];
    });
  });
  if (dw.defined()) conv_grad_weight(dw, dy, x, p.conv);
  if (dx.defined()) conv_grad_input(dx, dy, w, p.conv);
}

}  // namespace tg::cpu
