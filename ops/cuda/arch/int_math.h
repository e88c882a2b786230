// Integer rounding for tile counts and padded sizes. Host and device; operands non-negative,
// divisors positive.
#pragma once
#include <cstdint>
#include <type_traits>

#include "../../../core/random.h"  // TG_HOST_DEVICE

namespace tg::cuda {

// ceil(a / b), in 64-bit.
TG_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// a rounded up to a multiple of b, in the operands' common type (int stays int).
template <class A, class B>
TG_HOST_DEVICE constexpr std::common_type_t<A, B> round_up(A a, B b) {
  return (a + b - 1) / b * b;
}

}  // namespace tg::cuda
