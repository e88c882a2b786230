// CUDA kernels of group_norm. Every reduction runs in double with a fixed order (warp
// shuffle tree, then warps in index order), so results are deterministic run to run.
//
// forward : one block per (n, g): sum and sum of squares in one read of the (contiguous)
//           group, then the normalize pass over the same group, which is still in L2. With
//           fewer groups than SMs, each group is cut into ranges: the ranges' sums, then a
//           block per range adds them (fixed order) and normalizes its range.
// backward: (1) one block per (n, c): db = sum_hw dy, ds = sum_hw dy (x - mean)
//           (2) per channel: dgamma = sum_n rstd ds, dbeta = sum_n db (32 rows of threads over n)
//           (3) one block per (n, g), or per range of it when groups are few: the group's two
//               coefficients from (1), then dx.
//           Where dx is wanted, the groups fill the GPU and a group's x and dy fit in shared
//           memory (the usual case in a CNN), (1) and (3) are one kernel per (n, g): x and dy
//           are read from memory once, not twice, and every warp sums a range of a channel.
// With the ReLU (p.relu) the forward clamps y at 0 as the relu op does, and the backward reads
// dy only where y > 0 (masked_grad): one op, the ReLU's own passes over the activation gone.
// The formulas are those of the CPU reference (ops/cpu/norm.cpp); the element-level pieces
// (block sums, statistics, the ReLU mask, the dx formula) are in group_norm_elements.cuh.
// Under Autocast x (and so dx) may be bf16 or f16 while y, dy, the parameters and the
// statistics are f32: the kernels are instantiated per x storage (load_x / store_x).
#include <algorithm>
#include <type_traits>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/group_norm_elements.cuh"
#include "ops/cuda/norm.h"

namespace tg::cuda {
namespace {

using namespace group_norm_detail;

constexpr int kMaxThreads = 256;

// Block size for a loop over n elements: a multiple of 32, at most kMaxThreads.
int threads_for(int64_t n) {
  int64_t t = (n + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : t > kMaxThreads ? kMaxThreads : t);
}

// y over elements [lo, hi) of group ng (D channels of HW, contiguous): x normalized with
// (mu, rs), then gamma and beta per channel, then the group's residual rg (or null) added, then
// the ReLU where `relu`.
template <class T, class X>
__device__ void normalize_range(T* __restrict__ yg, const X* __restrict__ xg, const T* __restrict__ gamma,
                                const T* __restrict__ beta, const T* __restrict__ rg, int64_t g, int64_t D,
                                int64_t HW, int64_t lo, int64_t hi, double mu, double rs, bool relu) {
  const T mu_t = static_cast<T>(mu);
  if (HW >= 32) {  // per channel: no division per element
    for (int64_t d = lo / HW; d < D && d * HW < hi; ++d) {
      const int64_t c = g * D + d;
      const T scale = static_cast<T>(rs * (gamma ? double(gamma[c]) : 1.0));
      const T shift = beta ? beta[c] : T(0);
      const int64_t end = min((d + 1) * HW, hi);
      for (int64_t i = max(d * HW, lo) + threadIdx.x; i < end; i += blockDim.x) {
        T v = (T(load_x(xg, i)) - mu_t) * scale + shift;
        if (rg) v = v + rg[i];  // rounded first, as the separate add would get it
        yg[i] = relu_if(relu, v);
      }
    }
  } else {  // tiny spatial extent: walk the range flat
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const int64_t c = g * D + i / HW;
      const T scale = static_cast<T>(rs * (gamma ? double(gamma[c]) : 1.0));
      T v = (T(load_x(xg, i)) - mu_t) * scale + (beta ? beta[c] : T(0));
      if (rg) v = v + rg[i];
      yg[i] = relu_if(relu, v);
    }
  }
}

// One block per (n, g) when there are enough groups to fill the GPU: the sums in one read of
// the (contiguous) group, then the normalize pass over the same group, still in L2.
template <class T, class X>
__global__ void forward_kernel(T* __restrict__ y, T* __restrict__ mean, T* __restrict__ rstd,
                               const X* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                               const T* __restrict__ residual, int64_t G, int64_t D, int64_t HW, double eps,
                               bool relu) {
  const int64_t ng = blockIdx.x, M = D * HW;
  const X* xg = x + ng * M;
  double s = 0, ss = 0;
  for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
    const double v = load_x(xg, i);
    s += v;
    ss += v * v;
  }
  block_sum2(s, ss);
  double mu, rs;
  group_stats(s, ss, M, eps, mu, rs);
  if (threadIdx.x == 0) {
    mean[ng] = static_cast<T>(mu);
    rstd[ng] = static_cast<T>(rs);
  }
  normalize_range(y + ng * M, xg, gamma, beta, residual ? residual + ng * M : nullptr, ng % G, D, HW, 0, M, mu, rs,
                  relu);
}

