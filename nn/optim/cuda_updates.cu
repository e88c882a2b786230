// One kernel per optimizer: every parameter element is read, updated with its state and
// written back in a single pass (grid-stride, 64-bit indices), by the same per-element step
// (cuda_updates.h) as the CPU loops, in the parameter's type.
#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "nn/optim/cuda_updates.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void sgd_kernel(T* __restrict__ param, T* __restrict__ buf, const T* __restrict__ grad, int64_t n,
                           nn::SGDCoefficients<T> c) {
  TG_GRID_STRIDE(i, n) nn::sgd_step(param, buf, grad, i, c);
}

template <class T>
__global__ void adam_kernel(T* __restrict__ param, T* __restrict__ exp_avg, T* __restrict__ exp_avg_sq,
                            const T* __restrict__ grad, int64_t n, nn::AdamCoefficients<T> c,
                            const double* replay_scalars) {
  if (replay_scalars) nn::read_replay_scalars(c, replay_scalars);
  TG_GRID_STRIDE(i, n) nn::adam_step(param, exp_avg, exp_avg_sq, grad, i, c);
}

}  // namespace

void sgd_update(const Tensor& param, const Tensor& momentum_buffer, const Tensor& grad, const nn::SGDUpdate& u) {
  int64_t n = param.numel();
  if (n == 0) return;
  int dev = param.device().index;
  set_device(dev);
  dispatch_floating("optimizer update", param.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const nn::SGDCoefficients<T> c(u);
    T* buf = c.use_momentum ? momentum_buffer.data<T>() : nullptr;
    sgd_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(param.data<T>(), buf, grad.data<T>(), n, c);
  });
  TG_LAUNCH_CHECK();
}

void adam_update(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad,
                 const nn::AdamUpdate& u) {
  int64_t n = param.numel();
  if (n == 0) return;
  int dev = param.device().index;
  set_device(dev);
  dispatch_floating("optimizer update", param.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    adam_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(
        param.data<T>(), exp_avg.data<T>(), exp_avg_sq.data<T>(), grad.data<T>(), n, nn::AdamCoefficients<T>(u),
        u.replay_scalars);
  });
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
