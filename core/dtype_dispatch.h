// Calls f with a null pointer of the tensor's floating element type (float or double).
// Host code only, shared by the CPU kernels and the CUDA launchers so every backend turns
// a dtype into a template argument the same way and rejects the others with one message.
#pragma once
#include <type_traits>

#include "core/tensor.h"

namespace tg {

template <class F>
void dispatch_floating(const char* op, DType t, F&& f) {
  if (t == DType::f32) f(static_cast<float*>(nullptr));
  else if (t == DType::f64) f(static_cast<double*>(nullptr));
  else TG_FAIL(op, ": dtype ", dtype_name(t), " is not supported");
}

}  // namespace tg

// Inside a dispatch lambda `[&](auto* tag)`, names the element type.
#define TG_ELEMENT_TYPE(tag) std::remove_pointer_t<decltype(tag)>
