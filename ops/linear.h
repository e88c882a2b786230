// Matrix products: matmul (M,K)x(K,N) and linear (x w^T + b). Both reduce to one GEMM
// problem, C = op(A) * op(B) (+ bias per column), shared by the CPU reference and the
// CUDA kernel, so a test can pose the same problem to both.
#pragma once
#include <cstdint>

#include "../core/tensor.h"

namespace tg {

Tensor matmul(const Tensor& a, const Tensor& b);                              // (M,K)x(K,N) -> (M,N)
// x (B, in) or a single vector (in); w (out, in); b (out) or undefined -> (B, out) or (out).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// C (M, N) = op(A) (M, K) * op(B) (K, N), every matrix row-major and contiguous.
// transA: A is stored as (K, M), so op(A) = A^T; transB: B is stored as (N, K).
struct GemmProblem {
  int64_t M = 0, N = 0, K = 0;
  bool transA = false, transB = false;

  int64_t a_rows() const { return transA ? K : M; }
  int64_t a_cols() const { return transA ? M : K; }
  int64_t b_rows() const { return transB ? N : K; }
  int64_t b_cols() const { return transB ? K : N; }
};

// CUTLASS's can_implement: throws unless c, a, b (and bias, when defined) have the shapes
// the problem says, one floating dtype and one device. Both kernels call it first.
void check_gemm_operands(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias,
                         const GemmProblem& p);

}  // namespace tg

// Kernel entry points (outputs, inputs, params), called by ops/linear.cpp and by tests that
// pose a problem directly. The caller has validated shapes, dtypes and devices.
// The CUDA twins with the same signatures are in ops/cuda/linear.h.
namespace tg::cpu {
// c (M, N) = op(a) * op(b) + bias; bias (N) or undefined.
void gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p);
// db (cols) = sum over rows of dy (rows, cols): the bias gradient.
void sum_rows(const Tensor& db, const Tensor& dy);
// Both gradients of y (B, out) = x (B, in) w^T: dx (B, in) = dy w and dw (out, in) = dy^T x.
// (On the GPU, shapes of a 1x1 convolution read dy once for both.)
void linear_grad_input_weight(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                              const Tensor& w);
}  // namespace tg::cpu
