// Shared by the bf16 / f16 tests: both half types, and a half tensor's raw bit patterns.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/tensor.h"

namespace tg::test {

constexpr DType kHalves[] = {DType::bf16, DType::f16};

inline std::vector<uint16_t> half_bits(const Tensor& t) {
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  std::memcpy(out.data(), t.raw_data(), out.size() * 2);
  return out;
}

}  // namespace tg::test
