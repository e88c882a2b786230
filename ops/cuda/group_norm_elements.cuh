// The element-level pieces of the group_norm kernels (ops/cuda/norm.cu): the block reduction,
// the group statistics, the ReLU and its gradient mask, the dx formula, and the staging copy.
// Device functions only; included by norm.cu alone.
#pragma once
#include <cstdint>

#include "core/half.h"

namespace tg::cuda::group_norm_detail {

// x's storage: T itself, or a half type under Autocast (bf16 / f16 bit patterns, distinct
// types so that the kernels are instantiated per format). A half x is widened exactly on load
// (the values the f32 kernels would read from an f32 copy) and its gradient is rounded once,
// to nearest even, from the f32 result (as the cast's backward rounds it).
struct Bf16Bits {
  uint16_t bits;
};
struct F16Bits {
  uint16_t bits;
};

template <class T>
__device__ __forceinline__ T load_x(const T* __restrict__ p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_x(const Bf16Bits* __restrict__ p, int64_t i) { return decode_bf16(p[i].bits); }
__device__ __forceinline__ float load_x(const F16Bits* __restrict__ p, int64_t i) { return decode_f16(p[i].bits); }

template <class T>
__device__ __forceinline__ void store_x(T* __restrict__ p, int64_t i, T v) { p[i] = v; }
__device__ __forceinline__ void store_x(Bf16Bits* __restrict__ p, int64_t i, float v) { p[i].bits = encode_bf16(v); }
__device__ __forceinline__ void store_x(F16Bits* __restrict__ p, int64_t i, float v) { p[i].bits = encode_f16(v); }

// Sums (a, b) over a 1-D block whose size is a multiple of 32; every thread gets the totals.
__device__ inline void block_sum2(double& a, double& b) {
  __shared__ double sa[32], sb[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    a = lane < warps ? sa[lane] : 0.0;
    b = lane < warps ? sb[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_down_sync(0xffffffffu, a, o);
      b += __shfl_down_sync(0xffffffffu, b, o);
    }
    if (lane == 0) {
      sa[0] = a;
      sb[0] = b;
    }
  }
  __syncthreads();
  a = sa[0];
  b = sb[0];
  __syncthreads();  // the next call may overwrite sa/sb
}

// max(0, v) as the relu op computes it (NaN gives 0), where `relu`; else v.
template <class T>
__device__ __forceinline__ T relu_if(bool relu, T v) { return relu && !(v > T(0)) ? T(0) : v; }

// The gradient reaching the normalization: dy, or with the ReLU (y the forward's output, else
// null) dy where y > 0, as the relu op's backward gives it.
template <class T>
__device__ __forceinline__ T masked_grad(const T* __restrict__ y, const T* __restrict__ dy, int64_t i) {
  return y && !(y[i] > T(0)) ? T(0) : dy[i];
}

// Mean and 1/std of a group from its sum and sum of squares (biased variance; in double, which
// keeps the cancellation small).
__device__ __forceinline__ void group_stats(double s, double ss, int64_t M, double eps, double& mu, double& rs) {
  mu = s / double(M);
  rs = rsqrt(fmax(ss / double(M) - mu * mu, 0.0) + eps);
}

// Products rounded on their own: a contracted fma(gc, dy, -A) would leave a rounding residue
// where the exact answer is 0 (a group of one element).
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// One element of dx: the CPU formula term by term in T (x - mu first keeps f32 accurate, and a
// degenerate group of one element, var 0, gives exactly 0 like the reference).
template <class T>
__device__ __forceinline__ T dx_value(T rs, T A, T B, T mu, T gc, T dy, T x) {
  return rs * (mul_rn(gc, dy) - A - (x - mu) * rs * B);
}

// dst[0, M) = src[0, M) by the block, in 16-byte pieces where both sides allow them (the group
// starts on a 16-byte boundary and spans whole pieces).
template <class T>
__device__ inline void stage_group(T* __restrict__ dst, const T* __restrict__ src, int64_t M) {
  const int64_t bytes = M * int64_t(sizeof(T));
  if ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | uintptr_t(bytes)) % 16 == 0) {
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) d4[i] = s4[i];
  } else {
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace tg::cuda::group_norm_detail
