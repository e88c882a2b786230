// Moving data to the host for the f64 references. Full-size workloads hold up to 8 GiB per
// tensor, so outputs are read only where they are checked (read_elements / read_range);
// inputs that a reference needs whole are copied once (HostTensor).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace ex {

// A host copy of an f32 tensor's values (what the device holds, exactly).
struct HostTensor {
  tg::Shape shape;
  std::vector<float> data;
  static HostTensor of(const tg::Tensor& t);
  double operator[](int64_t i) const { return data[static_cast<size_t>(i)]; }
  int64_t size(int64_t d) const { return shape.at(d); }
};

// Elements [offset, offset + count) of a contiguous f32 tensor on any device.
std::vector<float> read_range(const tg::Tensor& t, int64_t offset, int64_t count);
// The given flat elements, as f64.
std::vector<double> read_elements(const tg::Tensor& t, const std::vector<int64_t>& indices);

// Which elements to check: all of them when numel <= max_samples (a whole comparison),
// otherwise the first, the last (64-bit offsets past 2^31 live there) and random ones
// in between. Sorted, so device reads walk memory forwards.
std::vector<int64_t> sample_indices(int64_t numel, int64_t max_samples, uint64_t seed);

struct Comparison {
  int64_t count = 0;
  double rel_error = 0;      // ||got - want|| / ||want|| over the compared elements
  double max_abs_error = 0;
  bool finite = true;        // false if `got` holds a NaN or an infinity
  bool ok(double tolerance) const { return finite && rel_error <= tolerance; }
};
Comparison compare(const std::vector<double>& got, const std::vector<double>& want);

// Runs fn(begin, end) over [0, n) split across the host's cores (the f64 references of the
// full-size workloads are billions of multiply-adds).
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace ex
