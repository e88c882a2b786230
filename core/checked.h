// Checked int64 arithmetic for sizes, counts, byte counts and offsets: an overflow is a
// tg::Error naming the op, never a wrap (a wrapped size allocates a small buffer that
// kernels then write past) and never signed-overflow UB.
//
//   checked_mul(a, b, "reshape", ": ", shape)    a * b, or throws with the message given
//   checked_numel(dims, "zeros")                 elements of a shape with these dims
//   checked_bytes(numel, elem_size, "zeros")     numel * elem_size, <= INT64_MAX
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "error.h"

namespace tg {

namespace detail {
// "[2, 3, 4]": checked.h sits below Shape, so it formats plain dims itself.
std::string dims_str(std::span<const int64_t> dims);
[[noreturn]] void throw_bad_dims(const char* op, std::span<const int64_t> dims);
}  // namespace detail

template <class... What>
int64_t checked_mul(int64_t a, int64_t b, const What&... what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) TG_FAIL(what..., ": ", a, " * ", b, " overflows int64");
  return r;
}

template <class... What>
int64_t checked_add(int64_t a, int64_t b, const What&... what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) TG_FAIL(what..., ": ", a, " + ", b, " overflows int64");
  return r;
}

template <class... What>
int64_t checked_sub(int64_t a, int64_t b, const What&... what) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) TG_FAIL(what..., ": ", a, " - ", b, " overflows int64");
  return r;
}

// The product of the non-zero dims. It must fit in int64 whatever the order of the dims
// and whether or not one of them is zero: a zero dim does not make [0, 2^62, 2^62]
// valid, since its strides (products of the trailing dims) would still overflow.
// Negative dims are rejected.
inline int64_t checked_extent(std::span<const int64_t> dims, const char* op) {
  int64_t extent = 1;
  for (int64_t d : dims) {
    if (d == 0) continue;
    if (d < 0 || __builtin_mul_overflow(extent, d, &extent)) detail::throw_bad_dims(op, dims);
  }
  return extent;
}

// The number of elements: 0 when a dim is zero, else the extent.
inline int64_t checked_numel(std::span<const int64_t> dims, const char* op) {
  const int64_t extent = checked_extent(dims, op);
  for (int64_t d : dims)
    if (d == 0) return 0;
  return extent;
}

// numel * elem_size as a byte count that fits in int64 (and so in size_t and off_t).
inline int64_t checked_bytes(int64_t numel, int64_t elem_size, const char* op) {
  TG_CHECK(numel >= 0 && elem_size >= 0, op, ": negative element count ", numel, " or size ", elem_size);
  return checked_mul(numel, elem_size, op, ": byte count of ", numel, " elements of ", elem_size, " bytes");
}

}  // namespace tg
