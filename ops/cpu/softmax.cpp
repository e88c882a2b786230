// CPU reference of softmax and log_softmax: per row, max and sum of exp in double. Threads
// split the rows, (outer, inner) pairs, each computed whole by one thread.
#include <cmath>
#include <limits>

#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/unary_kernels.h"

namespace tg::cpu {

void softmax(const Tensor& out, const Tensor& x, const SoftmaxProblem& p) {
  const char* op = p.log ? "log_softmax" : "softmax";
  check_softmax_buffers(op, out, x, p);
  // With dim_size 0, outer * inner rows of nothing (or an overflowing count): no work.
  if (x.numel() == 0) return;
  dispatch_floating(op, x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const int64_t D = p.dim_size, inner = p.inner;
    const T* px = x.data<T>();  // (outer, D, inner)
    T* po = out.data<T>();
    parallel_for(p.outer * inner, 3 * D, [&](int64_t oi) {
        const int64_t o = oi / inner, i = oi % inner;
        const T* row = px + o * D * inner + i;  // (D), inner apart
        T* dst = po + o * D * inner + i;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < D; ++j) m = std::fmax(m, double(row[j * inner]));
        // A row of -inf only: m = -inf and x - m is NaN everywhere, PyTorch's answer too.
        double s = 0;
        for (int64_t j = 0; j < D; ++j) s += std::exp(double(row[j * inner]) - m);
        const double log_s = std::log(s);
        for (int64_t j = 0; j < D; ++j) {
          const double v = double(row[j * inner]);
          // (v - m) - log(s), not v - (m + log(s)): for logits near 1000 the sum would round
          // to the ulp of 1000 and lose the small result's digits.
          dst[j * inner] = static_cast<T>(p.log ? (v - m) - log_s : std::exp(v - m) / s);
        }
      });
  });
}

void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, const SoftmaxProblem& p) {
  const char* op = p.log ? "log_softmax_backward" : "softmax_backward";
  check_softmax_backward_buffers(op, dx, dy, y, p);
  if (y.numel() == 0) return;  // as the forward
  dispatch_floating(op, y.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const int64_t D = p.dim_size, inner = p.inner;
    const T* y0 = y.data<T>();  // (outer, D, inner)
    const T* g0 = dy.data<T>();
    T* d0 = dx.data<T>();
    parallel_for(p.outer * inner, 2 * D, [&](int64_t oi) {
        const int64_t o = oi / inner, i = oi % inner;
        const int64_t base = o * D * inner + i;
        const T* py = y0 + base;
        const T* pg = g0 + base;
        T* pd = d0 + base;
        double s = 0;  // softmax: sum(dy * y); log_softmax: sum(dy)
        for (int64_t j = 0; j < D; ++j) {
          const double g = double(pg[j * inner]);
          s += p.log ? g : g * double(py[j * inner]);
        }
        for (int64_t j = 0; j < D; ++j) {
          const double g = double(pg[j * inner]), v = double(py[j * inner]);
          pd[j * inner] = static_cast<T>(p.log ? g - std::exp(v) * s : v * (g - s));
        }
      });
  });
}

}  // namespace tg::cpu
