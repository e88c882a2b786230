// CUDA launchers of group_norm; same signatures and meaning as tg::cpu in ops/norm.h.
// Ordered on the framework stream of x's device; deterministic (fixed-order reductions).
#pragma once
#include "../../core/tensor.h"
#include "../norm.h"

namespace tg::cuda {
void group_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& gamma, const Tensor& beta, const GroupNormProblem& p,
                        const Tensor& residual = Tensor());
void group_norm_backward(const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, const Tensor& dy,
                         const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                         const GroupNormProblem& p, const Tensor& y = Tensor());
}  // namespace tg::cuda
