// The CPU reference kernels' entry points, one signature style for all: outputs first,
// then inputs, then params. Outputs are allocated and validated by the caller (ops/*.cpp).
#pragma once
#include "../../core/tensor.h"
#include "../elementwise.h"

namespace tg {
struct ReduceIndex;
}

namespace tg::cpu {

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void affine(const Tensor& out, const Tensor& a, double scale, double shift);
void relu(const Tensor& out, const Tensor& x);
void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
void sum(const Tensor& out, const Tensor& x, const ReduceIndex& index);
void permute(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims);
void cast(const Tensor& out, const Tensor& x);       // any two dtypes, the half types included
void cast_half(const Tensor& out, const Tensor& x);  // cast where either side is bf16 / f16 (cast_half.cpp)

}  // namespace tg::cpu
