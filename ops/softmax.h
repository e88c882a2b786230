// softmax and log_softmax over one dim (negative dims count from the end), numerically
// stable: each row is shifted by its max before exp, so logits of 1000 stay finite. A row
// with some -inf gets 0 there (log_softmax: -inf); a row that is all -inf is NaN, as in
// PyTorch. Floating dtypes; output like the input.
#pragma once
#include <cstdint>

#include "../core/tensor.h"

namespace tg {

// The family's problem description: x seen as (outer, dim_size, inner), the reduced dim in
// the middle. Element (o, j, i) sits at (o * dim_size + j) * inner + i; a "row" is one
// (o, i) pair, its dim_size elements inner apart.
struct SoftmaxProblem {
  int64_t outer = 1;
  int64_t dim_size = 1;
  int64_t inner = 1;
  bool log = false;  // log_softmax

  int64_t rows() const { return outer * inner; }
};

// Validates dim against the shape (ShapeError naming op, dim and shape) and splits it.
// A 0-d tensor is one row of one element (dim 0 or -1), as in PyTorch.
SoftmaxProblem make_softmax_problem(const char* op, const Shape& shape, int64_t dim, bool log);

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// From the forward's output y (both need only y):
//   softmax:     dx = y * (dy - sum_dim(dy * y))
//   log_softmax: dx = dy - exp(y) * sum_dim(dy)
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim, bool log);

// Throw unless the kernels' buffers fit the problem (shapes, dtypes, devices).
void check_softmax_buffers(const char* op, const Tensor& out, const Tensor& x, const SoftmaxProblem& p);
void check_softmax_backward_buffers(const char* op, const Tensor& dx, const Tensor& dy, const Tensor& y,
                                    const SoftmaxProblem& p);

}  // namespace tg
