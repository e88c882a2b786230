// Calls f with a null pointer of the tensor's element type: floating only (float or double),
// or any (dispatch_any).
// Host code only, shared by the CPU kernels and the CUDA launchers so every backend turns
// a dtype into a template argument the same way and rejects the others with one message.
#pragma once
#include <cstdint>
#include <type_traits>

#include "tensor.h"

namespace tg {

template <class F>
void dispatch_floating(const char* op, DType t, F&& f) {
  if (t == DType::f32) f(static_cast<float*>(nullptr));
  else if (t == DType::f64) f(static_cast<double*>(nullptr));
  else TG_FAIL(op, ": dtype ", dtype_name(t), " is not supported");
}

// The same for every dtype, i64 included: for code that only moves or converts values
// (fills, casts, printing).
template <class F>
void dispatch_any(DType t, F&& f) {
  if (t == DType::f32) f(static_cast<float*>(nullptr));
  else if (t == DType::f64) f(static_cast<double*>(nullptr));
  else f(static_cast<int64_t*>(nullptr));
}

}  // namespace tg

// Inside a dispatch lambda `[&](auto* tag)`, names the element type.
#define TG_ELEMENT_TYPE(tag) std::remove_pointer_t<decltype(tag)>
