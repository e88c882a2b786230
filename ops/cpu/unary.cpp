// CPU reference of the unary family: the shared formulas (ops/unary_math.h) evaluated in
// double for every dtype, so that the f32 reference carries no f32 rounding but the last.
// Threads split the elements.
#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/unary_kernels.h"
#include "ops/unary_math.h"

namespace tg::cpu {

void unary(const Tensor& out, const Tensor& x, const UnaryParams& p) {
  const char* name = unary_name(p.op);
  check_unary_params(p);
  check_unary_buffers(name, out, x);
  const unary_math::Scalars s = unary_math::scalars_of(p);
  dispatch_floating(name, x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    const int64_t n = x.numel();
    unary_math::visit(unary_math::fn_of(p), [&](auto fn) {
      constexpr unary_math::Fn F = decltype(fn)::value;
      parallel_ranges(n, 8, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) po[i] = static_cast<T>(unary_math::forward<F, double>(double(px[i]), s));
      });
    });
  });
}

void unary_backward(const Tensor& dx, const Tensor& dy, const Tensor& saved, const UnaryParams& p) {
  const char* name = unary_name(p.op);
  check_unary_params(p);
  check_unary_backward_buffers(name, dx, dy, saved);
  const unary_math::Scalars s = unary_math::scalars_of(p);
  dispatch_floating(name, saved.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* pv = saved.data<T>();
    const T* pg = dy.data<T>();
    T* po = dx.data<T>();
    const int64_t n = saved.numel();
    unary_math::visit(unary_math::fn_of(p), [&](auto fn) {
      constexpr unary_math::Fn F = decltype(fn)::value;
      parallel_ranges(n, 8, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
          po[i] = static_cast<T>(unary_math::backward<F, double>(double(pg[i]), double(pv[i]), s));
      });
    });
  });
}

}  // namespace tg::cpu
