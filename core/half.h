// The two 16-bit floating formats, bit patterns in uint16_t: IEEE binary16 (DType::f16) and
// bfloat16 (DType::bf16). One definition of every conversion, shared by tensor casts
// (Tensor::to), factories, printing and the safetensors reader and writer.
//
// Rules: widening (to f32 / f64) is exact; narrowing rounds once, to nearest even, also from
// f64 and i64 (no double rounding: see encode_half); past the largest finite value
// (f16: 65504, bf16: about 3.39e38) the result is infinity; f16 subnormals are exact
// multiples of 2^-24; a NaN stays a NaN of the same sign, quieted, with the high bits of
// its payload; +-inf and -0 stay.
#pragma once
#include <cstdint>

#include "dtype.h"

namespace tg {

// The f32 value of an IEEE binary16 / a bfloat16 bit pattern. Both are exact: subnormals
// become the same (normal) f32 value, +-inf stay infinite, a NaN stays a NaN with its sign
// and payload (shifted into the f32 payload's high bits, so a quiet NaN stays quiet).
float decode_f16(uint16_t bits);
float decode_bf16(uint16_t bits);
// The nearest IEEE binary16 / bfloat16 (round half to even); past the largest finite value,
// infinity; a NaN stays a NaN (quiet) with its sign and the high bits of its payload.
// Inverse of the decoders on every non-NaN pattern.
uint16_t encode_f16(float value);
uint16_t encode_bf16(float value);
// The same (bfloat16 when bf16, else binary16) from an f64 or f32 value, rounded once.
uint16_t encode_half(bool bf16, double value);
// The same from an int64, rounded once (a plain int64 -> double conversion would round a
// first time above 2^53).
uint16_t encode_half_from_int(bool bf16, int64_t value);

// The same keyed by dtype: `t` must be DType::bf16 or DType::f16.
inline float decode_half(DType t, uint16_t bits) { return t == DType::bf16 ? decode_bf16(bits) : decode_f16(bits); }
inline uint16_t encode_half(DType t, double value) { return encode_half(t == DType::bf16, value); }

}  // namespace tg
