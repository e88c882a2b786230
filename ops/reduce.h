// Reductions: sum and mean over all elements or a list of dims (negative dims count from
// the end), with or without keepdim; sum_to reduces a broadcast gradient back to a shape.
#pragma once
#include <vector>

#include "../core/tensor.h"

namespace tg {

Tensor sum(const Tensor& x);  // all elements -> shape []
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

// Sums `x` over the dimensions along which `shape` was broadcast to x's shape
// (the backward of broadcasting). Returns x itself when the shapes already match.
Tensor sum_to(const Tensor& x, const Shape& shape);

// Expands x (keepdim-shaped or broadcastable) to `shape` (the backward of sum).
Tensor expand(const Tensor& x, const Shape& shape);

}  // namespace tg
