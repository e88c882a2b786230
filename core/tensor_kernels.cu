#include "core/cuda_context.h"
#include "core/cuda_graph.h"
#include "core/dtype_dispatch.h"
#include "core/tensor_kernels.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void fill_kernel(T* out, int64_t n, T value) {
  TG_GRID_STRIDE(i, n)
    out[i] = value;
}

template <class T>
__global__ void uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, double low, double high) {
  TG_GRID_STRIDE(i, n)
    out[i] = static_cast<T>(low + (high - low) * uniform_at(seed, offset + i));
}

template <class T>
__global__ void normal_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, double mean, double stddev) {
  TG_GRID_STRIDE(i, n)
    out[i] = static_cast<T>(mean + stddev * normal_at(seed, offset + i));
}

template <class T>
__global__ void add_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  TG_GRID_STRIDE(i, n)
    out[i] = a[i] + b[i];
}

template <class S, class D>
__global__ void cast_kernel(const S* in, D* out, int64_t n) {
  TG_GRID_STRIDE(i, n)
    out[i] = static_cast<D>(in[i]);
}

}  // namespace

void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  set_device(dev);
  dispatch_any(out.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    add_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(out.data<T>(), a.data<T>(), b.data<T>(), n);
  });
  TG_LAUNCH_CHECK();
}

void fill(const Tensor& t, double value) {
  int64_t n = t.numel();
  if (n == 0) return;
  set_device(t.device().index);
  dispatch_any(t.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    fill_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(t.device().index)>>>(
        t.data<T>(), n, static_cast<T>(value));
  });
  TG_LAUNCH_CHECK();
}

void fill_uniform(const Tensor& t, RandomDraw draw, double low, double high) {
  int64_t n = t.numel();
  if (n == 0) return;
  set_device(t.device().index);
  dispatch_any(t.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    uniform_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(t.device().index)>>>(
        t.data<T>(), n, draw.seed, draw.offset, low, high);
  });
  TG_LAUNCH_CHECK();
}

void fill_normal(const Tensor& t, RandomDraw draw, double mean, double stddev) {
  int64_t n = t.numel();
  if (n == 0) return;
  set_device(t.device().index);
  dispatch_any(t.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    normal_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(t.device().index)>>>(
        t.data<T>(), n, draw.seed, draw.offset, mean, stddev);
  });
  TG_LAUNCH_CHECK();
}

void cast(const Tensor& out, const Tensor& x) {
  int64_t n = x.numel();
  if (n == 0) return;
  set_device(x.device().index);
  dispatch_any(x.dtype(), [&](auto* stag) {
    using S = TG_ELEMENT_TYPE(stag);
    dispatch_any(out.dtype(), [&](auto* dtag) {
      using D = TG_ELEMENT_TYPE(dtag);
      cast_kernel<S, D><<<grid_for(n, kThreads), kThreads, 0, stream(x.device().index)>>>(
          x.data<S>(), out.data<D>(), n);
    });
  });
  TG_LAUNCH_CHECK();
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cuda() && src_device.is_cuda()) {
    set_device(src_device.index);
    if (dst_device.index != src_device.index) {
      fail_if_capturing("copy between GPUs", src_device.index, "the host waits for both devices");
      // Order after pending work on both devices, then copy peer to peer.
      TG_CUDA_CHECK(cudaStreamSynchronize(stream(dst_device.index)));
      TG_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes,
                                        stream(src_device.index)));
      TG_CUDA_CHECK(cudaStreamSynchronize(stream(src_device.index)));
    } else {
      TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(src_device.index)));
    }
    return;
  }
  int dev = dst_device.is_cuda() ? dst_device.index : src_device.index;
  fail_if_capturing(dst_device.is_cuda() ? "copy from the host" : "copy to the host", dev,
                    "the host waits for the copy");
  set_device(dev);
  cudaMemcpyKind kind = dst_device.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream(dev)));
  // The host buffer may be freed or read as soon as we return.
  TG_CUDA_CHECK(cudaStreamSynchronize(stream(dev)));
}

}  // namespace tg::cuda
