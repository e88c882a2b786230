// The engine's operands: how element (row, k) of each GEMM operand is found in memory.
// The mainloop (mainloop_sm80.cuh) computes C[M][N] = sum_k A[m][k] B[n][k]: both operands are
// seen as "rows x reduction". Each operand type says
//   kContiguousK   whether consecutive k (true) or consecutive rows (false) are adjacent in
//                  memory; it decides the shared-memory layout and which threads load what,
//   Row row(r)     what can be computed once per row (the thread keeps its rows all along),
//   Col col(k)     what can be computed once per reduction index (shared by the thread's rows),
//   offset(row, col) the element's offset from `data`, or -1 where the element is zero
//                  (padding, out of the image, out of range),
//   k4             set on the host (launch.cuh, from groups_of_four()) when every aligned group
//                  of 4 reduction indices k..k+3 (k % 4 == 0) of a row is 4 adjacent floats at a
//                  16-byte-aligned address, all inside or all outside the data: the loaders then
//                  make one 16-byte copy per group from one offset (the common case costs a
//                  few instructions instead of four offsets and a run-time check).
// Convolutions are implicit GEMMs (DESIGN.md, ops): no im2col buffer is ever written.
//   fprop  y[n,k,p]   = sum_{t,c} x[n,c,p*s-pad+t*dil] w[k,c,t]   M = N*P,    N = K,    red = kvol*C
//   dgrad  dx[n,c,q]  = sum_{t,k} dy[n,k,(q+pad-t*dil)/s] w[k,c,t] M = N*Vin,  N = C,    red = kvol*K
//          (posed per stride phase: each phase's pixels read a fixed subset of the taps)
//   wgrad  dw[k,c,t]  = sum_{n,p} dy[n,k,p] x[n,c,p*s-pad+t*dil]  M = K,      N = C*kvol, red = N*P
// The weights of fprop and dgrad are packed first (engine.cu) into plain row-major matrices
// whose reduction index is t*C + c (fprop) or, per phase, idx*K + k (dgrad): the order the
// gathers use.
// Indices below 2^31 (rows, reduction); offsets are 64-bit.
#pragma once
#include <cstdint>

#include "../arch/fast_divmod.h"

namespace tg::cuda::engine {
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
}  // namespace tg::cuda::engine

namespace tg::cuda::engine {

// A plain matrix: element (r, k) at r * row_stride + k * k_stride, one of the strides 1.
template <bool kContiguousKArg>
struct MatrixOperand {
  static constexpr bool kContiguousK = kContiguousKArg;
  const float* data;
  int32_t rows, red;
  int64_t stride;  // the stride of the non-contiguous index
  bool k4 = false;
  bool groups_of_four() const { return kContiguousK && stride % 4 == 0 && red % 4 == 0 && aligned16(data); }
  struct Row { int64_t base; };  // -1 when out of range
  struct Col { int64_t base; };
  __device__ __forceinline__ Row row(int32_t r) const {
    return {r < rows ? (kContiguousK ? int64_t(r) * stride : int64_t(r)) : int64_t(-1)};
  }
  __device__ __forceinline__ Col col(int32_t k) const {
    return {k < red ? (kContiguousK ? int64_t(k) : int64_t(k) * stride) : int64_t(-1)};
  }
  __device__ __forceinline__ int64_t offset(const Row& r, const Col& c) const {
    return (r.base < 0 || c.base < 0) ? -1 : r.base + c.base;
  }
};

// The geometry every convolution gather needs, in 32-bit (can_implement keeps sizes below
// 2^31) with the divisors the index decompositions use.
struct ConvGeometry {
  int32_t N, C, K;
  int32_t in[3], out[3], kernel[3], stride[3], pad[3], dil[3];
  int64_t in_volume, out_volume;
  FastDivmod div_out_w, div_out_h, div_out_volume;  // p -> (z, y, x) of the output
  FastDivmod div_in_w, div_in_h, div_in_volume;     // q -> (z, y, x) of the input
  FastDivmod div_kernel_w, div_kernel_h;            // tap -> (td, th, tw)
  FastDivmod div_kernel_volume;                     // wgrad column c*kvol + t -> (c, t)
  FastDivmod div_C, div_K;

