// One output (forward) or one input gradient (backward) of upsample from the per-dim tables
// of ops/upsample.h; shared by the CPU reference and the CUDA kernels, so both walk the
// same taps in the same order. Sums run in double.
#pragma once
#include <cstdint>

#include "../core/random.h"  // TG_HOST_DEVICE
#include "upsample.h"

namespace tg::upsample_math {

// y[nc, o0, o1, o2] = sum over the taps of each dim of w0 w1 w2 x[nc, i0, i1, i2].
template <class T>
TG_HOST_DEVICE double forward_at(const T* x, int64_t nc, const int64_t (&o)[3], const int64_t (&in)[3],
                                 const int64_t* ints, const double* reals, const UpsampleLayout& L) {
  const int K = L.taps;
  const T* xc = x + nc * in[0] * in[1] * in[2];  // (in0, in1, in2)
  double acc = 0;
  for (int k0 = 0; k0 < K; ++k0) {
    const double w0 = reals[L.fwd_weight[0] + o[0] * K + k0];
    if (w0 == 0) continue;
    const int64_t i0 = ints[L.fwd_index[0] + o[0] * K + k0];
    for (int k1 = 0; k1 < K; ++k1) {
      const double w1 = reals[L.fwd_weight[1] + o[1] * K + k1];
      if (w1 == 0) continue;
      const int64_t i1 = ints[L.fwd_index[1] + o[1] * K + k1];
      const T* row = xc + (i0 * in[1] + i1) * in[2];
      for (int k2 = 0; k2 < K; ++k2) {
        const double w2 = reals[L.fwd_weight[2] + o[2] * K + k2];
        if (w2 == 0) continue;
        acc += w0 * w1 * w2 * double(row[ints[L.fwd_index[2] + o[2] * K + k2]]);
      }
    }
  }
  return acc;
}

// dx[nc, i0, i1, i2] = sum over the outputs that read it (ascending in each dim) of
// w0 w1 w2 dy[nc, o0, o1, o2]: the gather that replaces a scatter with atomics.
template <class T>
TG_HOST_DEVICE double backward_at(const T* dy, int64_t nc, const int64_t (&i)[3], const int64_t (&out)[3],
                                  const int64_t* ints, const double* reals, const UpsampleLayout& L) {
  const T* gc = dy + nc * out[0] * out[1] * out[2];  // (out0, out1, out2)
  double acc = 0;
  const int64_t* off0 = ints + L.bwd_offset[0];
  const int64_t* off1 = ints + L.bwd_offset[1];
  const int64_t* off2 = ints + L.bwd_offset[2];
  for (int64_t e0 = off0[i[0]]; e0 < off0[i[0] + 1]; ++e0) {
    const int64_t o0 = ints[L.bwd_output[0] + e0];
    const double w0 = reals[L.bwd_weight[0] + e0];
    for (int64_t e1 = off1[i[1]]; e1 < off1[i[1] + 1]; ++e1) {
      const int64_t o1 = ints[L.bwd_output[1] + e1];
      const double w01 = w0 * reals[L.bwd_weight[1] + e1];
      const T* row = gc + (o0 * out[1] + o1) * out[2];
      for (int64_t e2 = off2[i[2]]; e2 < off2[i[2] + 1]; ++e2)
        acc += w01 * reals[L.bwd_weight[2] + e2] * double(row[ints[L.bwd_output[2] + e2]]);
    }
  }
  return acc;
}

}  // namespace tg::upsample_math
