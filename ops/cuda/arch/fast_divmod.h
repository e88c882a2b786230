// Division by a run-time divisor that is fixed for a whole kernel launch, as a multiply-high
// and a shift (Granlund-Montgomery): index decompositions in the implicit-GEMM gathers run
// per element, where a hardware-free integer division would cost ~20 instructions.
// Host and device; numerators must be below 2^31 (the engine's can_implement guarantees it).
#pragma once
#include <cstdint>

#include "../../../core/random.h"  // TG_HOST_DEVICE

namespace tg::cuda {

struct FastDivmod {
  uint32_t divisor = 1, multiplier = 0, shift = 0;

  FastDivmod() = default;
  // d >= 1. shift = ceil(log2 d); multiplier = floor(2^32 (2^shift - d) / d) + 1 < 2^32.
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  TG_HOST_DEVICE uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(n, multiplier);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * multiplier) >> 32);
#endif
    return static_cast<uint32_t>((uint64_t{hi} + n) >> shift);
  }
  // q = n / d and r = n % d.
  TG_HOST_DEVICE void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

}  // namespace tg::cuda
