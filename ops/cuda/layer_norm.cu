// CUDA kernels of layer_norm. Every reduction runs in double in a fixed order, so results
// are the same bits on every run; there are no atomics.
//
// forward : one warp per row (D <= 1024) or one block per row (longer rows); two passes
//           over the row (mean, then the squared deviations from it), then the output.
// backward: dx: the same row mapping; the row's sum(g) and sum(g * xhat), then dx.
//           dweight, dbias: rows cut into S slices; thread (d, s) sums column d over slice s
//           (coalesced across d) into a double partial; then one thread per column adds the S
//           partials in slice order.
// The formulas are those of the CPU reference (ops/cpu/layer_norm.cpp).
#include <algorithm>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/layer_norm.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int64_t kWarpRowMax = 1024;     // longer rows get a whole block
constexpr int64_t kMaxBlocks = 132 * 32;  // a few waves of every SM; rows loop past it
constexpr int64_t kMaxSlices = 512;       // row slices of the dweight/dbias partials
constexpr int64_t kMaxPartials = int64_t(1) << 24;  // bounds the partials' scratch (S * D)

// Sum of v over the threads that share a row: the warp, or (kBlock) the whole block. The xor
// butterfly leaves the same bits in every lane (each step adds the same two numbers), and
// the warps' totals are added in warp order, so every thread gets the same, repeatable sum.
template <bool kBlock>
__device__ double row_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if constexpr (!kBlock) {
    return v;
  } else {
    __shared__ double partial[32];
    __syncthreads();  // the previous call's readers are done with `partial`
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) t += partial[w];
    return t;
  }
}

// The row this thread starts with, how many rows the grid covers per step, and the thread's
// place inside its row.
template <bool kBlock>
struct RowMap {
  int64_t first, step;
  int lane, lanes;
  __device__ RowMap() {
    if constexpr (kBlock) {
      first = blockIdx.x;
      step = gridDim.x;
      lane = threadIdx.x;
      lanes = blockDim.x;
    } else {
      first = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
      step = int64_t(gridDim.x) * (blockDim.x >> 5);
      lane = threadIdx.x & 31;
      lanes = 32;
    }
  }
};

template <class T, bool kBlock>
__global__ void forward_kernel(T* __restrict__ y, T* __restrict__ mean, T* __restrict__ rstd,
                               const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                               int64_t M, int64_t D, double eps) {
  const RowMap<kBlock> m;
  for (int64_t r = m.first; r < M; r += m.step) {
    const T* xr = x + r * D;  // (D)
    double s = 0;
    for (int64_t i = m.lane; i < D; i += m.lanes) s += double(xr[i]);
    const double mu = row_sum<kBlock>(s) / double(D);
    double ss = 0;
    for (int64_t i = m.lane; i < D; i += m.lanes) {
      const double d = double(xr[i]) - mu;
      ss += d * d;
    }
    const double rs = 1.0 / sqrt(row_sum<kBlock>(ss) / double(D) + eps);
    if (m.lane == 0) {
      mean[r] = static_cast<T>(mu);
      rstd[r] = static_cast<T>(rs);
    }
    T* yr = y + r * D;  // (D)
    for (int64_t i = m.lane; i < D; i += m.lanes)
      yr[i] = static_cast<T>((double(xr[i]) - mu) * rs * (weight ? double(weight[i]) : 1.0) +
                             (bias ? double(bias[i]) : 0.0));
  }
}

template <class T, bool kBlock>
__global__ void backward_dx_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                                   const T* __restrict__ weight, const T* __restrict__ mean,
                                   const T* __restrict__ rstd, int64_t M, int64_t D) {
  const RowMap<kBlock> m;
  for (int64_t r = m.first; r < M; r += m.step) {
    const T* xr = x + r * D;    // (D)
    const T* dyr = dy + r * D;  // (D)
    const double mu = mean[r], rs = rstd[r];
    double sg = 0, sgx = 0;
    for (int64_t i = m.lane; i < D; i += m.lanes) {
      const double g = double(dyr[i]) * (weight ? double(weight[i]) : 1.0);
      sg += g;
      sgx += g * (double(xr[i]) - mu) * rs;
    }
    const double a = row_sum<kBlock>(sg) / double(D);
    const double b = row_sum<kBlock>(sgx) / double(D);
    T* dxr = dx + r * D;  // (D)
    for (int64_t i = m.lane; i < D; i += m.lanes) {
      const double g = double(dyr[i]) * (weight ? double(weight[i]) : 1.0);
      dxr[i] = static_cast<T>(rs * (g - a - (double(xr[i]) - mu) * rs * b));
    }
  }
}

