// The CPU reference kernels of the shape (ops/shape.h) and pooling (ops/pool.h) families, in
// the signature every kernel entry has: outputs, inputs, problem. Each checks its buffers
// first, so a kernel called directly (tests) cannot read or write out of bounds.
#pragma once
#include "../../core/tensor.h"
#include "../pool.h"
#include "../shape.h"

namespace tg::cpu {

// small[o, j, i] = big[o, start + j * step, i]
void slice_gather(const Tensor& small, const Tensor& big, const SliceProblem& p);
// big[o, start + j * step, i] = small[o, j, i]; other elements of big are left as they are.
void slice_scatter(const Tensor& big, const Tensor& small, const SliceProblem& p);

// out (N, C, oD, oH, oW); indices (same shape, i64, flat positions in the input's D*H*W
// plane) for max pooling, undefined for the average kinds.
void pool_forward(const Tensor& out, const Tensor& indices, const Tensor& x, const PoolProblem& p);
// dx (N, C, D, H, W) from dy; indices as pool_forward wrote them (max only).
void pool_backward(const Tensor& dx, const Tensor& dy, const Tensor& indices, const PoolProblem& p);

}  // namespace tg::cpu
