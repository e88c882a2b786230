// Half-precision decoding for the safetensors reader: F16 (IEEE binary16) and BF16
// (bfloat16) tensors are widened to f32, which holds every value of both exactly.
#include <bit>
#include <cstring>

#include "core/safetensors.h"

namespace tg::safetensors {

bool is_half_code(const std::string& code) { return code == "F16" || code == "BF16"; }

bool is_floating_code(const std::string& code) {
  return code == "F64" || code == "F32" || is_half_code(code);
}

float decode_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, or NaN with its payload
  } else if (exponent != 0) {
    bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: mantissa * 2^-24. Normalize: shift until the implicit bit (0x400) is set.
    int e = -1;
    do {
      mantissa <<= 1;
      ++e;
    } while ((mantissa & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

float decode_bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

void decode_half(const std::string& code, const unsigned char* bytes, float* out, size_t n) {
  const bool bf16 = code == "BF16";
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    out[i] = bf16 ? decode_bf16(h) : decode_f16(h);
  }
}

}  // namespace tg::safetensors