// Thread (d, s): column d summed over rows [s * chunk, (s + 1) * chunk), in row order.
template <class T>
__global__ void param_partials_kernel(double* __restrict__ pw, double* __restrict__ pb, const T* __restrict__ dy,
                                      const T* __restrict__ x, const T* __restrict__ mean,
                                      const T* __restrict__ rstd, int64_t M, int64_t D, int64_t chunk) {
  const int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (d >= D) return;
  const int64_t s = blockIdx.y;
  const int64_t r0 = s * chunk, r1 = min(M, r0 + chunk);
  double aw = 0, ab = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const double g = dy[r * D + d];
    aw += g * (double(x[r * D + d]) - double(mean[r])) * double(rstd[r]);
    ab += g;
  }
  if (pw) pw[s * D + d] = aw;
  if (pb) pb[s * D + d] = ab;
}

// dweight[d], dbias[d] = the S partials of column d added in slice order.
template <class T>
__global__ void param_reduce_kernel(T* __restrict__ dweight, T* __restrict__ dbias, const double* __restrict__ pw,
                                    const double* __restrict__ pb, int64_t D, int64_t S) {
  TG_GRID_STRIDE(d, D) {
    double aw = 0, ab = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (dweight) aw += pw[s * D + d];
      if (dbias) ab += pb[s * D + d];
    }
    if (dweight) dweight[d] = static_cast<T>(aw);
    if (dbias) dbias[d] = static_cast<T>(ab);
  }
}

template <class T>
const T* optional_data(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* optional_out(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

unsigned row_blocks(int64_t M, bool block_per_row) {
  const int64_t want = block_per_row ? M : (M + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(want, kMaxBlocks)));
}

}  // namespace

void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, const LayerNormProblem& p) {
  check_layer_norm_forward_buffers(y, mean, rstd, x, weight, bias, p);
  if (p.M == 0) return;
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const bool block_rows = p.D > kWarpRowMax;
  dispatch_floating("layer_norm", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    auto kernel = block_rows ? forward_kernel<T, true> : forward_kernel<T, false>;
    kernel<<<row_blocks(p.M, block_rows), kThreads, 0, st>>>(y.data<T>(), mean.data<T>(), rstd.data<T>(),
                                                               x.data<T>(), optional_data<T>(weight),
                                                               optional_data<T>(bias), p.M, p.D, p.eps);
  });
  TG_LAUNCH_CHECK();
}

void layer_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                         const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         const LayerNormProblem& p) {
  check_layer_norm_backward_buffers(dx, dweight, dbias, dy, x, weight, mean, rstd, p);
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const bool block_rows = p.D > kWarpRowMax;
  dispatch_floating("layer_norm_backward", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    if (dx.defined() && p.M > 0) {
      auto kernel = block_rows ? backward_dx_kernel<T, true> : backward_dx_kernel<T, false>;
      kernel<<<row_blocks(p.M, block_rows), kThreads, 0, st>>>(dx.data<T>(), dy.data<T>(), x.data<T>(),
                                                                 optional_data<T>(weight), mean.data<T>(),
                                                                 rstd.data<T>(), p.M, p.D);
      TG_LAUNCH_CHECK();
    }
    if (!dweight.defined() && !dbias.defined()) return;
    // The slice count depends on the problem only (not on the GPU), so the order of the sums,
    // and the bits of the result, are the same everywhere.
    int64_t S = std::min(kMaxSlices, (p.M + 15) / 16);
    S = std::min(S, std::max<int64_t>(1, kMaxPartials / p.D));
    const int64_t chunk = S > 0 ? (p.M + S - 1) / S : 0;
    if (chunk > 0) S = (p.M + chunk - 1) / chunk;
    Tensor scratch;
    double *pw = nullptr, *pb = nullptr;
    if (S > 0) {
      scratch = Tensor::empty({2, S, p.D}, {.dtype = DType::f64, .device = x.device()});
      pw = dweight.defined() ? scratch.data<double>() : nullptr;
      pb = dbias.defined() ? scratch.data<double>() + S * p.D : nullptr;
      const dim3 grid(static_cast<unsigned>((p.D + kThreads - 1) / kThreads), static_cast<unsigned>(S));
      param_partials_kernel<T><<<grid, kThreads, 0, st>>>(pw, pb, dy.data<T>(), x.data<T>(), mean.data<T>(),
                                                          rstd.data<T>(), p.M, p.D, chunk);
      TG_LAUNCH_CHECK();
    }
    // With no rows (S = 0) this writes zeros, the sum of nothing.
    param_reduce_kernel<T><<<grid_for(p.D, kThreads), kThreads, 0, st>>>(optional_out<T>(dweight),
                                                                         optional_out<T>(dbias), pw, pb, p.D, S);
    TG_LAUNCH_CHECK();
  });
}

}  // namespace tg::cuda
