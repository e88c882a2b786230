// CUDA launchers of the linear family; same signatures and meaning as tg::cpu in
// ops/linear.h. Ordered on the framework stream of the output's device.
#pragma once
#include "../../core/tensor.h"
#include "../linear.h"

namespace tg::cuda {
// c (M, N) = op(a) * op(b) + bias; bias (N) or undefined. Any M, N, K (edge tiles guarded).
void gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p);
// db (cols) = sum over rows of dy (rows, cols), in a fixed order (deterministic).
void sum_rows(const Tensor& db, const Tensor& dy);
// dx (B, in) = dy w and dw (out, in) = dy^T x; one pass over dy for 1x1-convolution shapes.
void linear_grad_input_weight(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                              const Tensor& w);
// Whether linear_bf16 and its backward take these sizes (the engine's index limits); where not,
// the caller computes on f32 copies.
bool linear_bf16_can_implement(int64_t B, int64_t in, int64_t out);
// y (B, out, bf16) = x (B, in) w (out, in)^T + b (out, or undefined), all bf16: BF16 products
// accumulated in f32 (the engine's engine_gemm_bf16), the sum rounded once to bf16.
void linear_bf16(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b);
// Its input and weight gradients, all bf16: dx (B, in) = dy (B, out) w and dw (out, in) = dy^T x,
// each the BF16 products accumulated in f32, rounded once. Either output may be undefined.
void linear_bf16_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w);
}  // namespace tg::cuda
