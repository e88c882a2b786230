// The two 16-bit floating formats, bit patterns in uint16_t: IEEE binary16 (DType::f16) and
// bfloat16 (DType::bf16). One definition of every conversion, shared by tensor casts
// (Tensor::to, on the CPU and in the CUDA kernels alike), factories, printing and the
// safetensors reader and writer.
//
// Rules: widening (to f32 / f64) is exact; narrowing rounds once, to nearest even, also from
// f64 and i64 (no double rounding: see round_to_odd); past the largest finite value
// (f16: 65504, bf16: about 3.39e38) the result is infinity; f16 subnormals are exact
// multiples of 2^-24; a NaN stays a NaN of the same sign, quieted, with the high bits of
// its payload; +-inf and -0 stay.
//
// Host and device functions (TG_HOST_DEVICE): the GPU must give the CPU's bits for every
// input, so everything that decides a bit is integer arithmetic or one IEEE round-to-nearest
// conversion, never the hardware's NaN handling (a GPU may return a canonical NaN where the
// CPU keeps the payload) nor the host's rounding mode.
#pragma once
#include <cstdint>
#include <bit>
#include <type_traits>

#include "dtype.h"
#include "random.h"  // TG_HOST_DEVICE

namespace tg {

namespace detail {  // bit casts that compile on both sides
TG_HOST_DEVICE uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<uint32_t>(f);
#endif
}
TG_HOST_DEVICE float f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  return std::bit_cast<float>(b);
#endif
}
TG_HOST_DEVICE uint64_t bits_of(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  return std::bit_cast<uint64_t>(d);
#endif
}
TG_HOST_DEVICE double f64_from_bits(uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  return std::bit_cast<double>(b);
#endif
}
}  // namespace detail

// The f32 value of an IEEE binary16 / a bfloat16 bit pattern. Both are exact: subnormals
// become the same (normal) f32 value, +-inf stay infinite, a NaN stays a NaN with its sign
// and payload (shifted into the f32 payload's high bits, so a quiet NaN stays quiet).
TG_HOST_DEVICE float decode_f16(uint16_t h) {
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
  return detail::f32_from_bits(bits);
}
TG_HOST_DEVICE float decode_bf16(uint16_t h) { return detail::f32_from_bits(static_cast<uint32_t>(h) << 16); }