// Few groups (fewer than the SMs): each group is cut into `slices` ranges, one block each.
// (a) the sums of each range ...
template <class X>
__global__ void slice_sums_kernel(double2* __restrict__ partial, const X* __restrict__ x, int64_t M,
                                  int64_t slice_len) {
  const int64_t ng = blockIdx.x, slice = blockIdx.y;
  const X* xg = x + ng * M;
  const int64_t lo = slice * slice_len, hi = min(M, lo + slice_len);
  double s = 0, ss = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const double v = load_x(xg, i);
    s += v;
    ss += v * v;
  }
  block_sum2(s, ss);
  if (threadIdx.x == 0) partial[ng * gridDim.y + slice] = make_double2(s, ss);
}

// (b) ... then every block adds its group's partial sums in slice order (the same order in
// every block: one result) and normalizes its range.
template <class T, class X>
__global__ void slice_normalize_kernel(T* __restrict__ y, T* __restrict__ mean, T* __restrict__ rstd,
                                       const X* __restrict__ x, const T* __restrict__ gamma,
                                       const T* __restrict__ beta, const T* __restrict__ residual,
                                       const double2* __restrict__ partial, int64_t G, int64_t D, int64_t HW,
                                       int64_t slice_len, double eps, bool relu) {
  const int64_t ng = blockIdx.x, slice = blockIdx.y, M = D * HW;
  double s = 0, ss = 0;
  for (unsigned k = 0; k < gridDim.y; ++k) {
    s += partial[ng * gridDim.y + k].x;
    ss += partial[ng * gridDim.y + k].y;
  }
  double mu, rs;
  group_stats(s, ss, M, eps, mu, rs);
  if (slice == 0 && threadIdx.x == 0) {
    mean[ng] = static_cast<T>(mu);
    rstd[ng] = static_cast<T>(rs);
  }
  const int64_t lo = slice * slice_len, hi = min(M, lo + slice_len);
  normalize_range(y + ng * M, x + ng * M, gamma, beta, residual ? residual + ng * M : nullptr, ng % G, D, HW, lo,
                  hi, mu, rs, relu);
}

// (1) per (n, c): db = sum_hw dy, ds = sum_hw dy (x - mean)
template <class T, class X>
__global__ void channel_sums_kernel(double* __restrict__ db, double* __restrict__ ds, const T* __restrict__ dy,
                                    const T* __restrict__ y, const X* __restrict__ x, const T* __restrict__ mean,
                                    int64_t C, int64_t G, int64_t D, int64_t HW) {
  const int64_t nc = blockIdx.x, n = nc / C, c = nc % C;
  const double mu = mean[n * G + c / D];
  const X* xc = x + nc * HW;
  const T* dyc = dy + nc * HW;
  const T* yc = y ? y + nc * HW : nullptr;
  double b = 0, s = 0;
  for (int64_t i = threadIdx.x; i < HW; i += blockDim.x) {
    const double g = masked_grad(yc, dyc, i);
    b += g;
    s += g * (double(load_x(xc, i)) - mu);
  }
  block_sum2(b, s);
  if (threadIdx.x == 0) {
    db[nc] = b;
    ds[nc] = s;
  }
}

