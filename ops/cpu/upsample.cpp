// CPU reference of upsample: the shared per-element sums of ops/upsample_math.h over the
// tables of ops/upsample.cpp, one output (forward) or one input (backward) at a time; each
// is a gather, so threads split the (nc, first spatial index) rows of what is written.
#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/upsample.h"
#include "ops/upsample_math.h"

namespace tg::cpu {

void upsample_forward(const Tensor& y, const Tensor& x, const UpsampleProblem& p) {
  check_upsample_buffers("upsample_forward", y, x, p);
  if (y.numel() == 0) return;  // no tables for an empty batch: they grow with the size asked
  const UpsampleTables t = upsample_tables(p, x.dtype());
  dispatch_floating("upsample", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* px = x.data<T>();  // (NC, in0, in1, in2)
    T* py = y.data<T>();        // (NC, out0, out1, out2)
    parallel_for(p.NC * p.out[0], 8 * p.out[1] * p.out[2], [&](int64_t row) {
      const int64_t nc = row / p.out[0], a = row % p.out[0];
      int64_t e = row * p.out[1] * p.out[2];
      for (int64_t b = 0; b < p.out[1]; ++b)
        for (int64_t c = 0; c < p.out[2]; ++c) {
          const int64_t o[3] = {a, b, c};
          py[e++] = static_cast<T>(
              upsample_math::forward_at(px, nc, o, p.in, t.ints.data(), t.reals.data(), t.layout));
        }
    });
  });
}

void upsample_backward(const Tensor& dx, const Tensor& dy, const UpsampleProblem& p) {
  check_upsample_buffers("upsample_backward", dy, dx, p);
  if (dx.numel() == 0) return;  // as the forward
  const UpsampleTables t = upsample_tables(p, dx.dtype());
  dispatch_floating("upsample_backward", dx.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* pg = dy.data<T>();  // (NC, out0, out1, out2)
    T* pd = dx.data<T>();        // (NC, in0, in1, in2)
    parallel_for(p.NC * p.in[0], 8 * p.in[1] * p.in[2], [&](int64_t row) {
      const int64_t nc = row / p.in[0], a = row % p.in[0];
      int64_t e = row * p.in[1] * p.in[2];
      for (int64_t b = 0; b < p.in[1]; ++b)
        for (int64_t c = 0; c < p.in[2]; ++c) {
          const int64_t i[3] = {a, b, c};
          pd[e++] = static_cast<T>(
              upsample_math::backward_at(pg, nc, i, p.out, t.ints.data(), t.reals.data(), t.layout));
        }
    });
  });
}

}  // namespace tg::cpu
