// Element types. f32 is the working type; f64 serves references and gradcheck;
// i64 holds class indices (cross_entropy targets) and is not differentiable.
// bf16 (bfloat16) and f16 (IEEE binary16) are storage types: tensors of them can be created
// on any device, printed, converted with Tensor::to and read from / written to safetensors
// files; the ops that take them compute in f32 (ops/half_compute.h), the others throw a
// DTypeError, and a half leaf takes no gradient (docs/dtypes.md). Their elements are uint16_t
// bit patterns (core/half.h converts them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>

namespace tg {

enum class DType { f32, f64, i64, bf16, f16 };

inline constexpr DType f32 = DType::f32;
inline constexpr DType f64 = DType::f64;
inline constexpr DType i64 = DType::i64;
inline constexpr DType bf16 = DType::bf16;
inline constexpr DType f16 = DType::f16;

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 0;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i64: return "i64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "unknown dtype";
}
// A floating dtype that ops compute in and autograd differentiates: f32 and f64. The
// half types are floating point too, but storage-only (is_half) until their kernels exist.
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::f64; }
// bf16 or f16: 2-byte floating storage, converted with Tensor::to.
inline bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }
inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

// The C++ element type of a dtype. The half types have none (their elements are raw
// uint16_t bit patterns, and uint16_t must not pass for a number): Tensor::data<T> and
// to_vector<T> take float, double and int64_t.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }

}  // namespace tg
