// The optimizers' per-element updates as single fused passes: the scalar settings of one
// step (shared with the CPU loops in sgd.cpp / adam.cpp) and the CUDA launchers. Every tensor
// is contiguous, on one GPU, of one dtype (f32 or f64), all of the parameter's shape; the
// caller (Optimizer::step) has checked that.
#pragma once
#include "core/tensor.h"

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
};

}  // namespace tg::nn

namespace tg::cuda {

// momentum_buffer (param's shape) is read and written when momentum != 0, else unused
// (may be undefined).
void sgd_update(const Tensor& param, const Tensor& momentum_buffer, const Tensor& grad, const nn::SGDUpdate& u);
void adam_update(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad,
                 const nn::AdamUpdate& u);

}  // namespace tg::cuda