  __device__ __forceinline__ void unravel_out(uint32_t p, int32_t& z, int32_t& y, int32_t& x) const {
    uint32_t q, r;
    div_out_w.divmod(p, q, r);
    x = int32_t(r);
    div_out_h.divmod(q, q, r);
    y = int32_t(r);
    z = int32_t(q);
  }
  __device__ __forceinline__ void unravel_in(uint32_t p, int32_t& z, int32_t& y, int32_t& x) const {
    uint32_t q, r;
    div_in_w.divmod(p, q, r);
    x = int32_t(r);
    div_in_h.divmod(q, q, r);
    y = int32_t(r);
    z = int32_t(q);
  }
  // The dilated offsets of tap t in (d, h, w).
  __device__ __forceinline__ void tap_offsets(uint32_t t, int32_t& dz, int32_t& dy, int32_t& dx) const {
    uint32_t q, r;
    div_kernel_w.divmod(t, q, r);
    dx = int32_t(r) * dil[2];
    div_kernel_h.divmod(q, q, r);
    dy = int32_t(r) * dil[1];
    dz = int32_t(q) * dil[0];
  }
  // The part of an input (output) offset that a pixel's coordinates contribute: linear in them,
  // so gathers split it between rows and columns.
  template <bool kChannelsLast>
  __device__ __forceinline__ int64_t input_part(int32_t z, int32_t y, int32_t x) const {
    const int64_t pixel = (int64_t(z) * in[1] + y) * in[2] + x;
    return kChannelsLast ? pixel * C : pixel;
  }
  template <bool kChannelsLast>
  __device__ __forceinline__ int64_t output_part(int32_t z, int32_t y, int32_t x) const {
    const int64_t pixel = (int64_t(z) * out[1] + y) * out[2] + x;
    return kChannelsLast ? pixel * K : pixel;
  }
  __device__ __forceinline__ bool inside_input(int32_t z, int32_t y, int32_t x) const {
    return uint32_t(z) < uint32_t(in[0]) && uint32_t(y) < uint32_t(in[1]) && uint32_t(x) < uint32_t(in[2]);
  }
};

// fprop's A: the input x gathered as im2col[m = (n, p)][k = t*C + c], never materialised.
template <bool kChannelsLast>
struct ImageOperand {
  static constexpr bool kContiguousK = kChannelsLast;  // NHWC: channels adjacent; NCHW: pixels
  const float* data;
  ConvGeometry g;
  int32_t rows;  // N * out_volume
  int32_t red;   // kvol * C
  bool k4 = false;
  // NHWC with C % 4 == 0: a group of 4 channels sits inside one tap, at one pixel.
  bool groups_of_four() const { return kChannelsLast && g.C % 4 == 0 && aligned16(data); }
  // The offset is linear in (channel, z, y, x): row and column each carry their part, and an
  // element costs one add plus the bounds check of its input coordinate.
  struct Row { int64_t linear; int32_t z, y, x; bool valid; };
  struct Col { int64_t linear; int32_t dz, dy, dx; bool valid; };
  __device__ __forceinline__ Row row(int32_t m) const {
    Row r{};
    r.valid = m < rows;
    if (!r.valid) return r;
    uint32_t n, p;
    g.div_out_volume.divmod(uint32_t(m), n, p);
    g.unravel_out(p, r.z, r.y, r.x);
    r.z = r.z * g.stride[0] - g.pad[0];
    r.y = r.y * g.stride[1] - g.pad[1];
    r.x = r.x * g.stride[2] - g.pad[2];
    r.linear = int64_t(n) * g.C * g.in_volume + g.input_part<kChannelsLast>(r.z, r.y, r.x);
    return r;
  }
  __device__ __forceinline__ Col col(int32_t k) const {
    Col c{};
    c.valid = k < red;
    if (!c.valid) return c;
    uint32_t t, ch;
    g.div_C.divmod(uint32_t(k), t, ch);
    g.tap_offsets(t, c.dz, c.dy, c.dx);
    c.linear = (kChannelsLast ? int64_t(ch) : int64_t(ch) * g.in_volume) +
               g.input_part<kChannelsLast>(c.dz, c.dy, c.dx);
    return c;
  }
  __device__ __forceinline__ int64_t offset(const Row& r, const Col& c) const {
    const int32_t z = r.z + c.dz, y = r.y + c.dy, x = r.x + c.dx;
    if (!(r.valid && c.valid && g.inside_input(z, y, x))) return -1;
    return r.linear + c.linear;
  }
};

// dgrad, one stride phase: the input pixels i = first + stride * j of each dim (j < count)
// receive only from the taps t = tap0 + idx * tap_step (idx < taps), through output
// o = j + base - idx * out_step, with no division and no zero products. A stride-1 problem is
// one phase holding every pixel and tap. engine.cu enumerates the phases.
struct PhaseGeometry {
  int32_t first[3], stride[3], count[3];   // the phase's input pixels per dim
  int32_t taps[3], base[3], out_step[3];   // its taps per dim, and the output they read
  int32_t tap_volume;                      // taps[0] * taps[1] * taps[2]
  FastDivmod div_count_w, div_count_h, div_count_volume;
  FastDivmod div_taps_w, div_taps_h;

