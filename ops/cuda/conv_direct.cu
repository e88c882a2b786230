// The general direct convolution kernels: every geometry (any kernel size, stride, padding,
// dilation), NCDHW and channels-last, f32 and f64. 2-D convolutions arrive as 3-D ones with
// D = 1 (see ConvShape), so one set of kernels serves both. They are the last row of the
// dispatcher's table (ops/cuda/conv.cu): f64, and whatever the engine cannot index. One
// thread per output element (forward) or input element (grad-input); the weight and bias
// gradients are fixed-order block reductions, so results are bit-identical from run to run
// (no atomics).
#include <type_traits>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv_direct.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;        // elementwise kernels (forward, grad-input)
constexpr int kReduceThreads = 256;  // block reductions (grad-weight, grad-bias); multiple of 32
constexpr int64_t kMaxReduceBlocks = 65536;

// Offset of element (n, channel c, spatial position q) of x (channels = C, volume = in)
// or y (channels = K, volume = out), in either layout.
__device__ __forceinline__ int64_t x_index(const ConvShape& s, int64_t n, int64_t c, int64_t q) {
  return s.channels_last() ? (n * s.in_volume() + q) * s.C + c : (n * s.C + c) * s.in_volume() + q;
}
__device__ __forceinline__ int64_t y_index(const ConvShape& s, int64_t n, int64_t k, int64_t p) {
  return s.channels_last() ? (n * s.out_volume() + p) * s.K + k : (n * s.K + k) * s.out_volume() + p;
}

// Splits a flat spatial index into (d, h, w) for sizes dims[3].
__device__ __forceinline__ void unravel3(int64_t q, const int64_t* dims, int64_t* pos) {
  pos[2] = q % dims[2];
  q /= dims[2];
  pos[1] = q % dims[1];
  pos[0] = q / dims[1];
}

// Splits a flat index in memory order of a tensor (N, channels, volume) or channels-last
// (N, volume, channels) into (n, channel, position): consecutive threads then touch
// consecutive addresses in both layouts.
__device__ __forceinline__ void split_index(int64_t i, int64_t channels, int64_t volume, bool channels_last,
                                            int64_t& n, int64_t& c, int64_t& q) {
  if (channels_last) {
    c = i % channels;
    q = (i / channels) % volume;
    n = i / (channels * volume);
  } else {
    q = i % volume;
    c = (i / volume) % channels;
    n = i / (volume * channels);
  }
}

// Sum over the block in a fixed order (warp shuffles, then one warp over the warp sums),
// so the result does not depend on scheduling. The total is valid in thread 0.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : T(0);
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  __syncthreads();  // warp_sums is reused by the caller's next reduction
  return v;
}

// y[n, k, o] = b[k] + sum over c and the kernel window of x[n, c, o*stride - pad + t*dilation] * w[k, c, t]
template <class T>
__global__ void forward_kernel(T* __restrict__ y,        // (N, K, out) or (N, out, K)
                               const T* __restrict__ x,  // (N, C, in) or (N, in, C)
                               const T* __restrict__ w,  // (K, C, kd, kh, kw)
                               const T* __restrict__ b,  // (K) or null
                               ConvShape s) {
  const int64_t total = s.N * s.K * s.out_volume();
  const int64_t kvol = s.kernel_volume();
  TG_GRID_STRIDE(i, total) {
    int64_t n, k, p, o[3];
    split_index(i, s.K, s.out_volume(), s.channels_last(), n, k, p);
    unravel3(p, s.out, o);
    const T* wk = w + k * s.C * kvol;  // (C, kvol)
    T acc = b ? b[k] : T(0);
    for (int64_t kd = 0; kd < s.kernel[0]; ++kd) {
      const int64_t id = o[0] * s.stride[0] - s.pad[0] + kd * s.dilation[0];
      if (id < 0 || id >= s.in[0]) continue;
      for (int64_t kh = 0; kh < s.kernel[1]; ++kh) {
        const int64_t ih = o[1] * s.stride[1] - s.pad[1] + kh * s.dilation[1];
        if (ih < 0 || ih >= s.in[1]) continue;
        for (int64_t kw = 0; kw < s.kernel[2]; ++kw) {
          const int64_t iw = o[2] * s.stride[2] - s.pad[2] + kw * s.dilation[2];
          if (iw < 0 || iw >= s.in[2]) continue;
          const int64_t q = (id * s.in[1] + ih) * s.in[2] + iw;
          const int64_t kk = (kd * s.kernel[1] + kh) * s.kernel[2] + kw;
          for (int64_t c = 0; c < s.C; ++c) acc += x[x_index(s, n, c, q)] * wk[c * kvol + kk];
        }
      }
    }
    y[i] = acc;
  }
}

// Output coordinate o with o*stride - pad + t*dilation == i, if one exists in [0, out).
__device__ __forceinline__ bool source_output(int64_t i, int64_t t, int64_t stride, int64_t pad,
                                              int64_t dilation, int64_t out, int64_t& o) {
  const int64_t scaled = i + pad - t * dilation;
  if (scaled < 0 || scaled % stride != 0) return false;
  o = scaled / stride;
  return o < out;
}

