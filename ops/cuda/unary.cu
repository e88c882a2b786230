// CUDA kernels of the unary family: one grid-stride loop per function and direction, the
// function a template argument (ops/unary_math.h), evaluated in the tensor's own type.
// 64-bit indices: tensors of 2^31 elements and more are in scope.
#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/unary_kernels.h"
#include "ops/unary_math.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

template <unary_math::Fn F, class T>
__global__ void unary_forward_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t n,
                                     unary_math::Scalars s) {
  TG_GRID_STRIDE(i, n) out[i] = unary_math::forward<F, T>(x[i], s);
}

template <unary_math::Fn F, class T>
__global__ void unary_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ saved,
                                      int64_t n, unary_math::Scalars s) {
  TG_GRID_STRIDE(i, n) dx[i] = unary_math::backward<F, T>(dy[i], saved[i], s);
}

}  // namespace

void unary(const Tensor& out, const Tensor& x, const UnaryParams& p) {
  const char* name = unary_name(p.op);
  check_unary_params(p);
  check_unary_buffers(name, out, x);
  const int64_t n = x.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const unary_math::Scalars s = unary_math::scalars_of(p);
  dispatch_floating(name, x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    unary_math::visit(unary_math::fn_of(p), [&](auto fn) {
      constexpr unary_math::Fn F = decltype(fn)::value;
      unary_forward_kernel<F, T><<<grid_for(n, kThreads), kThreads, 0, st>>>(out.data<T>(), x.data<T>(), n, s);
    });
  });
  TG_LAUNCH_CHECK();
}

void unary_backward(const Tensor& dx, const Tensor& dy, const Tensor& saved, const UnaryParams& p) {
  const char* name = unary_name(p.op);
  check_unary_params(p);
  check_unary_backward_buffers(name, dx, dy, saved);
  const int64_t n = saved.numel();
  if (n == 0) return;
  const int dev = saved.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const unary_math::Scalars s = unary_math::scalars_of(p);
  dispatch_floating(name, saved.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    unary_math::visit(unary_math::fn_of(p), [&](auto fn) {
      constexpr unary_math::Fn F = decltype(fn)::value;
      unary_backward_kernel<F, T><<<grid_for(n, kThreads), kThreads, 0, st>>>(dx.data<T>(), dy.data<T>(),
                                                                               saved.data<T>(), n, s);
    });
  });
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