// (2) per channel, summing over n: a block takes 32 channels (threadIdx.x: coalesced reads of the
// (N, C) sums) and 32 rows of threads (threadIdx.y), row r summing n = r, r + 32, ... in order;
// then the rows' sums are added in row order (a fixed order: deterministic). One thread per
// channel walking all N would wait out a load latency per image (N = 128: most of the pass).
constexpr int kParamChannels = 32, kParamRows = 32;
template <class T>
__global__ void __launch_bounds__(kParamChannels * kParamRows)
    param_grads_kernel(T* __restrict__ dgamma, T* __restrict__ dbeta, const double* __restrict__ db,
                       const double* __restrict__ ds, const T* __restrict__ rstd, int64_t N, int64_t C, int64_t G,
                       int64_t D) {
  __shared__ double row_g[kParamRows][kParamChannels], row_b[kParamRows][kParamChannels];
  const int64_t c = blockIdx.x * int64_t(kParamChannels) + threadIdx.x;
  double gs = 0, bs = 0;
  if (c < C) {
    const int64_t g = c / D;
    for (int64_t n = threadIdx.y; n < N; n += kParamRows) {
      gs += double(rstd[n * G + g]) * ds[n * C + c];
      bs += db[n * C + c];
    }
  }
  row_g[threadIdx.y][threadIdx.x] = gs;
  row_b[threadIdx.y][threadIdx.x] = bs;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  gs = 0;
  bs = 0;
  for (int r = 0; r < kParamRows; ++r) {
    gs += row_g[r][threadIdx.x];
    bs += row_b[r][threadIdx.x];
  }
  if (dgamma) dgamma[c] = static_cast<T>(gs);
  if (dbeta) dbeta[c] = static_cast<T>(bs);
}

// (3) per (n, g): dx = rstd (g_c dy - A - xhat B), A = sum(g_c dy)/M, B = sum(g_c dy xhat)/M.
// Block (ng, slice) writes elements [slice * slice_len, ...) of the group (every block of a
// group computes A and B alike).
template <class T, class X>
__global__ void dx_kernel(X* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ y,
                          const X* __restrict__ x,
                          const T* __restrict__ gamma, const T* __restrict__ mean, const T* __restrict__ rstd,
                          const double* __restrict__ db, const double* __restrict__ ds,
                          int64_t C, int64_t G, int64_t D, int64_t HW, int64_t slice_len) {
  const int64_t ng = blockIdx.x, n = ng / G, g = ng % G, M = D * HW;
  const int64_t lo = blockIdx.y * slice_len, hi = min(M, lo + slice_len);
  const double mu = mean[ng], rs = rstd[ng];
  double sum_g = 0, sum_gx = 0;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const int64_t c = g * D + d;
    const double gc = gamma ? double(gamma[c]) : 1.0;
    sum_g += gc * db[n * C + c];
    sum_gx += gc * ds[n * C + c];
  }
  block_sum2(sum_g, sum_gx);
  const double A = sum_g / double(M), B = rs * sum_gx / double(M);
  // dx_value's operands, rounded to T once.
  const T A_t = static_cast<T>(A), B_t = static_cast<T>(B), rs_t = static_cast<T>(rs), mu_t = static_cast<T>(mu);
  const X* xg = x + ng * M;  // (D, HW)
  const T* dyg = dy + ng * M;
  const T* yg = y ? y + ng * M : nullptr;
  X* dxg = dx + ng * M;
  if (HW >= 32) {
    for (int64_t d = lo / HW; d < D && d * HW < hi; ++d) {
      const T gc = gamma ? gamma[g * D + d] : T(1);
      const int64_t end = min((d + 1) * HW, hi);
      for (int64_t i = max(d * HW, lo) + threadIdx.x; i < end; i += blockDim.x)
        store_x(dxg, i, dx_value(rs_t, A_t, B_t, mu_t, gc, masked_grad(yg, dyg, i), T(load_x(xg, i))));
    }
  } else {
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const T gc = gamma ? gamma[g * D + i / HW] : T(1);
      store_x(dxg, i, dx_value(rs_t, A_t, B_t, mu_t, gc, masked_grad(yg, dyg, i), T(load_x(xg, i))));
    }
  }
}

