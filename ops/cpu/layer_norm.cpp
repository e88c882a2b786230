// CPU reference of layer_norm: plain loops with double accumulation, two passes over each
// row (mean, then the sum of squared deviations), so a large mean costs no precision.
//
// Backward, per row with xhat = (x - mean) * rstd and g = weight * dy:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy
// The CUDA kernels use the same formulas.
#include <cmath>
#include <vector>

#include "core/dtype_dispatch.h"
#include "ops/layer_norm.h"

namespace tg::cpu {

void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, const LayerNormProblem& p) {
  check_layer_norm_forward_buffers(y, mean, rstd, x, weight, bias, p);
  dispatch_floating("layer_norm", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* pw = weight.defined() ? weight.data<T>() : nullptr;  // (D)
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;      // (D)
    const int64_t D = p.D;
    for (int64_t r = 0; r < p.M; ++r) {
      const T* xr = x.data<T>() + r * D;  // (D)
      T* yr = y.data<T>() + r * D;        // (D)
      double s = 0, ss = 0;
      for (int64_t i = 0; i < D; ++i) s += xr[i];
      const double mu = s / double(D);
      for (int64_t i = 0; i < D; ++i) ss += (xr[i] - mu) * (xr[i] - mu);
      const double rs = 1.0 / std::sqrt(ss / double(D) + p.eps);
      mean.data<T>()[r] = static_cast<T>(mu);
      rstd.data<T>()[r] = static_cast<T>(rs);
      for (int64_t i = 0; i < D; ++i)
        yr[i] = static_cast<T>((xr[i] - mu) * rs * (pw ? double(pw[i]) : 1.0) + (pb ? double(pb[i]) : 0.0));
    }
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
    std::vector<double> wsum(static_cast<size_t>(D), 0.0), bsum(static_cast<size_t>(D), 0.0);
    for (int64_t r = 0; r < p.M; ++r) {
      const T* xr = x.data<T>() + r * D;    // (D)
      const T* dyr = dy.data<T>() + r * D;  // (D)
      const double mu = mean.data<T>()[r], rs = rstd.data<T>()[r];
      double sg = 0, sgx = 0;  // sum(g), sum(g * xhat)
      for (int64_t i = 0; i < D; ++i) {
        const double xhat = (xr[i] - mu) * rs;
        const double g = double(dyr[i]) * (pw ? double(pw[i]) : 1.0);
        sg += g;
        sgx += g * xhat;
        wsum[static_cast<size_t>(i)] += double(dyr[i]) * xhat;
        bsum[static_cast<size_t>(i)] += double(dyr[i]);
      }
      if (!dx.defined()) continue;
      const double a = sg / double(D), b = sgx / double(D);
      T* dxr = dx.data<T>() + r * D;
      for (int64_t i = 0; i < D; ++i) {
        const double xhat = (xr[i] - mu) * rs;
        const double g = double(dyr[i]) * (pw ? double(pw[i]) : 1.0);
        dxr[i] = static_cast<T>(rs * (g - a - xhat * b));
      }
    }
    if (dweight.defined())
      for (int64_t i = 0; i < D; ++i) dweight.data<T>()[i] = static_cast<T>(wsum[static_cast<size_t>(i)]);
    if (dbias.defined())
      for (int64_t i = 0; i < D; ++i) dbias.data<T>()[i] = static_cast<T>(bsum[static_cast<size_t>(i)]);
  });
}

}  // namespace tg::cpu
