// Index arithmetic for NumPy-style broadcasting, shared by the CPU and CUDA kernels:
// one problem struct, one definition of which input element feeds each output element.
#pragma once
#include <cstdint>

#include "../core/random.h"  // TG_HOST_DEVICE
#include "../core/shape.h"

namespace tg {

struct BroadcastIndex {
  int rank = 0;
  int64_t out_sizes[kMaxDims] = {};
  int64_t a_strides[kMaxDims] = {};  // 0 along dimensions where a is broadcast
  int64_t b_strides[kMaxDims] = {};

  // Offsets into a and b of output element i (row-major).
  TG_HOST_DEVICE void offsets(int64_t i, int64_t& a, int64_t& b) const {
    a = 0;
    b = 0;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t c = i % out_sizes[d];
      i /= out_sizes[d];
      a += c * a_strides[d];
      b += c * b_strides[d];
    }
  }
};

// The broadcast shape of a and b; throws naming `op` and both shapes when incompatible.
Shape broadcast_shape(const char* op, const Shape& a, const Shape& b);
BroadcastIndex make_broadcast_index(const Shape& out, const Shape& a, const Shape& b);

}  // namespace tg
