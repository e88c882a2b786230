#include "core/shape.h"

#include "core/error.h"

namespace tg {

int64_t Shape::at(int64_t i) const {
  int64_t r = rank();
  TG_CHECK(i >= -r && i < r, "Shape::at: dimension ", i, " out of range for shape ", str());
  return dims_[static_cast<size_t>(i < 0 ? i + r : i)];
}

std::string Shape::str() const {
  std::string s = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(static_cast<size_t>(s.rank()), 1);
  for (int64_t i = s.rank() - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

}  // namespace tg
