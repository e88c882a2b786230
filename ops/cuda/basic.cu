// CUDA kernels of the basic ops: elementwise with broadcasting, reductions, permute.
// Grid-stride loops with 64-bit indices: B's output and D's matrix hold 2^31 elements.
#include <algorithm>
#include <type_traits>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/broadcast.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/kernels.h"
#include "ops/reduce_index.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ T apply(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::add: return x + y;
    case BinaryOp::sub: return x - y;
    case BinaryOp::mul: return x * y;
    default: return x / y;
  }
}

template <class T>
__global__ void binary_same_shape(BinaryOp op, T* out, const T* a, const T* b, int64_t n) {
  TG_GRID_STRIDE(i, n) out[i] = apply(op, a[i], b[i]);
}

template <class T>
__global__ void binary_broadcast(BinaryOp op, T* out, const T* a, const T* b, int64_t n, BroadcastIndex ix) {
  TG_GRID_STRIDE(i, n) {
    int64_t ia, ib;
    ix.offsets(i, ia, ib);
    out[i] = apply(op, a[ia], b[ib]);
  }
}

template <class T>
__global__ void affine_kernel(T* out, const T* a, int64_t n, T scale, T shift) {
  TG_GRID_STRIDE(i, n) out[i] = a[i] * scale + shift;
}

template <class T>
__global__ void relu_kernel(T* out, const T* x, int64_t n) {
  TG_GRID_STRIDE(i, n) out[i] = x[i] > T(0) ? x[i] : T(0);
}

template <class T>
__global__ void relu_backward_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  TG_GRID_STRIDE(i, n) dx[i] = x[i] > T(0) ? dy[i] : T(0);
}

// ---- reductions ----------------------------------------------------------------------------
// Each output's reduction range is split into `splits` chunks so that a few outputs still
// fill the GPU; chunk partials are written in double and combined by a second pass in a
// fixed order, so the result is the same bits every run (no atomics).

template <class In, class Out>
__global__ void reduce_warp_per_item(Out* out, const In* x, ReduceIndex ix, int64_t splits, int64_t chunk) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t item = warp; item < ix.out_count * splits; item += warps) {
    const int64_t o = item / splits, s = item % splits;
    const int64_t begin = s * chunk;
    const int64_t end = min(begin + chunk, ix.red_count);
    const In* base = x + ix.out_base(o);
    double acc = 0;
    if (ix.red_rank == 1 && ix.red_strides[0] == 1) {
      for (int64_t r = begin + lane; r < end; r += 32) acc += static_cast<double>(base[r]);
    } else {
      for (int64_t r = begin + lane; r < end; r += 32) acc += static_cast<double>(base[ix.red_offset(r)]);
    }
    for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (lane == 0) out[o * splits + s] = static_cast<Out>(acc);
  }
}

// Used when the innermost input dimension is kept: neighbouring threads take neighbouring
// outputs, so their loads coalesce.
template <class In, class Out>
__global__ void reduce_thread_per_item(Out* out, const In* x, ReduceIndex ix, int64_t splits, int64_t chunk) {
  TG_GRID_STRIDE(item, ix.out_count * splits) {
    const int64_t s = item / ix.out_count, o = item % ix.out_count;
    const int64_t begin = s * chunk;
    const int64_t end = min(begin + chunk, ix.red_count);
    const In* base = x + ix.out_base(o);
    double acc = 0;
    for (int64_t r = begin; r < end; ++r) acc += static_cast<double>(base[ix.red_offset(r)]);
    out[o * splits + s] = static_cast<Out>(acc);
  }
}

template <class In, class Out>
void launch_reduce(Out* out, const In* x, const ReduceIndex& ix, int64_t splits, cudaStream_t st) {
  const int64_t chunk = ceil_div(ix.red_count, splits);
  const bool inner_kept = ix.kept_rank > 0 && ix.kept_strides[ix.kept_rank - 1] == 1;
  if (inner_kept) {
    reduce_thread_per_item<In, Out><<<grid_for(ix.out_count * splits, kThreads), kThreads, 0, st>>>(
        out, x, ix, splits, chunk);
  } else {
    reduce_warp_per_item<In, Out><<<grid_for(ix.out_count * splits * 32, kThreads), kThreads, 0, st>>>(
        out, x, ix, splits, chunk);
  }
  TG_LAUNCH_CHECK();
}

}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  if (n == 0) return;
  set_device(out.device().index);
  cudaStream_t st = stream(out.device().index);
  dispatch_floating("binary (CUDA)", a.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    if (a.shape() == out.shape() && b.shape() == out.shape()) {
      binary_same_shape<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(op, out.data<T>(), a.data<T>(), b.data<T>(), n);
    } else {
      BroadcastIndex ix = make_broadcast_index(out.shape(), a.shape(), b.shape());
      binary_broadcast<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(op, out.data<T>(), a.data<T>(), b.data<T>(), n, ix);
    }
  });
  TG_LAUNCH_CHECK();
}

