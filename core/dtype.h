// Element types. f32 is the working type; f64 serves references and gradcheck;
// i64 holds class indices (cross_entropy targets) and is not differentiable.
#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>

namespace tg {

enum class DType { f32, f64, i64 };

inline constexpr DType f32 = DType::f32;
inline constexpr DType f64 = DType::f64;
inline constexpr DType i64 = DType::i64;

inline std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 8; }
inline const char* dtype_name(DType t) {
  return t == DType::f32 ? "f32" : t == DType::f64 ? "f64" : "i64";
}
inline bool is_floating(DType t) { return t != DType::i64; }
inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }

}  // namespace tg
