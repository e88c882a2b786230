// CUDA launchers of upsample; same signatures and meaning as tg::cpu in ops/upsample.h.
#pragma once
#include "../../core/tensor.h"
#include "../upsample.h"

namespace tg::cuda {
void upsample_forward(const Tensor& y, const Tensor& x, const UpsampleProblem& p);
void upsample_backward(const Tensor& dx, const Tensor& dy, const UpsampleProblem& p);
}  // namespace tg::cuda
