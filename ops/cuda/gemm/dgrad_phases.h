// The strided grad-input's phase decomposition, shared by its two paths: the cp.async kernels
// (engine.cu: each phase a GEMM that gathers dy) and the TMA kernel (conv_dgrad_sm90_tma.cu:
// each phase a stride-1 forward over dy). Host code but for PhaseTaps::kernel_tap, which the
// weight-packing kernels of both paths call. Design note: docs/kernels/gemm.md.
//
// Per spatial dim, forward y[o] = sum_t x[o s - p + t d] w[t], so dx[i] = sum of dy[o] w[t] over
// o s - p + t d = i. The input pixels of phase `first` are i = first + s j; tap t reaches them
// where (first + p - t d) is a multiple of s, which repeats every s / gcd(s, d) taps, and then
// o = j + (first + p - t d) / s.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>

#include "../../conv.h"
#include "../arch/tensor_map.h"

namespace tg::cuda::engine {

// One dim of a grad-input stride phase: the input pixels first + stride * j (j < count) and the
// taps tap0 + idx * tap_step (idx < taps) whose outputs (o = j + base - idx * out_step) reach
// them. taps = 0: no tap reaches these pixels, their gradient is zero.
struct DimPhase {
  int32_t first = 0, count = 0, tap0 = 0, taps = 0, tap_step = 1, base = 0, out_step = 0;
};

inline DimPhase dim_phase(const ConvShape& s, int d, int32_t first) {
  const int64_t in = s.in[d], k = s.kernel[d], stride = s.stride[d], pad = s.pad[d], dil = s.dilation[d];
  DimPhase p;
  p.first = first;
  p.count = first < in ? int32_t((in - 1 - first) / stride + 1) : 0;
  const int64_t gcd = std::gcd(stride, dil);
  p.tap_step = int32_t(stride / gcd);
  p.out_step = int32_t(dil / gcd);
  // Taps t with (first + pad - t * dil) divisible by stride repeat every tap_step.
  int64_t tap0 = -1;
  for (int64_t t = 0; t < std::min<int64_t>(k, p.tap_step) && tap0 < 0; ++t)
    if ((first + pad - t * dil) % stride == 0) tap0 = t;
  if (tap0 < 0) return p;  // no tap reaches these pixels: their gradient is zero
  p.tap0 = int32_t(tap0);
  p.taps = int32_t((k - 1 - tap0) / p.tap_step + 1);
  p.base = int32_t((first + pad - tap0 * dil) / stride);  // exact
  return p;
}

// A phase's taps per dim, passed by value to the weight-packing kernels, with the kernel's size.
struct PhaseTaps {
  int32_t tap0[3], tap_step[3], taps[3], kernel[3];

  // The flat kernel tap (w's last index) of the phase's tap idx, x fastest; kReversed counts
  // each dim's taps from the last (the TMA path's stride-1 forward, below).
  template <bool kReversed>
  __host__ __device__ __forceinline__ int64_t kernel_tap(int64_t idx) const {
    const int64_t i[3] = {idx / (int64_t(taps[2]) * taps[1]), (idx / taps[2]) % taps[1], idx % taps[2]};
    int64_t t[3];
    for (int d = 0; d < 3; ++d) t[d] = tap0[d] + (kReversed ? taps[d] - 1 - i[d] : i[d]) * tap_step[d];
    return (t[0] * kernel[1] + t[1]) * kernel[2] + t[2];
  }
};

// Every stride phase's per-dim geometry, D slowest, leaving out the phases that hold no pixel
// (first >= in: strides past the input).
template <class Fn>
void for_each_phase(const ConvShape& s, Fn&& fn) {
  const int64_t phases[3] = {std::min(s.stride[0], s.in[0]), std::min(s.stride[1], s.in[1]),
                             std::min(s.stride[2], s.in[2])};
  for (int32_t fz = 0; fz < phases[0]; ++fz)
    for (int32_t fy = 0; fy < phases[1]; ++fy)
      for (int32_t fx = 0; fx < phases[2]; ++fx) {
        const DimPhase dims[3] = {dim_phase(s, 0, fz), dim_phase(s, 1, fy), dim_phase(s, 2, fx)};
        fn(dims);
      }
}

inline PhaseTaps phase_taps(const ConvShape& s, const DimPhase (&dims)[3]) {
  PhaseTaps pt{};
  for (int d = 0; d < 3; ++d) {
    pt.tap0[d] = dims[d].tap0;
    pt.tap_step[d] = dims[d].tap_step;
    pt.taps[d] = dims[d].taps;
    pt.kernel[d] = int32_t(s.kernel[d]);
  }
  return pt;
}

// The phase as a stride-1 forward over dy. With the taps reversed, idx' = taps - 1 - idx, the
// output read is o = j + base - idx * out_step = j - pad + idx' * out_step, where
// pad = (taps - 1) * out_step - base: a window of `taps` taps at dilation out_step whose corner
// for phase pixel j is j - pad (pad < 0: the window starts inside dy), over dy's `out` pixels,
// giving `count` pixels. Forward tap idx' carries the weight of tap tap0 + (taps - 1 - idx') *
// tap_step; outputs o outside [0, out) are the map's zero fill.
inline int64_t phase_pad(const DimPhase& p) { return int64_t(p.taps - 1) * p.out_step - p.base; }

// The im2col map of that forward over channels-last dy (`channels` per pixel). The walk must
// visit exactly `count` window corners per dim (stride 1): out + upper - lower = count with
// lower = -pad, i.e. upper = count - out - pad = pad_hi - out_step (taps - 1) for
// pad_hi = count - out + base. A 2-D problem's D dim is the identity (one dy plane, one tap, no
// shift): a rank-4 map. Meaningful for phases with count > 0 and taps > 0 in every dim.
inline Im2colGeometry phase_im2col_geometry(const ConvShape& s, const DimPhase (&dims)[3], int64_t channels) {
  Im2colGeometry g{};
  const DimPhase& z = dims[0];
  g.dims = s.out[0] == 1 && z.count == 1 && z.taps == 1 && z.base == 0 ? 2 : 3;
  g.N = s.N;
  g.C = channels;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = s.out[d];
    g.kernel[d] = dims[d].taps;
    g.stride[d] = 1;
    g.pad[d] = phase_pad(dims[d]);
    g.pad_hi[d] = int64_t(dims[d].count) - s.out[d] + dims[d].base;
    g.dilation[d] = dims[d].out_step;
  }
  return g;
}

}  // namespace tg::cuda::engine
