// CUDA launchers of the losses; same signatures and meaning as tg::cpu in ops/loss.h.
// Ordered on the framework stream of the inputs' device; deterministic reductions.
#pragma once
#include "../../core/tensor.h"
#include "../loss.h"

namespace tg::cuda {
void mse_loss_forward(const Tensor& out, const Tensor& pred, const Tensor& target);
void mse_loss_backward(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                       const Tensor& pred, const Tensor& target);
void cross_entropy_forward(const Tensor& out, const Tensor& lse, const Tensor& logits, const Tensor& targets);
void cross_entropy_backward(const Tensor& dlogits, const Tensor& grad_out, const Tensor& logits,
                            const Tensor& targets, const Tensor& lse);
void pointwise_loss_forward(const Tensor& out, const Tensor& pred, const Tensor& target,
                            const PointwiseLossParams& p);
void pointwise_loss_backward(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                             const Tensor& pred, const Tensor& target, const PointwiseLossParams& p);
// Throws tg::Error if a cross_entropy_forward on `device` met an out-of-range target (the
// targets are checked by the kernel, not on the host: see loss.cu). With `wait`, waits for
// the latest call's check to arrive; without, inspects only one that already has.
void check_target_errors(int device, bool wait);
}  // namespace tg::cuda
