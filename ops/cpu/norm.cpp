// CPU reference of group_norm: plain loops with double accumulation.
//
// With the ReLU (p.relu) the forward clamps y at 0 and the backward masks dy by y > 0 first
// (the relu op's gradient), then runs the same formulas.
//
// Backward, per (n, g) with M = group_size, xhat = (x - mean) * rstd and g_c = gamma_c:
//   dx = rstd * (g_c dy - A - xhat B),  A = sum(g_c dy) / M,  B = sum(g_c dy xhat) / M
// Both sums follow from per-(n, c) sums db = sum_hw dy and ds = sum_hw dy (x - mean), which
// also give dbeta_c = sum_n db and dgamma_c = sum_n rstd ds. The CUDA kernels use the
// same decomposition, so the two backends agree term by term.
//
// Threads split the (n, g) groups, which are independent; dgamma and dbeta sum the per-(n, c)
// terms over n afterwards, serially in n's order.
#include <cmath>
#include <vector>

#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/norm.h"

namespace tg::cpu {

void group_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& gamma, const Tensor& beta, const GroupNormProblem& p,
                        const Tensor& residual) {
  check_group_norm_forward_buffers(y, mean, rstd, x, gamma, beta, p, residual);
  dispatch_floating("group_norm", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* px = x.data<T>();  // (N, C, HW)
    T* py = y.data<T>();        // (N, C, HW)
    T* pm = mean.data<T>();     // (N, G)
    T* pr = rstd.data<T>();     // (N, G)
    const T* pg = gamma.defined() ? gamma.data<T>() : nullptr;  // (C)
    const T* pb = beta.defined() ? beta.data<T>() : nullptr;    // (C)
    const T* pres = residual.defined() ? residual.data<T>() : nullptr;  // (N, C, HW)
    const int64_t G = p.groups, D = p.channels_per_group(), HW = p.HW, M = p.group_size();
    parallel_for(p.N * G, 3 * M, [&](int64_t ng) {
      const T* xg = px + ng * M;  // a group is contiguous: D channels of HW
      double s = 0, ss = 0;
      for (int64_t i = 0; i < M; ++i) s += xg[i];
      const double mu = s / static_cast<double>(M);
      for (int64_t i = 0; i < M; ++i) ss += (xg[i] - mu) * (xg[i] - mu);
      const double rs = 1.0 / std::sqrt(ss / static_cast<double>(M) + p.eps);
      pm[ng] = static_cast<T>(mu);
      pr[ng] = static_cast<T>(rs);
      const int64_t g = ng % G;
      for (int64_t d = 0; d < D; ++d) {
        const int64_t c = g * D + d;
        const double scale = rs * (pg ? double(pg[c]) : 1.0), shift = (pb ? double(pb[c]) : 0.0);
        for (int64_t i = d * HW; i < (d + 1) * HW; ++i) {
          // Rounded to T before the residual's add and the ReLU, as the separate ops would.
          T v = static_cast<T>((xg[i] - mu) * scale + shift);
          if (pres) v = v + pres[ng * M + i];
          py[ng * M + i] = p.relu && !(v > T(0)) ? T(0) : v;
        }
      }
    });
  });
}

void group_norm_backward(const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, const Tensor& dy,
                         const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                         const GroupNormProblem& p, const Tensor& y) {
  check_group_norm_backward_buffers(dx, dgamma, dbeta, dy, x, gamma, mean, rstd, p, y);
  dispatch_floating("group_norm_backward", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* px = x.data<T>();    // (N, C, HW)
    const T* pdy = dy.data<T>();  // (N, C, HW)
    const T* pr = rstd.data<T>();  // (N, G)
    const T* pg = gamma.defined() ? gamma.data<T>() : nullptr;  // (C)
    const T* py = p.relu ? y.data<T>() : nullptr;              // (N, C, HW): dy counts where y > 0
    const int64_t G = p.groups, D = p.channels_per_group(), HW = p.HW, M = p.group_size();
    // Per-(n, c) terms of dgamma (rstd * ds) and dbeta (db), summed over n at the end.
    std::vector<double> gterm(static_cast<size_t>(p.N * p.C)), bterm(static_cast<size_t>(p.N * p.C));
    T* pdx = dx.defined() ? dx.data<T>() : nullptr;
    parallel_for(p.N * G, 4 * M, [&](int64_t ng) {
      const int64_t n = ng / G;
      const int64_t g = ng % G;
      const T* xg = px + ng * M;
      // The group's mean in double, summed as the forward sums it: the saved one is rounded
      // to x's dtype, and with a large common offset that rounding shifts every (x - mean)
      // by ulp(offset), which can be of the order of the deviations themselves.
      double sum_x = 0;
      for (int64_t i = 0; i < M; ++i) sum_x += xg[i];
      const double mu = sum_x / static_cast<double>(M), rs = pr[ng];
      // The gradient reaching the normalization: dy, or with the ReLU dy where y > 0.
      std::vector<T> masked;
      const T* dyg = pdy + ng * M;
      if (py) {
        masked.resize(static_cast<size_t>(M));
        for (int64_t i = 0; i < M; ++i) masked[static_cast<size_t>(i)] = py[ng * M + i] > T(0) ? dyg[i] : T(0);
        dyg = masked.data();
      }
      double sum_g = 0, sum_gx = 0;  // sum(g_c dy), sum(g_c dy (x - mean))
      for (int64_t d = 0; d < D; ++d) {
        const int64_t c = g * D + d;
        double b = 0, s = 0;
        for (int64_t i = d * HW; i < (d + 1) * HW; ++i) {
          b += dyg[i];
          s += dyg[i] * (xg[i] - mu);
        }
        const double gc = pg ? double(pg[c]) : 1.0;
        sum_g += gc * b;
        sum_gx += gc * s;
        gterm[static_cast<size_t>(n * p.C + c)] = rs * s;
        bterm[static_cast<size_t>(n * p.C + c)] = b;
      }
      if (!pdx) return;
      const double A = sum_g / static_cast<double>(M);
      const double B = rs * sum_gx / static_cast<double>(M);
      T* dxg = pdx + ng * M;
      for (int64_t d = 0; d < D; ++d) {
        const double gc = pg ? double(pg[g * D + d]) : 1.0;
        for (int64_t i = d * HW; i < (d + 1) * HW; ++i) {
          const double xhat = (xg[i] - mu) * rs;
          dxg[i] = static_cast<T>(rs * (gc * dyg[i] - A - xhat * B));
        }
      }
    });
    for (int64_t c = 0; c < p.C; ++c) {
      double gsum = 0, bsum = 0;
      for (int64_t n = 0; n < p.N; ++n) {
        gsum += gterm[static_cast<size_t>(n * p.C + c)];
        bsum += bterm[static_cast<size_t>(n * p.C + c)];
      }
      if (dgamma.defined()) dgamma.data<T>()[c] = static_cast<T>(gsum);
      if (dbeta.defined()) dbeta.data<T>()[c] = static_cast<T>(bsum);
    }
  });
}

}  // namespace tg::cpu
