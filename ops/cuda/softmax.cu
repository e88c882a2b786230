// CUDA kernels of softmax and log_softmax, forward and backward. x is seen as
// (outer, D, inner) (ops/softmax.h); each row of D elements is one reduction, then one
// elementwise pass over the same row. Three layouts, one reduction scheme:
//
//   inner == 1, D <= 1024 : one warp per row (many short rows: no block-wide barrier)
//   inner == 1, D >  1024 : one block per row (long rows, 100k and more)
//   inner >  1            : a 32 x by block per 32 neighbouring columns: lanes along the
//                           inner dim so every load coalesces, threads along y split D
//
// Rows are taken by grid-stride loops with 64-bit indices, so any number of rows fits a
// bounded grid. The forward keeps an online (running max, sum of exp(x - max)) pair, so it
// reads x twice (statistics, then output) rather than three times; sums are in double.
// Reductions combine in a fixed order (xor butterflies, then partials in index order), so
// results are the same bits on every run.
#include <algorithm>
#include <cmath>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/unary_kernels.h"

namespace tg::cuda {
namespace {

constexpr int64_t kWarpRowMax = 1024;
constexpr int kRowThreads = 256;  // warp-per-row kernel: 8 rows per block
constexpr int kColumnsX = 32;
constexpr int kColumnsMaxY = 16;
constexpr int64_t kMaxBlocks = 65535 * 8;

template <class T>
struct MaxSum {
  T m;       // the largest element seen (-inf: none yet, or only -inf)
  double s;  // sum of exp(x - m) over the elements seen
};

// Forward: y = exp(x - max) / sum, or x - max - log(sum).
template <class T, bool Log>
struct Forward {
  using Acc = MaxSum<T>;
  T* __restrict__ y;
  const T* __restrict__ x;

  __device__ Acc identity() const { return {T(-INFINITY), 0.0}; }
  __device__ void add(Acc& a, int64_t k) const {
    const T v = x[k];
    if (v > a.m) {
      // exp(v - v) rather than 1: it is NaN for v = +inf, so such a row is NaN throughout,
      // as the two-pass reference (and PyTorch) make it.
      a.s = a.s * double(std::exp(a.m - v)) + double(std::exp(v - v));
      a.m = v;
    } else if (v != T(-INFINITY)) {  // -inf adds 0; when a.m is -inf too, v - a.m is NaN
      a.s += double(std::exp(v - a.m));
    }
  }
  __device__ static Acc merge(const Acc& a, const Acc& b) {
    const T m = a.m > b.m ? a.m : b.m;
    if (m == T(-INFINITY)) return {m, a.s + b.s};
    return {m, a.s * double(std::exp(a.m - m)) + b.s * double(std::exp(b.m - m))};
  }
  __device__ void write(const Acc& a, int64_t k) const {
    if constexpr (Log) {
      // In double: for logits near 1000 a T-rounded log-sum-exp would lose the small result.
      y[k] = static_cast<T>(double(x[k]) - double(a.m) - std::log(a.s));
    } else {
      y[k] = std::exp(x[k] - a.m) * static_cast<T>(1.0 / a.s);
    }
  }
};

// Backward from y: dx = y (dy - sum(dy y)), or dy - exp(y) sum(dy).
template <class T, bool Log>
struct Backward {
  using Acc = double;
  T* __restrict__ dx;
  const T* __restrict__ dy;
  const T* __restrict__ y;

  __device__ Acc identity() const { return 0.0; }
  __device__ void add(Acc& a, int64_t k) const {
    if constexpr (Log) a += double(dy[k]);
    else a += double(dy[k]) * double(y[k]);
  }
  __device__ static Acc merge(Acc a, Acc b) { return a + b; }
  __device__ void write(Acc a, int64_t k) const {
    if constexpr (Log) dx[k] = dy[k] - std::exp(y[k]) * static_cast<T>(a);
    else dx[k] = y[k] * (dy[k] - static_cast<T>(a));
  }
};

__device__ __forceinline__ double shfl_xor(double v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
template <class T>
__device__ __forceinline__ MaxSum<T> shfl_xor(const MaxSum<T>& v, int mask) {
  return {__shfl_xor_sync(0xffffffffu, v.m, mask), __shfl_xor_sync(0xffffffffu, v.s, mask)};
}

// Every lane ends with the same bits: merge is symmetric, IEEE + and * commute.
template <class Op, class Acc>
__device__ Acc warp_reduce(Acc a) {
  for (int mask = 16; mask > 0; mask >>= 1) a = Op::merge(a, shfl_xor(a, mask));
  return a;
}

template <class Op>
__global__ void rows_warp_kernel(Op op, int64_t rows, int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = warp; r < rows; r += warps) {  // warp-uniform: the shuffles see 32 lanes
    const int64_t base = r * D;
    auto a = op.identity();
    for (int64_t j = lane; j < D; j += 32) op.add(a, base + j);
    a = warp_reduce<Op>(a);
    for (int64_t j = lane; j < D; j += 32) op.write(a, base + j);
  }
}

template <class Op>
__global__ void rows_block_kernel(Op op, int64_t rows, int64_t D) {
  __shared__ typename Op::Acc part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * D;
    auto a = op.identity();
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) op.add(a, base + j);
    a = warp_reduce<Op>(a);
    if (lane == 0) part[warp] = a;
    __syncthreads();
    a = part[0];
    for (int w = 1; w < warps; ++w) a = Op::merge(a, part[w]);
    __syncthreads();  // part is rewritten for the next row
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) op.write(a, base + j);
  }
}