// (1) and (3) in one block per (n, g), the group's dy and x staged in shared memory (M
// elements each, then the sums in doubles): the per-channel sums (written out for (2)), the group's
// coefficients from them in channel order by every thread, then dx. With fewer channels than
// warps (a CNN's GroupNorm has 2-16 channels per group) each channel's pixels are cut into
// `parts` ranges, one warp each, so that every warp sums; the ranges' sums are then added in
// range order (deterministic).
constexpr int64_t kFusedMaxElements = 8192;  // f32 x and dy of a group: 64 KB
constexpr int64_t kFusedMaxBytes = 96 * 1024;  // x, dy and the sums: two blocks fit an SM
constexpr int kFusedThreads = 256, kFusedWarps = kFusedThreads / 32;

__host__ __device__ inline int64_t fused_parts(int64_t D) { return D < kFusedWarps ? kFusedWarps / D : 1; }

// Bytes of the staged dy and x, rounded up to whole doubles (the sums follow them).
template <class T, class X>
__host__ __device__ inline int64_t fused_staged_bytes(int64_t M) {
  return (M * int64_t(sizeof(T) + sizeof(X)) + 7) / 8 * 8;
}

template <class T, class X>
int64_t fused_smem_bytes(int64_t M, int64_t D) {
  // dy, x; the channel sums (2 D); the ranges' sums (2 D parts).
  return fused_staged_bytes<T, X>(M) + 2 * (D + D * fused_parts(D)) * int64_t(sizeof(double));
}

template <class T, class X>
__global__ void __launch_bounds__(kFusedThreads) fused_backward_kernel(
    X* __restrict__ dx, double* __restrict__ db, double* __restrict__ ds, const T* __restrict__ dy,
    const T* __restrict__ y, const X* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ mean,
    const T* __restrict__ rstd, int64_t C, int64_t G, int64_t D, int64_t HW) {
  extern __shared__ double fused_smem[];  // double: aligned for every part
  const int64_t ng = blockIdx.x, n = ng / G, g = ng % G, M = D * HW;
  T* sdy = reinterpret_cast<T*>(fused_smem);  // first: T's alignment whatever X's size
  X* sx = reinterpret_cast<X*>(sdy + M);
  double* sums = reinterpret_cast<double*>(reinterpret_cast<char*>(fused_smem) + fused_staged_bytes<T, X>(M));
  const int64_t parts = fused_parts(D), tasks = D * parts;
  double* part_sums = sums + 2 * D;  // (b, s) of task t = d parts + p at 2 t, 2 t + 1
  stage_group(sx, x + ng * M, M);
  stage_group(sdy, dy + ng * M, M);
  __syncthreads();
  if (y) {  // the ReLU's gradient: dy only where the forward's output is positive
    const T* yg = y + ng * M;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x)
      if (!(yg[i] > T(0))) sdy[i] = T(0);
    __syncthreads();
  }
  const double mu = mean[ng], rs = rstd[ng];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t part_len = (HW + parts - 1) / parts;
  for (int64_t t = warp; t < tasks; t += warps) {
    const int64_t d = t / parts, p = t % parts;
    const int64_t lo = d * HW + p * part_len, hi = d * HW + min(HW, (p + 1) * part_len);
    double b = 0, s = 0;
    for (int64_t i = lo + lane; i < hi; i += 32) {
      const double gy = sdy[i];
      b += gy;
      s += gy * (double(load_x(sx, i)) - mu);
    }
    for (int o = 16; o > 0; o >>= 1) {
      b += __shfl_down_sync(0xffffffffu, b, o);
      s += __shfl_down_sync(0xffffffffu, s, o);
    }
    if (lane == 0) {
      part_sums[2 * t] = b;
      part_sums[2 * t + 1] = s;
    }
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    double b = 0, s = 0;
    for (int64_t p = 0; p < parts; ++p) {
      b += part_sums[2 * (d * parts + p)];
      s += part_sums[2 * (d * parts + p) + 1];
    }
    sums[d] = b;
    sums[D + d] = s;
    db[n * C + g * D + d] = b;
    ds[n * C + g * D + d] = s;
  }
  __syncthreads();
  double sum_g = 0, sum_gx = 0;
  for (int64_t d = 0; d < D; ++d) {
    const double gc = gamma ? double(gamma[g * D + d]) : 1.0;
    sum_g += gc * sums[d];
    sum_gx += gc * sums[D + d];
  }
  const double A = sum_g / double(M), B = rs * sum_gx / double(M);
  const T A_t = static_cast<T>(A), B_t = static_cast<T>(B), rs_t = static_cast<T>(rs), mu_t = static_cast<T>(mu);
  X* dxg = dx + ng * M;
  const int hw = static_cast<int>(HW);  // M <= kFusedMaxElements: 32-bit division
  for (int i = threadIdx.x; i < static_cast<int>(M); i += blockDim.x) {
    const T gc = gamma ? gamma[g * D + i / hw] : T(1);
    store_x(dxg, i, dx_value(rs_t, A_t, B_t, mu_t, gc, sdy[i], T(load_x(sx, i))));
  }
}

