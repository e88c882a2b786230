// The CUDA kernels of the basic ops, same signatures as ops/cpu/kernels.h. Defined only when
// TG_CUDA is on; ordered on the framework stream of the tensors' device.
#pragma once
#include "../../core/tensor.h"
#include "../elementwise.h"

namespace tg {
struct ReduceIndex;
}

namespace tg::cuda {

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void affine(const Tensor& out, const Tensor& a, double scale, double shift);
void relu(const Tensor& out, const Tensor& x);
void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
void sum(const Tensor& out, const Tensor& x, const ReduceIndex& index);
void permute(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims);

}  // namespace tg::cpu
