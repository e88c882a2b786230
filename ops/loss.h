// Losses. mse_loss and cross_entropy reduce by the mean to a scalar of shape []; the
// elementwise losses below take a reduction.
#pragma once
#include "../core/tensor.h"

namespace tg {

// How an elementwise loss reduces its per-element values: to their mean or sum (shape []),
// or not at all (the values, of the prediction's shape).
enum class Reduction { mean, sum, none };
const char* reduction_name(Reduction r);

// The elementwise losses of one family: the same kernels, the formulas in
// ops/loss_pointwise.h. `beta` is smooth L1's beta and Huber's delta.
enum class PointwiseLoss { bce_with_logits, l1, smooth_l1, huber };
struct PointwiseLossParams {
  PointwiseLoss kind = PointwiseLoss::l1;
  Reduction reduction = Reduction::mean;
  double beta = 1.0;
};
const char* pointwise_loss_name(PointwiseLoss kind);  // "binary_cross_entropy_with_logits", ...

// Binary cross entropy on logits, as torch's binary_cross_entropy_with_logits (no weights):
// max(x, 0) - x * y + log1p(exp(-|x|)) per element, stable for any logit. logits and target
// (probabilities, usually 0 or 1) of one shape, dtype and device; both get gradients.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::mean);
// |pred - target| per element.
Tensor l1_loss(const Tensor& pred, const Tensor& target, Reduction reduction = Reduction::mean);

struct SmoothL1Options {
  double beta = 1.0;  // finite, >= 0; 0 makes it l1_loss
  Reduction reduction = Reduction::mean;
};
// |d| < beta ? d^2 / (2 beta) : |d| - beta / 2, with d = pred - target (torch's smooth_l1_loss).
Tensor smooth_l1_loss(const Tensor& pred, const Tensor& target, SmoothL1Options options = {});

struct HuberOptions {
  double delta = 1.0;  // finite, > 0
  Reduction reduction = Reduction::mean;
};
// |d| < delta ? d^2 / 2 : delta * (|d| - delta / 2) (torch's huber_loss).
Tensor huber_loss(const Tensor& pred, const Tensor& target, HuberOptions options = {});

// mean((pred - target)^2) over all elements; pred and target of one shape. Both get gradients.
Tensor mse_loss(const Tensor& pred, const Tensor& target);
// mean over rows of -log softmax(logits)[target]: logits (N, classes), targets i64 (N) with
// values in [0, classes). Computed through log-sum-exp, so large logits do not overflow.
// A target out of range throws tg::Error: at once on the CPU. On a GPU the values are checked
// by the kernel, so that a training step never waits for the device: that call's loss is NaN,
// and the error is thrown by the next cross_entropy on that device or by check_errors(device).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);

// Waits for the device's queued work (like tg::synchronize) and throws the errors that ops
// found on the device since the last check (today: cross_entropy's out-of-range targets).
// A no-op on the CPU, where ops validate everything before they run.
void check_errors(Device d);

// Throw unless the kernels' buffers fit together (shapes, dtypes, devices); both backends
// call them first. `scalar` is the loss (forward) or its one-element incoming gradient (backward).
void check_mse_buffers(const char* op, const Tensor& pred, const Tensor& target, const Tensor& scalar);
void check_cross_entropy_buffers(const char* op, const Tensor& logits, const Tensor& targets,
                                 const Tensor& lse, const Tensor& scalar);
// The full checks of the backward kernels' arguments (same order as the kernel entry points).
void check_mse_backward_buffers(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                                const Tensor& pred, const Tensor& target);
void check_cross_entropy_backward_buffers(const Tensor& dlogits, const Tensor& grad_out, const Tensor& logits,
                                          const Tensor& targets, const Tensor& lse);
// `out` is the loss (forward) or its incoming gradient (backward): shape [] when reduced,
// else pred's shape. The gradient buffers, each optional, are like pred.
void check_pointwise_loss_buffers(const char* op, const Tensor& out, const Tensor& pred, const Tensor& target,
                                  const PointwiseLossParams& p);
void check_pointwise_loss_backward_buffers(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                                           const Tensor& pred, const Tensor& target, const PointwiseLossParams& p);

}  // namespace tg

// Kernel entry points (outputs, inputs, params), used by ops/loss.cpp and by tests. The CUDA
// twins with the same signatures are in ops/cuda/loss.h. grad_out is the loss's incoming
// gradient, a one-element tensor on the same device.
namespace tg::cpu {
void mse_loss_forward(const Tensor& out, const Tensor& pred, const Tensor& target);
// dpred, dtarget like pred; either may be undefined (not computed).
void mse_loss_backward(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                       const Tensor& pred, const Tensor& target);
// out []; lse (N), always f64: each row's log-sum-exp, saved for backward (in f64 so that
// softmax = exp(x - lse) keeps f32 accuracy when the logits are large).
// Targets must have been validated (a bad one gives NaN, never an out-of-bounds read).
void cross_entropy_forward(const Tensor& out, const Tensor& lse, const Tensor& logits, const Tensor& targets);
// dlogits (N, classes) = grad_out * (softmax - onehot) / N
void cross_entropy_backward(const Tensor& dlogits, const Tensor& grad_out, const Tensor& logits,
                            const Tensor& targets, const Tensor& lse);
// out: [] (mean, sum) or pred's shape (none).
void pointwise_loss_forward(const Tensor& out, const Tensor& pred, const Tensor& target,
                            const PointwiseLossParams& p);
// grad_out like out; dpred, dtarget like pred, either may be undefined (not computed).
void pointwise_loss_backward(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                             const Tensor& pred, const Tensor& target, const PointwiseLossParams& p);
}  // namespace tg::cpu
