// Shared by the bf16 / f16 tests: both half types, and a half tensor's raw bit patterns.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/tensor.h"

namespace tg::test {

constexpr DType kHalves[] = {DType::bf16, DType::f16};

// A half tensor's bit patterns, from any device.
inline std::vector<uint16_t> half_bits(const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : t.detach().cpu();
  std::vector<uint16_t> out(static_cast<size_t>(host.numel()));
  std::memcpy(out.data(), host.raw_data(), out.size() * 2);
  return out;
}

}  // namespace tg::test
