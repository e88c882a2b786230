#include "core/shape.h"

#include "core/error.h"

namespace tg {

int64_t Shape::at(int64_t i) const {
  int64_t r = rank();
  TG_CHECK(i >= -r && i < r, "Shape::at: dimension ", i, " out of range for shape ", str());
  return dims_[static_cast<size_t>(i < 0 ? i + r : i)];
}

std::string Shape::str() const { return detail::dims_str(dims_); }

namespace detail {
std::string dims_str(std::span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

void throw_bad_dims(const char* op, std::span<const int64_t> dims) {
  for (int64_t d : dims) TG_CHECK(d >= 0, op, ": negative size in shape ", dims_str(dims));
  TG_FAIL(op, ": shape ", dims_str(dims), " is too large: the product of its non-zero dims overflows int64");
}
}  // namespace detail

std::vector<int64_t> contiguous_strides(const Shape& s) {
  checked_extent(s.dims(), "contiguous_strides");  // every stride is a partial extent
  std::vector<int64_t> st(static_cast<size_t>(s.rank()), 1);
  for (int64_t i = s.rank() - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

}  // namespace tg
