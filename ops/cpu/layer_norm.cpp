// CPU reference of layer_norm: plain loops with double accumulation, two passes over each
// row (mean, then the sum of squared deviations), so a large mean costs no precision.
//
// Backward, per row with xhat = (x - mean) * rstd and g = weight * dy:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy
// The CUDA kernels use the same formulas. Backward recomputes each row's mean in double
// rather than read the saved one, rounded to x's dtype (see row_means).
//
// Threads split the rows (forward, and dx in backward); dweight and dbias are a second pass
// that splits the columns, each summing its rows in order.
#include <cmath>
#include <vector>

#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/layer_norm.h"

namespace tg::cpu {
namespace {

// Each row's mean in double, summed as the forward sums it. The saved mean is rounded to x's
// dtype: for rows with a large common offset that rounding shifts every xhat by
// ulp(offset) * rstd, which can be of the order of xhat itself, so backward recomputes it.
template <class T>
std::vector<double> row_means(const T* px, int64_t M, int64_t D) {
  std::vector<double> mus(static_cast<size_t>(M));
  parallel_for(M, D, [&](int64_t r) {
    const T* xr = px + r * D;
    double s = 0;
    for (int64_t i = 0; i < D; ++i) s += xr[i];
    mus[static_cast<size_t>(r)] = s / double(D);
  });
  return mus;
}

}  // namespace

void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, const LayerNormProblem& p) {
  check_layer_norm_forward_buffers(y, mean, rstd, x, weight, bias, p);
  dispatch_floating("layer_norm", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* pw = weight.defined() ? weight.data<T>() : nullptr;  // (D)
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;      // (D)
    const int64_t D = p.D;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    T* pmean = mean.data<T>();
    T* prstd = rstd.data<T>();
    parallel_for(p.M, 3 * D, [&](int64_t r) {
      const T* xr = px + r * D;  // (D)
      T* yr = py + r * D;        // (D)
      double s = 0, ss = 0;
      for (int64_t i = 0; i < D; ++i) s += xr[i];
      const double mu = s / double(D);
      for (int64_t i = 0; i < D; ++i) ss += (xr[i] - mu) * (xr[i] - mu);
      const double rs = 1.0 / std::sqrt(ss / double(D) + p.eps);
      pmean[r] = static_cast<T>(mu);
      prstd[r] = static_cast<T>(rs);
      for (int64_t i = 0; i < D; ++i)
        yr[i] = static_cast<T>((xr[i] - mu) * rs * (pw ? double(pw[i]) : 1.0) + (pb ? double(pb[i]) : 0.0));
    });
  });
}

void layer_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                         const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         const LayerNormProblem& p) {
  check_layer_norm_backward_buffers(dx, dweight, dbias, dy, x, weight, mean, rstd, p);
  dispatch_floating("layer_norm_backward", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* pw = weight.defined() ? weight.data<T>() : nullptr;  // (D)
    const int64_t D = p.D;
    const T* px = x.data<T>();    // (M, D)
    const T* pdy = dy.data<T>();  // (M, D)
    const std::vector<double> mus = row_means(px, p.M, D);
    const T* prstd = rstd.data<T>();
    if (dx.defined()) {
      T* pdx = dx.data<T>();
      parallel_for(p.M, 4 * D, [&](int64_t r) {
        const T* xr = px + r * D;
        const T* dyr = pdy + r * D;
        const double mu = mus[static_cast<size_t>(r)], rs = prstd[r];
        double sg = 0, sgx = 0;  // sum(g), sum(g * xhat)
        for (int64_t i = 0; i < D; ++i) {
          const double xhat = (xr[i] - mu) * rs;
          const double g = double(dyr[i]) * (pw ? double(pw[i]) : 1.0);
          sg += g;
          sgx += g * xhat;
        }
        const double a = sg / double(D), b = sgx / double(D);
        T* dxr = pdx + r * D;
        for (int64_t i = 0; i < D; ++i) {
          const double xhat = (xr[i] - mu) * rs;
          const double g = double(dyr[i]) * (pw ? double(pw[i]) : 1.0);
          dxr[i] = static_cast<T>(rs * (g - a - xhat * b));
        }
      });
    }
    if (!dweight.defined() && !dbias.defined()) return;
    T* pdw = dweight.defined() ? dweight.data<T>() : nullptr;
    T* pdb = dbias.defined() ? dbias.data<T>() : nullptr;
    parallel_ranges(D, 2 * p.M, [&](int64_t i0, int64_t i1) {
      std::vector<double> wsum(static_cast<size_t>(i1 - i0), 0.0), bsum(static_cast<size_t>(i1 - i0), 0.0);
      for (int64_t r = 0; r < p.M; ++r) {
        const T* xr = px + r * D;
        const T* dyr = pdy + r * D;
        const double mu = mus[static_cast<size_t>(r)], rs = prstd[r];
        for (int64_t i = i0; i < i1; ++i) {
          const double xhat = (xr[i] - mu) * rs;
          wsum[static_cast<size_t>(i - i0)] += double(dyr[i]) * xhat;
          bsum[static_cast<size_t>(i - i0)] += double(dyr[i]);
        }
      }
      for (int64_t i = i0; i < i1; ++i) {
        if (pdw) pdw[i] = static_cast<T>(wsum[static_cast<size_t>(i - i0)]);
        if (pdb) pdb[i] = static_cast<T>(bsum[static_cast<size_t>(i - i0)]);
      }
    });
  });
}

}  // namespace tg::cpu
