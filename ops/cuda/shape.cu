// CUDA kernels of the shape family's one strided copy (ops/shape.h): a grid-stride loop
// over the small tensor, each element mapped to its place in the big tensor's window.
// 64-bit indices: tensors of 2^31 elements and more are in scope.
#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/shape_pool_kernels.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

// The big tensor's offset of small element i: small is (outer, length, inner), big is
// (outer, dim_size, inner) and small's row j is big's row start + j * step.
__device__ __forceinline__ int64_t big_offset(int64_t i, const SliceProblem& p) {
  const int64_t k = i % p.inner;
  const int64_t r = i / p.inner;
  const int64_t j = r % p.length;
  const int64_t o = r / p.length;
  return (o * p.dim_size + p.start + j * p.step) * p.inner + k;
}

template <class T>
__global__ void slice_gather_kernel(T* __restrict__ small, const T* __restrict__ big, SliceProblem p, int64_t n) {
  TG_GRID_STRIDE(i, n) small[i] = big[big_offset(i, p)];
}

template <class T>
__global__ void slice_scatter_kernel(T* __restrict__ big, const T* __restrict__ small, SliceProblem p, int64_t n) {
  TG_GRID_STRIDE(i, n) big[big_offset(i, p)] = small[i];
}

// Launches the gather or the scatter over the small tensor's n elements.
template <bool kScatter>
void launch(const char* op, const Tensor& big, const Tensor& small, const SliceProblem& p) {
  check_slice_buffers(op, big, small, p);
  const int64_t n = small.numel();
  if (n == 0) return;
  const int dev = big.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  // Copies only: the half types move as their 2-byte bit patterns, as on the CPU.
  auto moved = [&](auto&& f) {
    if (is_half(big.dtype())) f(static_cast<uint16_t*>(nullptr));
    else dispatch_any(big.dtype(), f);
  };
  moved([&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    T* b = static_cast<T*>(big.raw_data());
    T* s = static_cast<T*>(small.raw_data());
    if constexpr (kScatter) {
      slice_scatter_kernel<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(b, s, p, n);
    } else {
      slice_gather_kernel<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(s, b, p, n);
    }
  });
  TG_LAUNCH_CHECK();
}

}  // namespace

void slice_gather(const Tensor& small, const Tensor& big, const SliceProblem& p) {
  launch<false>("slice_gather", big, small, p);
}

void slice_scatter(const Tensor& big, const Tensor& small, const SliceProblem& p) {
  launch<true>("slice_scatter", big, small, p);
}

}  // namespace tg::cuda
