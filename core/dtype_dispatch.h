// Calls f with a null pointer of the tensor's element type: floating only (float or double),
// or any (dispatch_any).
// Host code only, shared by the CPU kernels and the CUDA launchers so every backend turns
// a dtype into a template argument the same way and rejects the others with one message.
#pragma once
#include <cstdint>
#include <type_traits>

#include "tensor.h"

namespace tg {

// The error an op without half-precision support gives a bf16 / f16 tensor (a DTypeError
// naming the op and the dtype): only the elementwise ops, the reductions and the matrix ops
// take them so far (ops/half_compute.h); inside tg::Autocast the others get f32 copies.
// Callers check with it before allocating or launching anything.
[[noreturn]] inline void fail_no_half_kernels(const char* op, DType t) {
  TG_FAIL_AS(DTypeError, op, ": no ", dtype_name(t), " kernels (the elementwise ops, reductions, conv, linear and ",
             "matmul take ", dtype_name(t), " tensors, computing in f32; inside tg::Autocast this op gets f32 ",
             "copies); convert with .to(DType::f32)");
}
inline void check_not_half(const char* op, DType t) {
  if (is_half(t)) fail_no_half_kernels(op, t);
}

// The half types are deliberately not instantiated here: doing so would instantiate every
// CPU and CUDA kernel for them. They get fail_no_half_kernels's DTypeError instead.
template <class F>
void dispatch_floating(const char* op, DType t, F&& f) {
  check_not_half(op, t);
  if (t == DType::f32) f(static_cast<float*>(nullptr));
  else if (t == DType::f64) f(static_cast<double*>(nullptr));
  else TG_FAIL_AS(DTypeError, op, ": dtype ", dtype_name(t), " is not supported");
}

// The same for f32, f64 and i64: for code that only moves or converts values (fills,
// casts, printing). Code that takes the half types handles them before calling this
// (core/half.h); here they get fail_no_half_kernels's DTypeError, named after `op`.
template <class F>
void dispatch_any(const char* op, DType t, F&& f) {
  check_not_half(op, t);
  if (t == DType::f32) f(static_cast<float*>(nullptr));
  else if (t == DType::f64) f(static_cast<double*>(nullptr));
  else f(static_cast<int64_t*>(nullptr));
}
template <class F>
void dispatch_any(DType t, F&& f) {
  dispatch_any("a copy or fill", t, static_cast<F&&>(f));
}

}  // namespace tg

// Inside a dispatch lambda `[&](auto* tag)`, names the element type.
#define TG_ELEMENT_TYPE(tag) std::remove_pointer_t<decltype(tag)>
