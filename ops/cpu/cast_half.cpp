// CPU casts to and from the half types (bf16, f16), element rules in core/half.h:
//   to a half type:   from f32 rounded once to nearest even; from f64 and i64 rounded once
//                     too (never through an intermediate rounding); overflow gives +-inf
//   from a half type: to f32 / f64 exactly; to i64 truncated toward zero, as f32 -> i64 is,
//                     and a NaN, an infinity or a value past i64's range is a DTypeError
//   bf16 <-> f16:     through f32 (exact), so rounded once
// The CUDA casts (core/tensor_kernels.cu) call the same element functions.
#include <cmath>

#include "core/dtype_dispatch.h"
#include "core/half.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/parallel.h"

namespace tg::cpu {
namespace {

void half_to_i64(const Tensor& out, const Tensor& x) {
  const uint16_t* ps = static_cast<const uint16_t*>(x.raw_data());
  int64_t* pd = out.data<int64_t>();
  // [-2^63, 2^63): every float in it truncates to an int64.
  constexpr float kLimit = 9223372036854775808.0f;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    const float v = decode_half(x.dtype(), ps[i]);
    TG_CHECK_AS(DTypeError, v >= -kLimit && v < kLimit, "Tensor::to(i64): element ", i, " of ", describe(x),
                " is ", v, ", which has no i64 value");
    pd[i] = static_cast<int64_t>(v);  // toward zero
  }
}

}  // namespace

void cast_half(const Tensor& out, const Tensor& x) {
  const int64_t n = x.numel();
  const bool in_bf16 = x.dtype() == DType::bf16, out_bf16 = out.dtype() == DType::bf16;
  if (is_half(x.dtype()) && is_half(out.dtype())) {
    const uint16_t* ps = static_cast<const uint16_t*>(x.raw_data());
    uint16_t* pd = static_cast<uint16_t*>(out.raw_data());
    parallel_ranges(n, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pd[i] = to_half(out_bf16, from_half<float>(in_bf16, ps[i]));
    });
  } else if (is_half(out.dtype())) {
    uint16_t* pd = static_cast<uint16_t*>(out.raw_data());
    dispatch_any("Tensor::to", x.dtype(), [&](auto* tag) {
      using S = TG_ELEMENT_TYPE(tag);
      const S* ps = static_cast<const S*>(x.raw_data());
      parallel_ranges(n, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) pd[i] = to_half(out_bf16, ps[i]);
      });
    });
  } else if (out.dtype() == DType::i64) {
    half_to_i64(out, x);
  } else {
    const uint16_t* ps = static_cast<const uint16_t*>(x.raw_data());
    dispatch_floating("Tensor::to", out.dtype(), [&](auto* tag) {
      using D = TG_ELEMENT_TYPE(tag);
      D* pd = static_cast<D*>(out.raw_data());
      parallel_ranges(n, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) pd[i] = from_half<D>(in_bf16, ps[i]);
      });
    });
  }
}

}  // namespace tg::cpu