void affine(const Tensor& out, const Tensor& a, double scale, double shift) {
  const int64_t n = a.numel();
  if (n == 0) return;
  set_device(a.device().index);
  dispatch_floating("affine (CUDA)", a.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    affine_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(a.device().index)>>>(
        out.data<T>(), a.data<T>(), n, static_cast<T>(scale), static_cast<T>(shift));
  });
  TG_LAUNCH_CHECK();
}

void relu(const Tensor& out, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  set_device(x.device().index);
  dispatch_floating("relu (CUDA)", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    relu_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(x.device().index)>>>(out.data<T>(), x.data<T>(), n);
  });
  TG_LAUNCH_CHECK();
}

void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  set_device(x.device().index);
  dispatch_floating("relu_backward (CUDA)", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    relu_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(x.device().index)>>>(
        dx.data<T>(), dy.data<T>(), x.data<T>(), n);
  });
  TG_LAUNCH_CHECK();
}

void sum(const Tensor& out, const Tensor& x, const ReduceIndex& ix) {
  set_device(x.device().index);
  cudaStream_t st = stream(x.device().index);
  dispatch_floating("sum (CUDA)", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    if (ix.red_count == 0) {  // empty reduction: zeros
      TG_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), st));
      return;
    }
    // Enough work items to fill the GPU (~32 warps per SM), chunks of at least 2048 elements.
    const int64_t want_items = 132 * 32;
    int64_t splits = ix.out_count >= want_items ? 1 : ceil_div(want_items, ix.out_count);
    splits = std::max<int64_t>(1, std::min(splits, ceil_div(ix.red_count, 2048)));
    if (splits == 1) {
      launch_reduce<T, T>(out.data<T>(), x.data<T>(), ix, 1, st);
      return;
    }
    // (out_count, splits) partial sums; a tensor so that the pool accounts for it.
    Tensor partials = Tensor::empty(Shape{ix.out_count * splits}, {.dtype = DType::f64, .device = x.device()});
    double* partial = partials.data<double>();
    launch_reduce<T, double>(partial, x.data<T>(), ix, splits, st);
    ReduceIndex second;
    second.kept_rank = 1;
    second.kept_sizes[0] = ix.out_count;
    second.kept_strides[0] = splits;
    second.red_rank = 1;
    second.red_sizes[0] = splits;
    second.red_strides[0] = 1;
    second.out_count = ix.out_count;
    second.red_count = splits;
    launch_reduce<double, T>(out.data<T>(), partial, second, 1, st);
  });
}

namespace {

// Output element i reads input element sum_d c_d * strides[d], c = unravel(i, out sizes).
struct PermuteIndex {
  int rank;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
};

template <class Word>  // moves elements as raw words of their size
__global__ void permute_kernel(Word* out, const Word* in, int64_t n, PermuteIndex ix) {
  TG_GRID_STRIDE(i, n) out[i] = in[ReduceIndex::unravel(i, ix.rank, ix.sizes, ix.strides)];
}

}  // namespace

void permute(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims) {
  const int64_t n = x.numel();
  if (n == 0) return;
  PermuteIndex ix{};
  ix.rank = static_cast<int>(x.dim());
  auto in_strides = contiguous_strides(x.shape());
  for (int d = 0; d < ix.rank; ++d) {
    ix.sizes[d] = out.size(d);
    ix.strides[d] = in_strides[dims[d]];
  }
  set_device(x.device().index);
  cudaStream_t st = stream(x.device().index);
  // Moves elements as words of their size: the half types (2 bytes) are moved like any other.
  if (dtype_size(x.dtype()) == 2) {
    permute_kernel<uint16_t><<<grid_for(n, kThreads), kThreads, 0, st>>>(
        static_cast<uint16_t*>(out.raw_data()), static_cast<const uint16_t*>(x.raw_data()), n, ix);
  } else if (dtype_size(x.dtype()) == 4) {
    permute_kernel<uint32_t><<<grid_for(n, kThreads), kThreads, 0, st>>>(
        static_cast<uint32_t*>(out.raw_data()), static_cast<const uint32_t*>(x.raw_data()), n, ix);
  } else {
    permute_kernel<uint64_t><<<grid_for(n, kThreads), kThreads, 0, st>>>(
        static_cast<uint64_t*>(out.raw_data()), static_cast<const uint64_t*>(x.raw_data()), n, ix);
  }
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
