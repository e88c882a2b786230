// CPU reference of the shape family's one strided copy (ops/shape.h): rows of `inner`
// contiguous elements moved between a window of the big tensor and the small one.
#include <algorithm>

#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/shape_pool_kernels.h"

namespace tg::cpu {

namespace {

// Calls f(big_row, small_row) for every (o, j): the offsets of the rows that correspond.
// Rows are disjoint in both tensors (step >= 1), so threads split them.
template <class F>
void for_each_row(const SliceProblem& p, F&& f) {
  parallel_for(p.outer * p.length, p.inner, [&](int64_t oj) {
    const int64_t o = oj / p.length, j = oj % p.length;
    f((o * p.dim_size + p.start + j * p.step) * p.inner, (o * p.length + j) * p.inner);
  });
}

// dispatch_any, plus the half types moved as their 2-byte bit patterns: these ops only copy
// values, so bf16 / f16 tensors may be cut and joined on the CPU like any other.
template <class F>
void dispatch_moved(DType t, F&& f) {
  if (is_half(t)) f(static_cast<uint16_t*>(nullptr));
  else dispatch_any(t, f);
}

}  // namespace

void slice_gather(const Tensor& small, const Tensor& big, const SliceProblem& p) {
  check_slice_buffers("slice_gather", big, small, p);
  if (small.numel() == 0) return;
  dispatch_moved(big.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* src = static_cast<const T*>(big.raw_data());
    T* dst = static_cast<T*>(small.raw_data());
    for_each_row(p, [&](int64_t b, int64_t s) { std::copy(src + b, src + b + p.inner, dst + s); });
  });
}

void slice_scatter(const Tensor& big, const Tensor& small, const SliceProblem& p) {
  check_slice_buffers("slice_scatter", big, small, p);
  if (small.numel() == 0) return;
  dispatch_moved(big.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* src = static_cast<const T*>(small.raw_data());
    T* dst = static_cast<T*>(big.raw_data());
    for_each_row(p, [&](int64_t b, int64_t s) { std::copy(src + s, src + s + p.inner, dst + b); });
  });
}

}  // namespace tg::cpu
