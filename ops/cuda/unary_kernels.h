// CUDA launchers of the unary and softmax families; same signatures and meaning as tg::cpu
// in ops/cpu/unary_kernels.h. Defined only when TG_CUDA is on; ordered on the framework
// stream of the tensors' device. Each checks its buffers before it launches anything.
#pragma once
#include "../../core/tensor.h"
#include "../softmax.h"
#include "../unary.h"

namespace tg::cuda {

void unary(const Tensor& out, const Tensor& x, const UnaryParams& p);
void unary_backward(const Tensor& dx, const Tensor& dy, const Tensor& saved, const UnaryParams& p);

void softmax(const Tensor& out, const Tensor& x, const SoftmaxProblem& p);
void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, const SoftmaxProblem& p);

}  // namespace tg::cuda
