// CUDA kernels of the pooling family (ops/pool.h). Forward: a thread per output element
// walks its window (pool_window, shared with the CPU reference). Backward: a thread per
// input element gathers from the outputs whose windows span it (pool_inverse_window; max
// pooling takes those whose saved argmax is this element, average pooling has no dilation
// so every window spanning it holds it), so no atomics: the result is deterministic, and
// the outputs are visited in the CPU's scatter order with the same double accumulation.
// 64-bit indices throughout.
#include <cmath>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/shape_pool_kernels.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

// The planes' sizes, computed on the host (PoolProblem's helpers are host functions).
struct Planes {
  int64_t count, in, out;
};

template <class T>
__global__ void pool_forward_kernel(T* __restrict__ out, int64_t* __restrict__ indices, const T* __restrict__ x,
                                    PoolProblem p, Planes pl) {
  const int64_t H = p.in[1], W = p.in[2];
  TG_GRID_STRIDE(i, pl.count * pl.out) {
    const int64_t ow = i % p.out[2];
    int64_t t = i / p.out[2];
    const int64_t oh = t % p.out[1];
    t /= p.out[1];
    const int64_t od = t % p.out[0];
    const int64_t nc = t / p.out[0];
    const PoolWindow wd = pool_window(p, 0, od), wh = pool_window(p, 1, oh), ww = pool_window(p, 2, ow);
    const T* xp = x + nc * pl.in;  // (D, H, W)
    if (p.kind == PoolKind::max) {
      // PyTorch's rule, as the CPU: first real element with -inf, strictly greater or NaN.
      int64_t best_i = (wd.begin * H + wh.begin) * W + ww.begin;
      double best = -INFINITY;
      for (int64_t d = wd.begin; d < wd.end; d += wd.step)
        for (int64_t h = wh.begin; h < wh.end; h += wh.step)
          for (int64_t w = ww.begin; w < ww.end; w += ww.step) {
            const int64_t j = (d * H + h) * W + w;
            const double v = xp[j];
            if (v > best || isnan(v)) {
              best = v;
              best_i = j;
            }
          }
      out[i] = static_cast<T>(best);
      indices[i] = best_i;
    } else {
      double s = 0;
      for (int64_t d = wd.begin; d < wd.end; d += wd.step)
        for (int64_t h = wh.begin; h < wh.end; h += wh.step)
          for (int64_t w = ww.begin; w < ww.end; w += ww.step) s += xp[(d * H + h) * W + w];
      out[i] = static_cast<T>(s / double(wd.divisor * wh.divisor * ww.divisor));
    }
  }
}

template <class T>
__global__ void pool_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, const int64_t* __restrict__ indices,
                                     PoolProblem p, Planes pl) {
  TG_GRID_STRIDE(i, pl.count * pl.in) {
    const int64_t w = i % p.in[2];
    int64_t t = i / p.in[2];
    const int64_t h = t % p.in[1];
    t /= p.in[1];
    const int64_t d = t % p.in[0];
    const int64_t nc = t / p.in[0];
    const int64_t j = i - nc * pl.in;  // the flat position in the plane, as indices hold it
    int64_t d0, d1, h0, h1, w0, w1;
    pool_inverse_window(p, 0, d, d0, d1);
    pool_inverse_window(p, 1, h, h0, h1);
    pool_inverse_window(p, 2, w, w0, w1);
    const T* gp = dy + nc * pl.out;  // (oD, oH, oW)
    double acc = 0;
    for (int64_t od = d0; od < d1; ++od)
      for (int64_t oh = h0; oh < h1; ++oh)
        for (int64_t ow = w0; ow < w1; ++ow) {
          const int64_t o = (od * p.out[1] + oh) * p.out[2] + ow;
          if (p.kind == PoolKind::max) {
            if (indices[nc * pl.out + o] == j) acc += gp[o];
          } else {
            const int64_t div =
                pool_window(p, 0, od).divisor * pool_window(p, 1, oh).divisor * pool_window(p, 2, ow).divisor;
            acc += double(gp[o]) / double(div);
          }
        }
    dx[i] = static_cast<T>(acc);
  }
}

Planes planes_of(const PoolProblem& p) { return {p.N * p.C, p.in_plane(), p.out_plane()}; }

}  // namespace

void pool_forward(const Tensor& out, const Tensor& indices, const Tensor& x, const PoolProblem& p) {
  check_pool_forward_buffers(out, indices, x, p);
  const Planes pl = planes_of(p);
  const int64_t n = pl.count * pl.out;
  if (n == 0) return;
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  int64_t* idx = p.kind == PoolKind::max ? indices.data<int64_t>() : nullptr;
  dispatch_floating("pool_forward", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    pool_forward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(out.data<T>(), idx, x.data<T>(), p, pl);
  });
  TG_LAUNCH_CHECK();
}

void pool_backward(const Tensor& dx, const Tensor& dy, const Tensor& indices, const PoolProblem& p) {
  check_pool_backward_buffers(dx, dy, indices, p);
  const Planes pl = planes_of(p);
  const int64_t n = pl.count * pl.in;
  if (n == 0) return;
  const int dev = dy.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const int64_t* idx = p.kind == PoolKind::max ? indices.data<int64_t>() : nullptr;
  dispatch_floating("pool_backward", dy.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    pool_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(dx.data<T>(), dy.data<T>(), idx, p, pl);
  });
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