// dx[n, c, i] = sum over kernel taps t and k of dy[n, k, o] * w[k, c, t], for every output o
// whose window reads input i through tap t.
template <class T>
__global__ void grad_input_kernel(T* __restrict__ dx,        // (N, C, in) or (N, in, C)
                                  const T* __restrict__ dy,  // (N, K, out) or (N, out, K)
                                  const T* __restrict__ w,   // (K, C, kd, kh, kw)
                                  ConvShape s) {
  const int64_t total = s.N * s.C * s.in_volume();
  const int64_t kvol = s.kernel_volume();
  TG_GRID_STRIDE(i, total) {
    int64_t n, c, q, pos[3], o[3];
    split_index(i, s.C, s.in_volume(), s.channels_last(), n, c, q);
    unravel3(q, s.in, pos);
    T acc = T(0);
    for (int64_t kd = 0; kd < s.kernel[0]; ++kd) {
      if (!source_output(pos[0], kd, s.stride[0], s.pad[0], s.dilation[0], s.out[0], o[0])) continue;
      for (int64_t kh = 0; kh < s.kernel[1]; ++kh) {
        if (!source_output(pos[1], kh, s.stride[1], s.pad[1], s.dilation[1], s.out[1], o[1])) continue;
        for (int64_t kw = 0; kw < s.kernel[2]; ++kw) {
          if (!source_output(pos[2], kw, s.stride[2], s.pad[2], s.dilation[2], s.out[2], o[2])) continue;
          const int64_t p = (o[0] * s.out[1] + o[1]) * s.out[2] + o[2];
          const int64_t kk = (kd * s.kernel[1] + kh) * s.kernel[2] + kw;
          const T* wc = w + c * kvol + kk;  // w[k, c, kk] = wc[k * C * kvol]
          for (int64_t k = 0; k < s.K; ++k) acc += dy[y_index(s, n, k, p)] * wc[k * s.C * kvol];
        }
      }
    }
    dx[i] = acc;
  }
}

// dw[k, c, t] = sum over n and output positions o of dy[n, k, o] * x[n, c, o*stride - pad + t*dilation].
// One block per weight element; each thread walks a fixed subset of (n, o), then block_sum.
template <class T>
__global__ void grad_weight_kernel(T* __restrict__ dw,        // (K, C, kd, kh, kw)
                                   const T* __restrict__ dy,  // (N, K, out) or (N, out, K)
                                   const T* __restrict__ x,   // (N, C, in) or (N, in, C)
                                   ConvShape s) {
  const int64_t kvol = s.kernel_volume();
  const int64_t count = s.K * s.C * kvol;
  const int64_t P = s.out_volume();
  for (int64_t e = blockIdx.x; e < count; e += gridDim.x) {  // uniform per block: syncs are safe
    const int64_t kk = e % kvol, c = (e / kvol) % s.C, k = e / (kvol * s.C);
    int64_t t[3], o[3];
    unravel3(kk, s.kernel, t);
    T acc = T(0);
    for (int64_t n = 0; n < s.N; ++n) {
      for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
        unravel3(p, s.out, o);
        const int64_t id = o[0] * s.stride[0] - s.pad[0] + t[0] * s.dilation[0];
        const int64_t ih = o[1] * s.stride[1] - s.pad[1] + t[1] * s.dilation[1];
        const int64_t iw = o[2] * s.stride[2] - s.pad[2] + t[2] * s.dilation[2];
        if (id < 0 || id >= s.in[0] || ih < 0 || ih >= s.in[1] || iw < 0 || iw >= s.in[2]) continue;
        const int64_t q = (id * s.in[1] + ih) * s.in[2] + iw;
        acc += dy[y_index(s, n, k, p)] * x[x_index(s, n, c, q)];
      }
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) dw[e] = acc;
  }
}

// db[k] = sum over n and output positions of dy[n, k, p], in two fixed-order passes (no atomics):
// partial sums over slices of the positions, then one block per channel adds its slices in
// order. One block per channel alone keeps too few loads in flight (a 64-channel layer would
// use 64 SMs, each thread waiting on one load at a time).
constexpr int64_t kBiasSlice = 2048;  // positions (NCHW) or rows (NHWC) per partial sum