template <class T>
const T* data_or_null(const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }
template <class T>
T* mutable_or_null(const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }
// x or dx as X (T, or a half type's bit patterns: the checks have matched X to the dtype).
template <class X>
X* x_data(const Tensor& t) { return static_cast<X*>(t.raw_data()); }

// Calls f(T*, X*), null pointers as type tags: T the type of everything but x and dx (f32 or
// f64), X the storage of x and dx (T, or with a half x, its bits, the values f32).
template <class F>
void dispatch_types(DType x_dtype, F&& f) {
  if (x_dtype == DType::bf16) return f(static_cast<float*>(nullptr), static_cast<Bf16Bits*>(nullptr));
  if (x_dtype == DType::f16) return f(static_cast<float*>(nullptr), static_cast<F16Bits*>(nullptr));
  dispatch_floating("group_norm (CUDA)", x_dtype, [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    f(static_cast<T*>(nullptr), static_cast<T*>(nullptr));
  });
}

// Ranges per group so that the blocks fill the GPU: 1 when there are groups enough, else up
// to one block per SM per group, each range at least kMinSliceElements long.
constexpr int64_t kMinSliceElements = 4096;
int64_t slices_for(int64_t groups, int64_t group_size, int dev) {
  const int64_t sms = sm_count(dev);
  if (groups >= sms) return 1;
  const int64_t want = (2 * sms + groups - 1) / groups;
  const int64_t most = (group_size + kMinSliceElements - 1) / kMinSliceElements;
  return std::max<int64_t>(1, std::min<int64_t>({want, most, 65535}));
}

unsigned blocks_checked(int64_t n, const char* what) {
  TG_CHECK(n <= 0x7fffffff, "group_norm (CUDA): ", n, " ", what, " exceed the grid limit");
  return static_cast<unsigned>(n);
}

}  // namespace

void group_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& gamma, const Tensor& beta, const GroupNormProblem& p,
                        const Tensor& residual) {
  check_group_norm_forward_buffers(y, mean, rstd, x, gamma, beta, p, residual);
  if (p.N == 0) return;
  const int dev = x.device().index;
  set_device(dev);
  const int64_t G = p.groups, D = p.channels_per_group();
  const int64_t M = p.group_size(), slices = slices_for(p.N * G, M, dev);
  const int64_t slice_len = (M + slices - 1) / slices;
  cudaStream_t s = stream(dev);
  dispatch_types(x.dtype(), [&](auto* t_tag, auto* x_tag) {
    using T = std::remove_pointer_t<decltype(t_tag)>;
    using X = std::remove_pointer_t<decltype(x_tag)>;
    if (slices == 1) {
      forward_kernel<T, X><<<blocks_checked(p.N * G, "groups"), threads_for(M), 0, s>>>(
          y.data<T>(), mean.data<T>(), rstd.data<T>(), x_data<const X>(x), data_or_null<T>(gamma), data_or_null<T>(beta),
          data_or_null<T>(residual), G, D, p.HW, p.eps, p.relu);
      TG_LAUNCH_CHECK();
      return;
    }
    Tensor partial = Tensor::empty({p.N * G * slices * 2}, {.dtype = DType::f64, .device = x.device()});
    double2* part = reinterpret_cast<double2*>(partial.data<double>());
    const dim3 grid(blocks_checked(p.N * G, "groups"), static_cast<unsigned>(slices));
    slice_sums_kernel<X><<<grid, threads_for(slice_len), 0, s>>>(part, x_data<const X>(x), M, slice_len);
    TG_LAUNCH_CHECK();
    slice_normalize_kernel<T, X><<<grid, threads_for(slice_len), 0, s>>>(
        y.data<T>(), mean.data<T>(), rstd.data<T>(), x_data<const X>(x), data_or_null<T>(gamma), data_or_null<T>(beta),
        data_or_null<T>(residual), part, G, D, p.HW, slice_len, p.eps, p.relu);
    TG_LAUNCH_CHECK();
  });
}

