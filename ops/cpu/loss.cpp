// CPU reference of the losses: loops with double accumulation. Threads split the elements
// (rows for cross-entropy); a loss's total adds fixed chunks in order (chunked_sum), so it is
// the same for any thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/loss.h"
#include "ops/loss_pointwise.h"

namespace tg::cpu {

void mse_loss_forward(const Tensor& out, const Tensor& pred, const Tensor& target) {
  check_mse_buffers("mse_loss_forward", pred, target, out);
  dispatch_floating("mse_loss", pred.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* p = pred.data<T>();
    const T* t = target.data<T>();
    const int64_t n = pred.numel();
    const double acc = chunked_sum(n, 1, [&](int64_t i0, int64_t i1) {
      double a = 0;
      for (int64_t i = i0; i < i1; ++i) {
        const double d = double(p[i]) - double(t[i]);
        a += d * d;
      }
      return a;
    });
    out.data<T>()[0] = static_cast<T>(acc / static_cast<double>(n));
  });
}

void mse_loss_backward(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                       const Tensor& pred, const Tensor& target) {
  check_mse_backward_buffers(dpred, dtarget, grad_out, pred, target);
  dispatch_floating("mse_loss_backward", pred.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* p = pred.data<T>();
    const T* t = target.data<T>();
    T* dp = dpred.defined() ? dpred.data<T>() : nullptr;
    T* dt = dtarget.defined() ? dtarget.data<T>() : nullptr;
    const int64_t n = pred.numel();
    const double k = 2.0 * double(grad_out.data<T>()[0]) / static_cast<double>(n);
    parallel_ranges(n, 2, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double g = k * (double(p[i]) - double(t[i]));
        if (dp) dp[i] = static_cast<T>(g);
        if (dt) dt[i] = static_cast<T>(-g);
      }
    });
  });
}

void cross_entropy_forward(const Tensor& out, const Tensor& lse, const Tensor& logits, const Tensor& targets) {
  check_cross_entropy_buffers("cross_entropy_forward", logits, targets, lse, out);
  dispatch_floating("cross_entropy", logits.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const int64_t N = logits.size(0), K = logits.size(1);
    const T* x = logits.data<T>();            // (N, K)
    const int64_t* t = targets.data<int64_t>();  // (N)
    double* plse = lse.data<double>();        // (N)
    // Per row in parallel (the row's term kept in a buffer), then the total in row order.
    std::vector<double> term(static_cast<size_t>(N));
    parallel_for(N, 2 * K, [&](int64_t r) {
      const T* row = x + r * K;
      const double m = *std::max_element(row, row + K);
      double s = 0;
      for (int64_t j = 0; j < K; ++j) s += std::exp(double(row[j]) - m);
      const double l = m + std::log(s);
      plse[r] = l;
      const bool valid = t[r] >= 0 && t[r] < K;
      term[static_cast<size_t>(r)] = valid ? l - double(row[t[r]]) : std::numeric_limits<double>::quiet_NaN();
    });
    double total = 0;
    for (double v : term) total += v;
    out.data<T>()[0] = static_cast<T>(total / static_cast<double>(N));
  });
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& grad_out, const Tensor& logits,
                            const Tensor& targets, const Tensor& lse) {
  check_cross_entropy_backward_buffers(dlogits, grad_out, logits, targets, lse);
  dispatch_floating("cross_entropy_backward", logits.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const int64_t N = logits.size(0), K = logits.size(1);
    const T* x = logits.data<T>();               // (N, K)
    const int64_t* t = targets.data<int64_t>();  // (N)
    const double* plse = lse.data<double>();     // (N)
    T* dx = dlogits.data<T>();                   // (N, K)
    const double k = double(grad_out.data<T>()[0]) / static_cast<double>(N);
    parallel_for(N, 2 * K, [&](int64_t r) {
      for (int64_t j = 0; j < K; ++j) {
        const double softmax = std::exp(double(x[r * K + j]) - plse[r]);
        dx[r * K + j] = static_cast<T>(k * (softmax - (j == t[r] ? 1.0 : 0.0)));
      }
    });
  });
}

void pointwise_loss_forward(const Tensor& out, const Tensor& pred, const Tensor& target,
                            const PointwiseLossParams& p) {
  const char* op = pointwise_loss_name(p.kind);
  check_pointwise_loss_buffers(op, out, pred, target, p);
  dispatch_floating(op, pred.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* x = pred.data<T>();   // (n)
    const T* y = target.data<T>();  // (n)
    T* o = out.data<T>();          // (n) for none, else (1)
    const int64_t n = pred.numel();
    if (p.reduction == Reduction::none) {
      parallel_ranges(n, 4, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) o[i] = static_cast<T>(pointwise_loss_value<double>(x[i], y[i], p.kind, p.beta));
      });
      return;
    }
    const double acc = chunked_sum(n, 4, [&](int64_t i0, int64_t i1) {
      double a = 0;
      for (int64_t i = i0; i < i1; ++i) a += pointwise_loss_value<double>(x[i], y[i], p.kind, p.beta);
      return a;
    });
    if (p.reduction == Reduction::sum) o[0] = static_cast<T>(acc);
    if (p.reduction == Reduction::mean) o[0] = static_cast<T>(acc / static_cast<double>(n));
  });
}

void pointwise_loss_backward(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                             const Tensor& pred, const Tensor& target, const PointwiseLossParams& p) {
  check_pointwise_loss_backward_buffers(dpred, dtarget, grad_out, pred, target, p);
  dispatch_floating(pointwise_loss_name(p.kind), pred.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* x = pred.data<T>();
    const T* y = target.data<T>();
    const T* g = grad_out.data<T>();  // (n) for none, else (1)
    T* dx = dpred.defined() ? dpred.data<T>() : nullptr;
    T* dy = dtarget.defined() ? dtarget.data<T>() : nullptr;
    const int64_t n = pred.numel();
    const double scale = p.reduction == Reduction::mean ? 1.0 / static_cast<double>(n) : 1.0;
    parallel_ranges(n, 8, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double gi = double(g[p.reduction == Reduction::none ? i : 0]) * scale;
        if (dx) dx[i] = static_cast<T>(gi * pointwise_loss_dpred<double>(x[i], y[i], p.kind, p.beta));
        if (dy) dy[i] = static_cast<T>(gi * pointwise_loss_dtarget<double>(x[i], y[i], p.kind, p.beta));
      }
    });
  });
}

}  // namespace tg::cpu
