// Shape ops: cat, split/chunk, narrow/slice (copies), flatten/unflatten (views through
// Tensor::reshape). Dims count from the end when negative, as in PyTorch.
//
//   Tensor y = tg::cat({a, b, c}, 1);                 // along dim 1; other dims must agree
//   std::vector<Tensor> parts = tg::split(x, {2, 5}, -1);
//   Tensor every_other = tg::slice(x, 2, 1, 9, 2);    // x[:, :, 1:9:2]
//   Tensor flat = tg::flatten(x, 1);                  // (N, C*H*W)
//
// cat, split and slice are one strided copy: a tensor seen as (outer, dim_size, inner) and a
// window of `length` positions along the middle axis, from `start` every `step`. cat
// scatters each input into its window of the output, split gathers each window out, and a
// slice's backward scatters the gradient into zeros. The CPU reference and the CUDA kernels
// share that one problem description.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "../core/tensor.h"

namespace tg {

// The window of the big tensor (outer, dim_size, inner) that the small tensor
// (outer, length, inner) maps to: big[o, start + j * step, i] <-> small[o, j, i].
struct SliceProblem {
  int64_t outer = 1;     // product of the dims before `dim`
  int64_t dim_size = 0;  // the big tensor's size along `dim`
  int64_t inner = 1;     // product of the dims after `dim`
  int64_t start = 0;
  int64_t length = 0;
  int64_t step = 1;
  int64_t small_numel() const { return outer * length * inner; }
};

// The problem for a window of `big` along `dim` (already normalized); checks that the
// window lies inside the dim (ShapeError naming `op`).
SliceProblem make_slice_problem(const char* op, const Shape& big, int64_t dim, int64_t start, int64_t length,
                                int64_t step);
// The shape of the window: `big` with `length` along `dim`.
Shape slice_shape(const Shape& big, int64_t dim, int64_t length);

// `dim` in [-rank, rank) made non-negative, or a ShapeError naming op, dim and shape.
int64_t normalize_dim(const char* op, int64_t dim, const Shape& shape);

// Concatenation along dim: every input has the same rank, dtype and device, and the same
// size in every other dim. One input returns a copy.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);

// Pieces of split_size along dim (the last one smaller when it does not divide), as
// PyTorch's split(int). A one-element braced list {n} picks this overload.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
// Pieces of the given sizes, which must sum to x's size along dim (PyTorch's split_with_sizes).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// As PyTorch: pieces of ceil(size / chunks), so fewer than `chunks` pieces may come back.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// x's positions start .. start + length - 1 along dim (start may be negative: counts from
// the end), a copy. Out of range is a ShapeError, never a clamp.
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
// x[start:end:step] along dim with Python's rules: negative start and end count from the
// end, both are clamped to [0, size]; step must be positive. A copy.
Tensor slice(const Tensor& x, int64_t dim, int64_t start = 0, int64_t end = std::numeric_limits<int64_t>::max(),
             int64_t step = 1);

// Dims start_dim..end_dim merged into one (a view). A 0-d tensor becomes 1-d, as in PyTorch.
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
// Dim `dim` split into `sizes` (one may be -1, inferred), a view.
Tensor unflatten(const Tensor& x, int64_t dim, const std::vector<int64_t>& sizes);

// The kernels' buffer checks (same dtype and device; shapes that fit the problem), called
// by both backends first so a kernel called directly (tests) cannot go out of bounds.
void check_slice_buffers(const char* op, const Tensor& big, const Tensor& small, const SliceProblem& p);

}  // namespace tg
