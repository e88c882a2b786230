// CUDA launchers of layer_norm; same signatures and meaning as tg::cpu in ops/layer_norm.h.
// Ordered on the framework stream of x's device; deterministic (fixed-order reductions, no
// atomics).
#pragma once
#include "../../core/tensor.h"
#include "../layer_norm.h"

namespace tg::cuda {
void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, const LayerNormProblem& p);
void layer_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                         const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         const LayerNormProblem& p);
}  // namespace tg::cuda