template <class Op>
__global__ void columns_kernel(Op op, int64_t outer, int64_t D, int64_t inner) {
  __shared__ typename Op::Acc part[kColumnsMaxY][kColumnsX];
  const int64_t tiles_per_outer = ceil_div(inner, kColumnsX);
  const int64_t tiles = outer * tiles_per_outer;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t o = t / tiles_per_outer;
    const int64_t i = (t % tiles_per_outer) * kColumnsX + threadIdx.x;
    const bool active = i < inner;
    const int64_t base = o * D * inner + i;  // element (o, 0, i)
    auto a = op.identity();
    if (active)
      for (int64_t j = threadIdx.y; j < D; j += blockDim.y) op.add(a, base + j * inner);
    part[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    a = part[0][threadIdx.x];
    for (unsigned k = 1; k < blockDim.y; ++k) a = Op::merge(a, part[k][threadIdx.x]);
    __syncthreads();
    if (active)
      for (int64_t j = threadIdx.y; j < D; j += blockDim.y) op.write(a, base + j * inner);
  }
}

template <class Op>
void launch(const Op& op, const SoftmaxProblem& p, cudaStream_t st) {
  const int64_t rows = p.rows(), D = p.dim_size;
  if (p.inner == 1 && D <= kWarpRowMax) {
    const int64_t blocks = std::min(ceil_div(rows, kRowThreads / 32), kMaxBlocks);
    rows_warp_kernel<Op><<<static_cast<unsigned>(blocks), kRowThreads, 0, st>>>(op, rows, D);
  } else if (p.inner == 1) {
    const int threads = D >= 16384 ? 1024 : D >= 4096 ? 512 : 256;
    const int64_t blocks = std::min(rows, kMaxBlocks);
    rows_block_kernel<Op><<<static_cast<unsigned>(blocks), threads, 0, st>>>(op, rows, D);
  } else {
    unsigned by = 1;  // threads along D: no more than D, so short dims leave none idle
    while (by < kColumnsMaxY && by < D) by *= 2;
    const int64_t blocks = std::min(p.outer * ceil_div(p.inner, kColumnsX), kMaxBlocks);
    columns_kernel<Op><<<static_cast<unsigned>(blocks), dim3(kColumnsX, by), 0, st>>>(op, p.outer, D, p.inner);
  }
  TG_LAUNCH_CHECK();
}

}  // namespace

void softmax(const Tensor& out, const Tensor& x, const SoftmaxProblem& p) {
  const char* op = p.log ? "log_softmax" : "softmax";
  check_softmax_buffers(op, out, x, p);
  if (x.numel() == 0) return;
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  dispatch_floating(op, x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    if (p.log) launch(Forward<T, true>{out.data<T>(), x.data<T>()}, p, st);
    else launch(Forward<T, false>{out.data<T>(), x.data<T>()}, p, st);
  });
}

void softmax_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, const SoftmaxProblem& p) {
  const char* op = p.log ? "log_softmax_backward" : "softmax_backward";
  check_softmax_backward_buffers(op, dx, dy, y, p);
  if (y.numel() == 0) return;
  const int dev = y.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  dispatch_floating(op, y.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    if (p.log) launch(Backward<T, true>{dx.data<T>(), dy.data<T>(), y.data<T>()}, p, st);
    else launch(Backward<T, false>{dx.data<T>(), dy.data<T>(), y.data<T>()}, p, st);
  });
}

}  // namespace tg::cuda
