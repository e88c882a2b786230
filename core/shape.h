// Shape: up to 6 int64 dimensions. All sizes, counts and offsets are 64-bit:
// workloads B and D hold exactly 2^31 elements.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "checked.h"

namespace tg {

inline constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int64_t rank() const { return static_cast<int64_t>(dims_.size()); }
  int64_t operator[](int64_t i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int64_t i) { return dims_[static_cast<size_t>(i)]; }
  // Dimension with Python-style negative indexing (-1 is the last).
  int64_t at(int64_t i) const;
  // Throws tg::Error for a negative dim or a count that overflows int64 (see checked.h):
  // a wrapped count would let reshape and allocation disagree with the kernels.
  int64_t numel() const { return checked_numel(dims_, "Shape::numel"); }
  const std::vector<int64_t>& dims() const { return dims_; }
  auto begin() const { return dims_.begin(); }
  auto end() const { return dims_.end(); }
  std::string str() const;
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

// Row-major strides of a contiguous tensor of this shape, in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);

}  // namespace tg
