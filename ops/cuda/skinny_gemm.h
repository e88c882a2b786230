// Skinny matrix products: a GEMM one of whose dimensions is at most 8 (a matrix-vector
// product, or a few of them). They are bound by memory bandwidth, not arithmetic: the
// kernels stream the one large operand once, with 16-byte loads, and never use atomics,
// so results are the same bits every run. Chosen by tg::cuda::gemm (ops/cuda/linear.cu).
#pragma once
#include "../../core/tensor.h"
#include "../linear.h"

namespace tg::cuda {

inline constexpr int64_t kSkinnyMax = 8;

// True when the problem has a dimension <= kSkinnyMax and f32 operands; then
// skinny_gemm computes it.
bool skinny_gemm_applies(const Tensor& c, const GemmProblem& p);
// c (M, N) = op(a) * op(b) + bias (same contract as gemm).
void skinny_gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p);

}  // namespace tg::cuda
