// One kernel per optimizer: every parameter element is read, updated with its state and
// written back in a single pass (grid-stride, 64-bit indices). Arithmetic is in the
// parameter's type with the same expression order as the CPU loops.
#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "nn/optim/cuda_updates.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void sgd_kernel(T* __restrict__ param, T* __restrict__ buf, const T* __restrict__ grad, int64_t n,
                           T lr, T momentum, T one_minus_dampening, T weight_decay, bool use_momentum,
                           bool nesterov, bool first_step) {
  TG_GRID_STRIDE(i, n) {
    T p = param[i];
    T d = grad[i];
    if (weight_decay != T(0)) d = d + weight_decay * p;
    if (use_momentum) {
      T b = first_step ? d : momentum * buf[i] + one_minus_dampening * d;
      buf[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    param[i] = p - lr * d;
  }
}

template <class T>
__global__ void adam_kernel(T* __restrict__ param, T* __restrict__ exp_avg, T* __restrict__ exp_avg_sq,
                            const T* __restrict__ grad, int64_t n, T one_minus_beta1, T beta2,
                            T one_minus_beta2, T eps, T weight_decay, T decay_factor, bool decoupled,
                            T step_size, T bias_correction2_sqrt) {
  TG_GRID_STRIDE(i, n) {
    T p = param[i];
    T g = grad[i];
    if (decoupled) p = p * decay_factor;
    else if (weight_decay != T(0)) g = g + weight_decay * p;
    T m = exp_avg[i];
    m = m + one_minus_beta1 * (g - m);
    T v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    T denom = sqrt(v) / bias_correction2_sqrt + eps;
    param[i] = p - step_size * (m / denom);
  }
}

}  // namespace

void sgd_update(const Tensor& param, const Tensor& momentum_buffer, const Tensor& grad, const nn::SGDUpdate& u) {
  int64_t n = param.numel();
  if (n == 0) return;
  int dev = param.device().index;
  set_device(dev);
  bool use_momentum = u.momentum != 0;
  dispatch_floating("optimizer update", param.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    T* buf = use_momentum ? momentum_buffer.data<T>() : nullptr;
    sgd_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(
        param.data<T>(), buf, grad.data<T>(), n, T(u.lr), T(u.momentum), T(1.0 - u.dampening),
        T(u.weight_decay), use_momentum, u.nesterov, u.first_step);
  });
  TG_LAUNCH_CHECK();
}

void adam_update(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad,
                 const nn::AdamUpdate& u) {
  int64_t n = param.numel();
  if (n == 0) return;
  int dev = param.device().index;
  set_device(dev);
  dispatch_floating("optimizer update", param.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    adam_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(
        param.data<T>(), exp_avg.data<T>(), exp_avg_sq.data<T>(), grad.data<T>(), n, T(1.0 - u.beta1),
        T(u.beta2), T(1.0 - u.beta2), T(u.eps), T(u.weight_decay), T(1.0 - u.lr * u.weight_decay),
        u.decoupled_weight_decay, T(u.step_size), T(u.bias_correction2_sqrt));
  });
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
