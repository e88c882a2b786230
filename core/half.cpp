#include "core/half.h"

#include <bit>
#include <cmath>
#include <limits>

namespace tg {

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

uint16_t encode_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: quiet
  // Round to nearest even at bit 16: add 0x7fff plus the lowest kept bit; a carry out of the
  // mantissa bumps the exponent, up to infinity past the largest bfloat16.
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

uint16_t encode_f16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN: quiet
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (and inf): infinity
  if (a < 0x38800000u) {
    // Below 2^-14: a subnormal, a multiple of 2^-24. Scaling by 2^24 is exact in f32, and
    // nearbyint rounds half to even (the default rounding mode); 1024 becomes the smallest
    // normal, which is the right encoding.
    const float units = std::bit_cast<float>(a) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(units)));
  }
  // Normal: round to nearest even at bit 13, then rebias the exponent (127 -> 15).
  const uint32_t rounded = a + 0x0fffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

namespace {
// An f64 rounded to f32 "to odd" (truncated, then the lowest bit set if anything was lost):
// rounding that to nearest even at 8 or 11 bits gives the same result as rounding the f64
// directly, which a plain f64 -> f32 -> half conversion (two roundings) does not always.
// (Round-to-odd at p bits followed by round-to-nearest at q bits is exact when p >= 2q + 2:
// 24 >= 2 * 11 + 2.)
float round_to_odd(double d) {
  if (std::isnan(d)) return static_cast<float>(d);
  float t = static_cast<float>(d);
  if (static_cast<double>(t) == d) return t;
  if (std::isinf(t)) t = std::copysign(std::numeric_limits<float>::max(), t);  // beyond f32
  else if (std::fabs(static_cast<double>(t)) > std::fabs(d)) t = std::nextafter(t, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(t) | 1u);
}
}  // namespace

uint16_t encode_half(bool bf16, double value) {
  const float f = round_to_odd(value);
  return bf16 ? encode_bf16(f) : encode_f16(f);
}

uint16_t encode_half_from_int(bool bf16, int64_t value) {
  // |value| as uint64 (INT64_MIN included); above 2^53 its low bits are folded into a sticky
  // lowest bit, which makes the double conversion exact and "to odd" at 53 bits.
  uint64_t m = value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  int shift = 0;
  if (m >> 53) {
    shift = 64 - std::countl_zero(m) - 53;
    const bool lost = (m & ((uint64_t{1} << shift) - 1)) != 0;
    m = (m >> shift) | (lost ? 1u : 0u);
  }
  const double magnitude = std::ldexp(static_cast<double>(m), shift);
  return encode_half(bf16, value < 0 ? -magnitude : magnitude);
}

}  // namespace tg
