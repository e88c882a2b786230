// CPU reference of the pooling family (ops/pool.h): one loop nest over the (D, H, W) output
// of each (n, c) plane, the windows from pool_window. Averages are summed in double. The
// backward scatters each output's gradient into its window (the CUDA kernels gather
// instead), so the two backends reach the same values by different routes. Threads split
// the (n, c) planes, forward and backward (a plane's scatter stays on one thread).
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/shape_pool_kernels.h"

namespace tg::cpu {

namespace {

// Calls f(o, wd, wh, ww) for every output position o (flat in the plane) and its windows.
template <class F>
void for_each_window(const PoolProblem& p, F&& f) {
  int64_t o = 0;
  for (int64_t od = 0; od < p.out[0]; ++od) {
    const PoolWindow wd = pool_window(p, 0, od);
    for (int64_t oh = 0; oh < p.out[1]; ++oh) {
      const PoolWindow wh = pool_window(p, 1, oh);
      for (int64_t ow = 0; ow < p.out[2]; ++ow, ++o) f(o, wd, wh, pool_window(p, 2, ow));
    }
  }
}

// The work of one (n, c) plane, for the thread split only: the input plane plus each output's
// kernel volume of taps, in double and capped, since the kernel volume alone can overflow.
int64_t plane_cost(const PoolProblem& p) {
  const double taps = static_cast<double>(p.in_plane()) + static_cast<double>(p.out_plane()) *
                                                              static_cast<double>(p.kernel[0]) *
                                                              static_cast<double>(p.kernel[1]) *
                                                              static_cast<double>(p.kernel[2]);
  return taps < 0x1p62 ? static_cast<int64_t>(taps) : int64_t(1) << 62;
}

}  // namespace

void pool_forward(const Tensor& out, const Tensor& indices, const Tensor& x, const PoolProblem& p) {
  check_pool_forward_buffers(out, indices, x, p);
  const int64_t planes = p.N * p.C, in_plane = p.in_plane(), out_plane = p.out_plane();
  const int64_t H = p.in[1], W = p.in[2];
  dispatch_floating("pool_forward", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    int64_t* idx = p.kind == PoolKind::max ? indices.data<int64_t>() : nullptr;
    const T* px = x.data<T>();
    T* py = out.data<T>();
    parallel_for(planes, plane_cost(p), [&](int64_t nc) {
      const T* xp = px + nc * in_plane;  // (D, H, W)
      T* yp = py + nc * out_plane;       // (oD, oH, oW)
      for_each_window(p, [&](int64_t o, const PoolWindow& wd, const PoolWindow& wh, const PoolWindow& ww) {
        if (p.kind == PoolKind::max) {
          // PyTorch's rule: start at the window's first real element with -inf, take a
          // strictly greater value (ties keep the first) or any NaN.
          int64_t best_i = (wd.begin * H + wh.begin) * W + ww.begin;
          double best = -std::numeric_limits<double>::infinity();
          for (int64_t d = wd.begin; d < wd.end; d += wd.step)
            for (int64_t h = wh.begin; h < wh.end; h += wh.step)
              for (int64_t w = ww.begin; w < ww.end; w += ww.step) {
                const int64_t i = (d * H + h) * W + w;
                const double v = xp[i];
                if (v > best || std::isnan(v)) {
                  best = v;
                  best_i = i;
                }
              }
          yp[o] = static_cast<T>(best);
          idx[nc * out_plane + o] = best_i;
        } else {
          double s = 0;
          for (int64_t d = wd.begin; d < wd.end; d += wd.step)
            for (int64_t h = wh.begin; h < wh.end; h += wh.step)
              for (int64_t w = ww.begin; w < ww.end; w += ww.step) s += xp[(d * H + h) * W + w];
          yp[o] = static_cast<T>(s / pool_divisor(wd, wh, ww));
        }
      });
    });
  });
}

void pool_backward(const Tensor& dx, const Tensor& dy, const Tensor& indices, const PoolProblem& p) {
  check_pool_backward_buffers(dx, dy, indices, p);
  const int64_t planes = p.N * p.C, in_plane = p.in_plane(), out_plane = p.out_plane();
  const int64_t H = p.in[1], W = p.in[2];
  dispatch_floating("pool_backward", dy.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const int64_t* idx = p.kind == PoolKind::max ? indices.data<int64_t>() : nullptr;
    // Indices are checked before the threads start: an exception cannot leave them.
    if (idx)
      for (int64_t e = 0; e < planes * out_plane; ++e)
        TG_CHECK_AS(ShapeError, idx[e] >= 0 && idx[e] < in_plane, "max_pool_backward: index ", idx[e],
                    " is outside the input plane of ", in_plane, " elements");
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_ranges(planes, plane_cost(p), [&](int64_t nc0, int64_t nc1) {
      std::vector<double> acc(static_cast<size_t>(in_plane));  // this thread's
      for (int64_t nc = nc0; nc < nc1; ++nc) {
        const T* gp = pdy + nc * out_plane;  // (oD, oH, oW)
        T* dxp = pdx + nc * in_plane;        // (D, H, W)
        std::fill(acc.begin(), acc.end(), 0.0);
        for_each_window(p, [&](int64_t o, const PoolWindow& wd, const PoolWindow& wh, const PoolWindow& ww) {
          if (p.kind == PoolKind::max) {
            acc[static_cast<size_t>(idx[nc * out_plane + o])] += gp[o];
            return;
          }
          const double g = double(gp[o]) / pool_divisor(wd, wh, ww);
          for (int64_t d = wd.begin; d < wd.end; d += wd.step)
            for (int64_t h = wh.begin; h < wh.end; h += wh.step)
              for (int64_t w = ww.begin; w < ww.end; w += ww.step)
                acc[static_cast<size_t>((d * H + h) * W + w)] += g;
        });
        for (int64_t i = 0; i < in_plane; ++i) dxp[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
      }
    });
  });
}

}  // namespace tg::cpu
