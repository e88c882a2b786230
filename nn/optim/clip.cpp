#include "nn/optim/clip.h"

#include <cmath>
#include <limits>

#include "core/dtype_dispatch.h"

namespace tg::nn {
namespace {

// The grads to clip (parameters without one skipped), checked: one device, floating point.
std::vector<Tensor> grads_of(const char* op, const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  size_t first = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    TG_CHECK(params[i].defined(), op, ": parameter ", i, " is an undefined tensor");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    TG_CHECK_AS(DTypeError, g.dtype() == DType::f32 || g.dtype() == DType::f64, op, ": the grad of parameter ", i,
                " ", describe(g), " is not f32 or f64");
    if (grads.empty()) first = i;
    TG_CHECK_AS(DeviceError, grads.empty() || g.device() == grads[0].device(), op, ": the grad of parameter ", i,
                " ", describe(g), " is on ", g.device(), " but that of parameter ", first, " ", describe(grads[0]),
                " is on ", grads[0].device(), " (every grad must be on one device)");
    if (g.numel() > 0) grads.push_back(g);
  }
  return grads;
}

// sum |g|^p (p finite) or max |g| (p infinite), over one grad, in double; NaN propagates.
template <class T>
double accumulate(const T* g, int64_t n, double p, double acc) {
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(double(g[i]));
    if (std::isinf(p)) acc = (a > acc || std::isnan(a)) && !std::isnan(acc) ? a : acc;
    else acc += p == 2 ? a * a : p == 1 ? a : std::pow(a, p);
  }
  return acc;
}

}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  const char* op = "clip_grad_norm_";
  TG_CHECK(!std::isnan(max_norm) && max_norm >= 0, op, ": max_norm ", max_norm, " must be >= 0 (and not NaN)");
  TG_CHECK(!std::isnan(norm_type) && norm_type > 0, op, ": norm_type ", norm_type,
           " must be > 0 (2 for the Euclidean norm, infinity for the largest magnitude)");
  const std::vector<Tensor> grads = grads_of(op, params);
  if (grads.empty()) return 0.0;
  const Device d = grads[0].device();
  double norm = 0;
  if (d.is_cuda()) {
#if TG_CUDA
    norm = cuda::clip_grad_norm(d.index, grads, max_norm, norm_type);
#else
    TG_FAIL(op, ": tapegrad was built without CUDA");
#endif
  } else {
    double acc = 0;
    for (const Tensor& g : grads)
      acc = g.dtype() == DType::f32 ? accumulate(g.data<float>(), g.numel(), norm_type, acc)
                                    : accumulate(g.data<double>(), g.numel(), norm_type, acc);
    norm = std::isinf(norm_type) ? acc : norm_type == 2 ? std::sqrt(acc) : norm_type == 1 ? acc
                                                                           : std::pow(acc, 1.0 / norm_type);
    const double scale = max_norm / (norm + 1e-6);
    if (std::isfinite(norm) && scale < 1) {
      for (const Tensor& g : grads) {
        dispatch_floating(op, g.dtype(), [&](auto* tag) {
          using T = TG_ELEMENT_TYPE(tag);
          T* p = g.data<T>();
          const T s = static_cast<T>(scale);  // the GPU multiplies by the same rounded scale
          for (int64_t i = 0; i < g.numel(); ++i) p[i] = p[i] * s;
        });
      }
    }
  }
  for (const Tensor& g : grads) g.bump_version();
  TG_CHECK(!error_if_nonfinite || std::isfinite(norm), op, ": the total ", norm_type, "-norm of the grads is ",
           norm, "; the grads were left unchanged (pass error_if_nonfinite = false to get the norm instead)");
  return norm;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  const char* op = "clip_grad_value_";
  TG_CHECK(!std::isnan(clip_value) && clip_value >= 0, op, ": clip_value ", clip_value,
           " must be >= 0 (and not NaN)");
  const std::vector<Tensor> grads = grads_of(op, params);
  if (grads.empty()) return;
  const Device d = grads[0].device();
  if (d.is_cuda()) {
#if TG_CUDA
    cuda::clip_grad_value(d.index, grads, clip_value);
#else
    TG_FAIL(op, ": tapegrad was built without CUDA");
#endif
  } else {
    for (const Tensor& g : grads) {
      dispatch_floating(op, g.dtype(), [&](auto* tag) {
        using T = TG_ELEMENT_TYPE(tag);
        T* p = g.data<T>();
        const T c = static_cast<T>(clip_value);
        for (int64_t i = 0; i < g.numel(); ++i) p[i] = p[i] < -c ? -c : p[i] > c ? c : p[i];
      });
    }
  }
  for (const Tensor& g : grads) g.bump_version();
}

}  // namespace tg::nn