// NCHW: block (k, slice) sums dy[n, k, p] over one image n and kBiasSlice consecutive p.
// partials[k][slice], slice = n * slices_per_image + chunk.
template <class T>
__global__ void grad_bias_partials_nchw(T* __restrict__ partials, const T* __restrict__ dy, ConvShape s,
                                        int64_t slices_per_image) {
  const int64_t P = s.out_volume(), slices = s.N * slices_per_image;
  for (int64_t b = blockIdx.x; b < s.K * slices; b += gridDim.x) {
    const int64_t k = b / slices, slice = b % slices;
    const int64_t n = slice / slices_per_image, p0 = (slice % slices_per_image) * kBiasSlice;
    const int64_t p1 = p0 + kBiasSlice < P ? p0 + kBiasSlice : P;
    const T* row = dy + (n * s.K + k) * P;
    T acc = T(0);
#pragma unroll 4
    for (int64_t p = p0 + threadIdx.x; p < p1; p += blockDim.x) acc += row[p];
    acc = block_sum(acc);
    if (threadIdx.x == 0) partials[b] = acc;
    __syncthreads();  // block_sum's shared words are reused by the next iteration
  }
}

// NHWC: dy is (rows = N * out, K); block (channel group, slice) sums kBiasSlice rows for
// blockDim.x consecutive channels, one per thread. partials[k][slice].
template <class T>
__global__ void grad_bias_partials_nhwc(T* __restrict__ partials, const T* __restrict__ dy, ConvShape s,
                                        int64_t slices) {
  const int64_t rows = s.N * s.out_volume(), groups = (s.K + blockDim.x - 1) / blockDim.x;
  for (int64_t b = blockIdx.x; b < groups * slices; b += gridDim.x) {
    const int64_t k = (b / slices) * blockDim.x + threadIdx.x, slice = b % slices;
    if (k >= s.K) continue;
    const int64_t r0 = slice * kBiasSlice, r1 = r0 + kBiasSlice < rows ? r0 + kBiasSlice : rows;
    T acc = T(0);
#pragma unroll 8
    for (int64_t r = r0; r < r1; ++r) acc += dy[r * s.K + k];
    partials[k * slices + slice] = acc;
  }
}

// db[k] = sum of partials[k][0 .. slices) in a fixed order.
template <class T>
__global__ void grad_bias_reduce(T* __restrict__ db, const T* __restrict__ partials, int64_t K, int64_t slices) {
  for (int64_t k = blockIdx.x; k < K; k += gridDim.x) {
    T acc = T(0);
    for (int64_t i = threadIdx.x; i < slices; i += blockDim.x) acc += partials[k * slices + i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) db[k] = acc;
    __syncthreads();
  }
}

unsigned reduce_blocks(int64_t count) {
  return static_cast<unsigned>(count < kMaxReduceBlocks ? count : kMaxReduceBlocks);
}

}  // namespace

void direct_conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s) {
  const int64_t total = y.numel();
  if (total == 0) return;
  const int dev = y.device().index;
  set_device(dev);
  dispatch_floating("conv_forward", y.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    forward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream(dev)>>>(
        y.data<T>(), x.data<T>(), w.data<T>(), b.defined() ? b.data<T>() : nullptr, s);
  });
  TG_LAUNCH_CHECK();
}

void direct_conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s) {
  const int64_t total = dx.numel();
  if (total == 0) return;
  const int dev = dx.device().index;
  set_device(dev);
  dispatch_floating("conv_grad_input", dx.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    grad_input_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream(dev)>>>(
        dx.data<T>(), dy.data<T>(), w.data<T>(), s);
  });
  TG_LAUNCH_CHECK();
}

void direct_conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s) {
  const int64_t count = dw.numel();
  if (count == 0) return;
  const int dev = dw.device().index;
  set_device(dev);
  dispatch_floating("conv_grad_weight", dw.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    grad_weight_kernel<T><<<reduce_blocks(count), kReduceThreads, 0, stream(dev)>>>(
        dw.data<T>(), dy.data<T>(), x.data<T>(), s);
  });
  TG_LAUNCH_CHECK();
}

void conv_grad_bias(const Tensor& db, const Tensor& dy, const ConvShape& s) {
  const int64_t count = db.numel();
  if (count == 0) return;
  const int dev = db.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const int64_t P = s.out_volume();
  const int64_t slices_per_image = (P + kBiasSlice - 1) / kBiasSlice;
  const int64_t slices = s.channels_last() ? (s.N * P + kBiasSlice - 1) / kBiasSlice : s.N * slices_per_image;
  const Tensor partials = Tensor::empty({s.K * slices}, {.dtype = db.dtype(), .device = db.device()});
  dispatch_floating("conv_grad_bias", db.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    if (s.channels_last()) {
      const int64_t groups = (s.K + kReduceThreads - 1) / kReduceThreads;
      grad_bias_partials_nhwc<T><<<reduce_blocks(groups * slices), kReduceThreads, 0, st>>>(partials.data<T>(),
                                                                                            dy.data<T>(), s, slices);
    } else {
      grad_bias_partials_nchw<T><<<reduce_blocks(s.K * slices), kReduceThreads, 0, st>>>(
          partials.data<T>(), dy.data<T>(), s, slices_per_image);
    }
    TG_LAUNCH_CHECK();
    grad_bias_reduce<T><<<reduce_blocks(count), kReduceThreads, 0, st>>>(db.data<T>(), partials.data<T>(), s.K,
                                                                         slices);
  });
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
