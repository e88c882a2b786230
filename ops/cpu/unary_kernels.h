// The CPU reference kernels of the unary and softmax families (ops/unary.h, ops/softmax.h),
// in the signature every kernel entry has: outputs, inputs, problem. Each checks its buffers
// first, so a kernel called directly (tests) cannot read or write out of bounds. Values are
// computed in double whatever the dtype: the reference is the accurate one.
#pragma once
#include "../../core/tensor.h"
#include "../softmax.h"
#include "../unary.h"

namespace tg::cpu {

void unary(const Tensor& out, const Tensor& x, const UnaryParams& p);
// saved is y where unary_saves_output(p.op), else x.
void unary_backward(const Tensor& dx, const Tensor& dy, const Tensor& saved, const UnaryParams& p);

void softmax(const Tensor& out, const Tensor& x, const SoftmaxProblem& p);
void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, const SoftmaxProblem& p);

}  // namespace tg::cpu
