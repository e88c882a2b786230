// CUDA launcher of dropout; same signature and meaning as tg::cpu in ops/dropout.h.
#pragma once
#include "../../core/tensor.h"
#include "../dropout.h"

namespace tg::cuda {
void dropout_apply(const Tensor& out, const Tensor& in, const DropoutProblem& q);
}  // namespace tg::cuda
