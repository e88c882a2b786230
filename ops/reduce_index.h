// Index arithmetic for reductions, shared by the CPU and CUDA kernels. The input's
// dimensions split into kept ones (they index the output) and reduced ones; adjacent
// dimensions of the same kind are merged so that most reductions have rank 1 or 2.
#pragma once
#include <cstdint>
#include <vector>

#include "../core/random.h"  // TG_HOST_DEVICE
#include "../core/shape.h"

namespace tg {

struct ReduceIndex {
  int kept_rank = 0;
  int64_t kept_sizes[kMaxDims] = {};
  int64_t kept_strides[kMaxDims] = {};  // strides in the input
  int red_rank = 0;
  int64_t red_sizes[kMaxDims] = {};
  int64_t red_strides[kMaxDims] = {};
  int64_t out_count = 1;  // number of outputs
  int64_t red_count = 1;  // elements summed into each output

  // Input offset of the first element reduced into output o.
  TG_HOST_DEVICE int64_t out_base(int64_t o) const { return unravel(o, kept_rank, kept_sizes, kept_strides); }
  // Offset, relative to out_base, of the r-th reduced element.
  TG_HOST_DEVICE int64_t red_offset(int64_t r) const { return unravel(r, red_rank, red_sizes, red_strides); }

  TG_HOST_DEVICE static int64_t unravel(int64_t i, int rank, const int64_t* sizes, const int64_t* strides) {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (i % sizes[d]) * strides[d];
      i /= sizes[d];
    }
    return off;
  }
};

// `reduced[d]` says whether dimension d of `in` is summed over.
ReduceIndex make_reduce_index(const Shape& in, const std::vector<bool>& reduced);

}  // namespace tg
