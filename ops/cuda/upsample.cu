// CUDA kernels of upsample: one thread per output (forward) or per input (backward, a
// gather over the outputs that read it: deterministic, no atomics), 64-bit indices, over
// the host-built tables of ops/upsample.cpp copied to the device, so the GPU reads the same
// taps and weights as the CPU reference.
#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/upsample.h"
#include "ops/upsample_math.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

// Splits a flat index over (NC, e0, e1, e2) into nc and the three spatial indices.
__device__ __forceinline__ int64_t split_index(int64_t e, const int64_t (&ext)[3], int64_t (&idx)[3]) {
  idx[2] = e % ext[2];
  e /= ext[2];
  idx[1] = e % ext[1];
  e /= ext[1];
  idx[0] = e % ext[0];
  return e / ext[0];
}

template <class T>
__global__ void forward_kernel(T* __restrict__ y, const T* __restrict__ x, UpsampleProblem p,
                               const int64_t* __restrict__ ints, const double* __restrict__ reals, UpsampleLayout L,
                               int64_t n) {
  TG_GRID_STRIDE(e, n) {
    int64_t o[3];
    const int64_t nc = split_index(e, p.out, o);
    y[e] = static_cast<T>(upsample_math::forward_at(x, nc, o, p.in, ints, reals, L));
  }
}

template <class T>
__global__ void backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, UpsampleProblem p,
                                const int64_t* __restrict__ ints, const double* __restrict__ reals, UpsampleLayout L,
                                int64_t n) {
  TG_GRID_STRIDE(e, n) {
    int64_t i[3];
    const int64_t nc = split_index(e, p.in, i);
    dx[e] = static_cast<T>(upsample_math::backward_at(dy, nc, i, p.out, ints, reals, L));
  }
}

// The tables on the device of `like` (stream-ordered copies; freed after the kernels).
struct DeviceTables {
  Tensor ints, reals;
  UpsampleLayout layout;
};
DeviceTables device_tables(const UpsampleProblem& p, const Tensor& like) {
  UpsampleTables t = upsample_tables(p, like.dtype());
  const int64_t ni = static_cast<int64_t>(t.ints.size()), nr = static_cast<int64_t>(t.reals.size());
  return {from_vector(t.ints, {ni}).to(like.device()), from_vector(t.reals, {nr}).to(like.device()), t.layout};
}

}  // namespace

void upsample_forward(const Tensor& y, const Tensor& x, const UpsampleProblem& p) {
  check_upsample_buffers("upsample_forward", y, x, p);
  const int64_t n = p.out_numel();
  if (n == 0) return;
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const DeviceTables t = device_tables(p, x);
  dispatch_floating("upsample", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    forward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(y.data<T>(), x.data<T>(), p, t.ints.data<int64_t>(),
                                                                  t.reals.data<double>(), t.layout, n);
  });
  TG_LAUNCH_CHECK();
}

void upsample_backward(const Tensor& dx, const Tensor& dy, const UpsampleProblem& p) {
  check_upsample_buffers("upsample_backward", dy, dx, p);
  const int64_t n = p.in_numel();
  if (n == 0) return;
  const int dev = dx.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const DeviceTables t = device_tables(p, dx);
  dispatch_floating("upsample_backward", dx.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(dx.data<T>(), dy.data<T>(), p,
                                                                   t.ints.data<int64_t>(), t.reals.data<double>(),
                                                                   t.layout, n);
  });
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
