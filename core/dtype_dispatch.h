// Calls f with a null pointer of the tensor's floating element type (float or double).
#pragma once
#include <type_traits>

#include "core/tensor.h"

namespace tg::cpu {

template <class F>
void dispatch_floating(const char* op, DType t, F&& f) {
  if (t == DType::f32) f(static_cast<float*>(nullptr));
  else if (t == DType::f64) f(static_cast<double*>(nullptr));
  else TG_FAIL(op, ": dtype ", dtype_name(t), " is not supported");
}

}  // namespace tg::cpu

// Inside a dispatch lambda `[&](auto* tag)`, names the element type.
#define TG_ELEMENT_TYPE(tag) std::remove_pointer_t<decltype(tag)>