// The nearest IEEE binary16 / bfloat16 (round half to even); past the largest finite value,
// infinity; a NaN stays a NaN (quiet) with its sign and the high bits of its payload.
// Inverse of the decoders on every non-NaN pattern.
TG_HOST_DEVICE uint16_t encode_bf16(float f) {
  const uint32_t bits = detail::bits_of(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: quiet
  // Round to nearest even at bit 16: add 0x7fff plus the lowest kept bit; a carry out of the
  // mantissa bumps the exponent, up to infinity past the largest bfloat16.
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
TG_HOST_DEVICE uint16_t encode_f16(float f) {
  const uint32_t bits = detail::bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN: quiet
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (and inf): infinity
  if (a < 0x38800000u) {
    // Below 2^-14: a subnormal, a multiple of 2^-24. The value is m * 2^(e - 150) (m the 24-bit
    // significand), so m / 2^(126 - e) units of 2^-24, rounded half to even; 1024 units
    // become the smallest normal, which is the right encoding. Below 2^-25 (and f32
    // subnormals): zero.
    const uint32_t e = a >> 23;
    if (e < 102) return sign;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;  // shift in [14, 24]
    const uint32_t q = m >> shift, rest = m - (q << shift), half = 1u << (shift - 1);
    return static_cast<uint16_t>(sign | (q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u)));
  }
  // Normal: round to nearest even at bit 13, then rebias the exponent (127 -> 15).
  const uint32_t rounded = a + 0x0fffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

// f64 <-> f32 with the NaN rule pinned (x86's): a NaN keeps its sign and the high bits of its
// payload, quieted. Other values: exact widening, or one rounding to nearest even.
TG_HOST_DEVICE double f32_to_f64(float f) {
  const uint32_t b = detail::bits_of(f);
  if ((b & 0x7fffffffu) <= 0x7f800000u) return static_cast<double>(f);
  return detail::f64_from_bits((static_cast<uint64_t>(b & 0x80000000u) << 32) | 0x7ff8000000000000ull |
                               (static_cast<uint64_t>(b & 0x7fffffu) << 29));
}
TG_HOST_DEVICE float f64_to_f32(double d) {
  const uint64_t b = detail::bits_of(d);
  if ((b & 0x7fffffffffffffffull) <= 0x7ff0000000000000ull) return static_cast<float>(d);
  return detail::f32_from_bits(static_cast<uint32_t>((b >> 32) & 0x80000000u) | 0x7fc00000u |
                               static_cast<uint32_t>((b >> 29) & 0x3fffffu));
}

// An f64 rounded to f32 "to odd" (truncated, then the lowest bit set if anything was lost):
// rounding that to nearest even at 8 or 11 bits gives the same result as rounding the f64
// directly, which a plain f64 -> f32 -> half conversion (two roundings) does not always.
// (Round-to-odd at p bits followed by round-to-nearest at q bits is exact when p >= 2q + 2:
// 24 >= 2 * 11 + 2.)
TG_HOST_DEVICE float round_to_odd(double d) {
  const float t = f64_to_f32(d);  // nearest even; a NaN as its f32 NaN
  const bool nan = (detail::bits_of(d) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
  if (nan || static_cast<double>(t) == d) return t;
  uint32_t b = detail::bits_of(t);
  if ((b & 0x7fffffffu) == 0x7f800000u) b -= 1;  // beyond f32: its largest finite value
  else if (d > 0 ? static_cast<double>(t) > d : static_cast<double>(t) < d) b -= 1;  // rounded away from zero
  return detail::f32_from_bits(b | 1u);
}

// The same (bfloat16 when bf16, else binary16) from an f64 or f32 value, rounded once.
TG_HOST_DEVICE uint16_t encode_half(bool bf16, double value) {
  const float f = round_to_odd(value);
  return bf16 ? encode_bf16(f) : encode_f16(f);
}

// The same from an int64, rounded once (a plain int64 -> double conversion would round a
// first time above 2^53).
TG_HOST_DEVICE uint16_t encode_half_from_int(bool bf16, int64_t value) {
  // |value| as uint64 (INT64_MIN included); above 2^53 its low bits are folded into a sticky
  // lowest bit, which makes the double conversion exact and "to odd" at 53 bits.
  uint64_t m = value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  int shift = 0;
  while (shift < 11 && (m >> (53 + shift)) != 0) ++shift;  // 64 - 53 bits at most
  if (shift) {
    const bool lost = (m & ((uint64_t{1} << shift) - 1)) != 0;
    m = (m >> shift) | (lost ? 1u : 0u);
  }
  const double magnitude = static_cast<double>(m) * static_cast<double>(uint64_t{1} << shift);  // exact
  return encode_half(bf16, value < 0 ? -magnitude : magnitude);
}

// The same keyed by dtype: `t` must be DType::bf16 or DType::f16.
TG_HOST_DEVICE float decode_half(DType t, uint16_t bits) {
  return t == DType::bf16 ? decode_bf16(bits) : decode_f16(bits);
}
TG_HOST_DEVICE uint16_t encode_half(DType t, double value) { return encode_half(t == DType::bf16, value); }

// Element conversions by C++ type, as Tensor::to applies them (S, D: float, double, int64_t).
// To a half type, rounded once from the exact source value:
template <class S>
TG_HOST_DEVICE uint16_t to_half(bool bf16, S v) {
  if constexpr (std::is_same_v<S, int64_t>) return encode_half_from_int(bf16, v);
  else if constexpr (std::is_same_v<S, float>) return bf16 ? encode_bf16(v) : encode_f16(v);
  else return encode_half(bf16, v);
}
// From a half type to f32 or f64, exactly (to i64 needs a range check: the callers do it).
template <class D>
TG_HOST_DEVICE D from_half(bool bf16, uint16_t h) {
  const float f = bf16 ? decode_bf16(h) : decode_f16(h);
  if constexpr (std::is_same_v<D, double>) return f32_to_f64(f);
  else return f;
}
// Between f32, f64 and i64 (a plain conversion, NaN payloads pinned as above). Float to i64
// is defined within i64's range only (C++'s rule).
template <class D, class S>
TG_HOST_DEVICE D convert_value(S v) {
  if constexpr (std::is_same_v<S, float> && std::is_same_v<D, double>) return f32_to_f64(v);
  else if constexpr (std::is_same_v<S, double> && std::is_same_v<D, float>) return f64_to_f32(v);
  else return static_cast<D>(v);
}

}  // namespace tg
