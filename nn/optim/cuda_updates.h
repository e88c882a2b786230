// The optimizers' per-element updates as single fused passes: the scalar settings of one
// step (shared with the CPU loops in sgd.cpp / adam.cpp) and the CUDA launchers. Every tensor
// is contiguous, on one GPU, of one dtype (f32 or f64), all of the parameter's shape; the
// caller (Optimizer::step) has checked that.
#pragma once
#include <cmath>
#include <cstddef>

#include "../../core/random.h"  // TG_HOST_DEVICE
#include "../../core/tensor.h"

namespace tg::nn {

// PyTorch's SGD, one step:
//   d = g + weight_decay * p
//   buf = first_step ? d : momentum * buf + (1 - dampening) * d     (only when momentum != 0)
//   d = nesterov ? d + momentum * buf : buf                         (only when momentum != 0)
//   p -= lr * d
struct SGDUpdate {
  double lr = 0;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer is uninitialized and gets d itself
};

// PyTorch's Adam / AdamW (single-tensor form), one step:
//   AdamW: p *= 1 - lr * weight_decay          Adam: g += weight_decay * p
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
//   p -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
struct AdamUpdate {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW
  double step_size = 0;                 // lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1;     // sqrt(1 - beta2^t)
  // Set for an update captured into a CUDA graph: the kernel reads step_size,
  // bias_correction2_sqrt and 1 - lr * weight_decay from here (written by
  // write_replay_scalars before each replay) instead of the fields above.
  const double* replay_scalars = nullptr;
};
constexpr std::size_t kAdamReplayScalars = 3;
inline void write_replay_scalars(double* out, const AdamUpdate& u) {
  out[0] = u.step_size;
  out[1] = u.bias_correction2_sqrt;
  out[2] = 1.0 - u.lr * u.weight_decay;  // AdamCoefficients' decay_factor, before its rounding to T
}

// The per-element steps, compiled into both the CPU loops and the CUDA kernels so the two run
// the same expressions in the same order; the settings are rounded to T once per step, on the host.
template <class T>
struct SGDCoefficients {
  T lr, momentum, one_minus_dampening, weight_decay;
  bool use_momentum, nesterov, first_step;
  explicit SGDCoefficients(const SGDUpdate& u)
      : lr(T(u.lr)), momentum(T(u.momentum)), one_minus_dampening(T(1.0 - u.dampening)),
        weight_decay(T(u.weight_decay)), use_momentum(u.momentum != 0), nesterov(u.nesterov),
        first_step(u.first_step) {}
};

// buf is read and written only when c.use_momentum (it may be null otherwise).
template <class T>
TG_HOST_DEVICE void sgd_step(T* param, T* buf, const T* grad, int64_t i, const SGDCoefficients<T>& c) {
  T p = param[i];
  T d = grad[i];
  if (c.weight_decay != T(0)) d = d + c.weight_decay * p;
  if (c.use_momentum) {
    T b = c.first_step ? d : c.momentum * buf[i] + c.one_minus_dampening * d;
    buf[i] = b;
    d = c.nesterov ? d + c.momentum * b : b;
  }
  param[i] = p - c.lr * d;
}

template <class T>
struct AdamCoefficients {
  T one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decay_factor, step_size, bias_correction2_sqrt;
  bool decoupled;
  explicit AdamCoefficients(const AdamUpdate& u)
      : one_minus_beta1(T(1.0 - u.beta1)), beta2(T(u.beta2)), one_minus_beta2(T(1.0 - u.beta2)), eps(T(u.eps)),
        weight_decay(T(u.weight_decay)), decay_factor(T(1.0 - u.lr * u.weight_decay)), step_size(T(u.step_size)),
        bias_correction2_sqrt(T(u.bias_correction2_sqrt)), decoupled(u.decoupled_weight_decay) {}
};

// The coefficients of a graph-captured update: the same roundings of the same doubles.
template <class T>
TG_HOST_DEVICE void read_replay_scalars(AdamCoefficients<T>& c, const double* s) {
  c.step_size = T(s[0]);
  c.bias_correction2_sqrt = T(s[1]);
  c.decay_factor = T(s[2]);
}

template <class T>
TG_HOST_DEVICE void adam_step(T* param, T* exp_avg, T* exp_avg_sq, const T* grad, int64_t i,
                                     const AdamCoefficients<T>& c) {
  T p = param[i];
  T g = grad[i];
  if (c.decoupled) p = p * c.decay_factor;
  else if (c.weight_decay != T(0)) g = g + c.weight_decay * p;
  T m = exp_avg[i];
  m = m + c.one_minus_beta1 * (g - m);
  T v = c.beta2 * exp_avg_sq[i] + c.one_minus_beta2 * g * g;
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
#ifdef __CUDA_ARCH__
  T denom = sqrt(v) / c.bias_correction2_sqrt + c.eps;
#else
  T denom = std::sqrt(v) / c.bias_correction2_sqrt + c.eps;
#endif
  param[i] = p - c.step_size * (m / denom);
}

}  // namespace tg::nn

namespace tg::cuda {

// momentum_buffer (param's shape) is read and written when momentum != 0, else unused
// (may be undefined).
void sgd_update(const Tensor& param, const Tensor& momentum_buffer, const Tensor& grad, const nn::SGDUpdate& u);
void adam_update(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad,
                 const nn::AdamUpdate& u);

}  // namespace tg::cuda
