#include "ops/checks.h"

#include <cmath>

#include "core/dtype_dispatch.h"

namespace tg {

void check_floating(const char* op, const Tensor& t) {
  TG_CHECK(t.defined(), op, ": an input is an undefined tensor");
  check_not_half(op, t.dtype());  // ops that take half tensors handle them before this (ops/half_compute.h)
  TG_CHECK_AS(DTypeError, is_floating(t.dtype()), op, ": expected a floating-point tensor, got ", describe(t));
}

void check_same_device_dtype(const char* op, const Tensor& a, const Tensor& b) {
  check_floating(op, a);
  check_floating(op, b);
  check_same_device_and_dtype(op, a, b);
}

void check_same_device_and_dtype(const char* op, const Tensor& a, const Tensor& b) {
  TG_CHECK(a.defined() && b.defined(), op, ": an input is an undefined tensor");
  TG_CHECK_AS(DeviceError, a.device() == b.device(), op, ": tensors on different devices: ", describe(a), " and ", describe(b));
  TG_CHECK_AS(DTypeError, a.dtype() == b.dtype(), op, ": dtypes differ: ", describe(a), " and ", describe(b));
}

void check_eps(const char* op, double eps) {
  TG_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and non-negative, got ", eps);
}

}  // namespace tg