  __device__ __forceinline__ void unravel_rows(uint32_t r, int32_t& z, int32_t& y, int32_t& x) const {
    uint32_t q, rem;
    div_count_w.divmod(r, q, rem);
    x = int32_t(rem);
    div_count_h.divmod(q, q, rem);
    y = int32_t(rem);
    z = int32_t(q);
  }
};

// dgrad's A for one phase: dy gathered as [m = (n, j)][k = idx * K + k_out].
template <bool kChannelsLast>
struct PhaseGradOutputOperand {
  static constexpr bool kContiguousK = kChannelsLast;
  const float* data;
  ConvGeometry g;
  PhaseGeometry ph;
  int32_t rows;  // N * count volume
  int32_t red;   // tap_volume * K
  bool k4 = false;
  bool groups_of_four() const { return kChannelsLast && g.K % 4 == 0 && aligned16(data); }
  // Linear in (channel, z, y, x) like ImageOperand: rows add, columns subtract their part.
  struct Row { int64_t linear; int32_t z, y, x; bool valid; };
  struct Col { int64_t linear; int32_t dz, dy, dx; bool valid; };
  __device__ __forceinline__ Row row(int32_t m) const {
    Row r{};
    r.valid = m < rows;
    if (!r.valid) return r;
    uint32_t n, q;
    ph.div_count_volume.divmod(uint32_t(m), n, q);
    ph.unravel_rows(q, r.z, r.y, r.x);
    r.z += ph.base[0];
    r.y += ph.base[1];
    r.x += ph.base[2];
    r.linear = int64_t(n) * g.K * g.out_volume + g.output_part<kChannelsLast>(r.z, r.y, r.x);
    return r;
  }
  __device__ __forceinline__ Col col(int32_t k) const {
    Col c{};
    c.valid = k < red;
    if (!c.valid) return c;
    uint32_t idx, ch, q, rem;
    g.div_K.divmod(uint32_t(k), idx, ch);
    ph.div_taps_w.divmod(idx, q, rem);
    c.dx = int32_t(rem) * ph.out_step[2];
    ph.div_taps_h.divmod(q, q, rem);
    c.dy = int32_t(rem) * ph.out_step[1];
    c.dz = int32_t(q) * ph.out_step[0];
    c.linear = (kChannelsLast ? int64_t(ch) : int64_t(ch) * g.out_volume) -
               g.output_part<kChannelsLast>(c.dz, c.dy, c.dx);
    return c;
  }
  __device__ __forceinline__ int64_t offset(const Row& r, const Col& c) const {
    const int32_t oz = r.z - c.dz, oy = r.y - c.dy, ox = r.x - c.dx;
    if (!(r.valid && c.valid && uint32_t(oz) < uint32_t(g.out[0]) && uint32_t(oy) < uint32_t(g.out[1]) &&
          uint32_t(ox) < uint32_t(g.out[2])))
      return -1;
    return r.linear + c.linear;
  }
};

// wgrad's A: dy as [m = k_out][red = (n, p)].
template <bool kChannelsLast>
struct GradOutputRowsOperand {
  static constexpr bool kContiguousK = !kChannelsLast;  // NCHW: pixels adjacent; NHWC: channels
  const float* data;
  ConvGeometry g;
  int32_t rows;  // K
  int32_t red;   // N * out_volume
  bool k4 = false;
  // NCHW: 4 pixels of one image when the image's pixel count is a multiple of 4.
  bool groups_of_four() const { return !kChannelsLast && g.out_volume % 4 == 0 && aligned16(data); }
  struct Row { int64_t base; };
  struct Col { int64_t base; };
  __device__ __forceinline__ Row row(int32_t k) const {
    return {k < rows ? (kChannelsLast ? int64_t(k) : int64_t(k) * g.out_volume) : int64_t(-1)};
  }
  __device__ __forceinline__ Col col(int32_t j) const {
    if (j >= red) return {-1};
    if (kChannelsLast) return {int64_t(j) * g.K};
    uint32_t n, p;
    g.div_out_volume.divmod(uint32_t(j), n, p);
    return {int64_t(n) * g.K * g.out_volume + p};
  }
  __device__ __forceinline__ int64_t offset(const Row& r, const Col& c) const {
    return (r.base < 0 || c.base < 0) ? -1 : r.base + c.base;
  }
};

// wgrad's B: x as [row = weight column][red = (n, p)]. The weight column is c*kvol + t for NCHW
// (the reduction walks pixels, adjacent in memory) and t*C + c for NHWC (rows walk channels,
// adjacent in memory); the epilogue puts NHWC's columns back in (c, t) order.
template <bool kChannelsLast>
struct ImageColumnsOperand {
  static constexpr bool kContiguousK = !kChannelsLast;
  const float* data;
  ConvGeometry g;
  int32_t rows;  // C * kvol
  int32_t red;   // N * out_volume
  bool k4 = false;
  bool groups_of_four() const { return false; }  // strides and padding break the runs of pixels
  // Linear in (channel, z, y, x) like ImageOperand.
  struct Row { int64_t linear; int32_t dz, dy, dx; bool valid; };
  struct Col { int64_t linear; int32_t z, y, x; bool valid; };
  __device__ __forceinline__ Row row(int32_t j) const {
    Row r{};
    r.valid = j < rows;
    if (!r.valid) return r;
    uint32_t c, t;
    if (kChannelsLast) g.div_C.divmod(uint32_t(j), t, c);
    else g.div_kernel_volume.divmod(uint32_t(j), c, t);
    g.tap_offsets(t, r.dz, r.dy, r.dx);
    r.dz -= g.pad[0];
    r.dy -= g.pad[1];
    r.dx -= g.pad[2];
    r.linear = (kChannelsLast ? int64_t(c) : int64_t(c) * g.in_volume) + g.input_part<kChannelsLast>(r.dz, r.dy, r.dx);
    return r;
  }
  __device__ __forceinline__ Col col(int32_t j) const {
    Col c{};
    c.valid = j < red;
    if (!c.valid) return c;
    uint32_t n, p;
    g.div_out_volume.divmod(uint32_t(j), n, p);
    g.unravel_out(p, c.z, c.y, c.x);
    c.z *= g.stride[0];
    c.y *= g.stride[1];
    c.x *= g.stride[2];
    c.linear = int64_t(n) * g.C * g.in_volume + g.input_part<kChannelsLast>(c.z, c.y, c.x);
    return c;
  }
  __device__ __forceinline__ int64_t offset(const Row& r, const Col& c) const {
    const int32_t z = c.z + r.dz, y = c.y + r.dy, x = c.x + r.dx;
    if (!(r.valid && c.valid && g.inside_input(z, y, x))) return -1;
    return r.linear + c.linear;
  }
};

}  // namespace tg::cuda::engine