void group_norm_backward(const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, const Tensor& dy,
                         const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                         const GroupNormProblem& p, const Tensor& y) {
  check_group_norm_backward_buffers(dx, dgamma, dbeta, dy, x, gamma, mean, rstd, p, y);
  if (!dx.defined() && !dgamma.defined() && !dbeta.defined()) return;
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t s = stream(dev);
  const int64_t G = p.groups, D = p.channels_per_group();
  // (2, N*C) doubles from the stream-ordered pool; freed in stream order after the kernels.
  Tensor sums = Tensor::empty({2, p.N * p.C}, {.dtype = DType::f64, .device = x.device()});
  double* db = sums.data<double>();
  double* ds = db + p.N * p.C;
  dispatch_types(x.dtype(), [&](auto* t_tag, auto* x_tag) {
    using T = std::remove_pointer_t<decltype(t_tag)>;
    using X = std::remove_pointer_t<decltype(x_tag)>;
    const int64_t M = p.group_size();
    const T* masked_by = p.relu ? y.data<T>() : nullptr;  // the ReLU's output, or none
    const bool fused = dx.defined() && p.N > 0 && M <= kFusedMaxElements &&
                       fused_smem_bytes<T, X>(M, D) <= kFusedMaxBytes && slices_for(p.N * G, M, dev) == 1;
    if (fused) {
      const int64_t bytes = fused_smem_bytes<T, X>(M, D);
      allow_dynamic_smem(fused_backward_kernel<T, X>, static_cast<int>(bytes));
      fused_backward_kernel<T, X><<<blocks_checked(p.N * G, "groups"), kFusedThreads, static_cast<size_t>(bytes), s>>>(
          x_data<X>(dx), db, ds, dy.data<T>(), masked_by, x_data<const X>(x), data_or_null<T>(gamma), mean.data<T>(),
          rstd.data<T>(), p.C, G, D, p.HW);
      TG_LAUNCH_CHECK();
    } else if (p.N > 0) {
      channel_sums_kernel<T, X><<<blocks_checked(p.N * p.C, "channels"), threads_for(p.HW), 0, s>>>(
          db, ds, dy.data<T>(), masked_by, x_data<const X>(x), mean.data<T>(), p.C, G, D, p.HW);
      TG_LAUNCH_CHECK();
    }
    if (dgamma.defined() || dbeta.defined()) {
      const dim3 threads(kParamChannels, kParamRows);
      param_grads_kernel<T><<<blocks_checked((p.C + kParamChannels - 1) / kParamChannels, "blocks"), threads, 0, s>>>(
          mutable_or_null<T>(dgamma), mutable_or_null<T>(dbeta), db, ds, rstd.data<T>(), p.N, p.C, G, D);
      TG_LAUNCH_CHECK();
    }
    if (dx.defined() && p.N > 0 && !fused) {
      const int64_t slices = slices_for(p.N * G, M, dev);
      const int64_t slice_len = (M + slices - 1) / slices;
      const dim3 grid(blocks_checked(p.N * G, "groups"), static_cast<unsigned>(slices));
      dx_kernel<T, X><<<grid, threads_for(slice_len), 0, s>>>(x_data<X>(dx), dy.data<T>(), masked_by, x_data<const X>(x),
                                                           data_or_null<T>(gamma), mean.data<T>(), rstd.data<T>(),
                                                           db, ds, p.C, G, D, p.HW, slice_len);
      TG_LAUNCH_CHECK();
    }
  });
}

}  // namespace tg::cuda
