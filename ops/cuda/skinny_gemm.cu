// Three memory-bound kernels cover every GEMM with a dimension <= 8 (S below):
//   row_dot:    out(r, s) = sum_k big(r, k) * small(s, k)   big's rows are streamed
//   col_reduce: out(s, c) = sum_r coef(r, s) * big(r, c)    big's rows are streamed
//   outer:      out(r, c) = sum_s coef(r, s) * small(s, c)  out is streamed (written)
// Workload D is row_dot forward (A 2048 x 2^20 times w), col_reduce for the weight
// gradient (g^T A) and outer for the input gradient (g w^T).
#include "core/cuda_context.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/skinny_gemm.h"
#include "ops/elementwise.h"

#include <algorithm>
#include <type_traits>

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

// A strided view of a small matrix: element (i, j) at data[i * si + j * sj].
struct View {
  const float* data;
  int64_t si, sj;
  __device__ float operator()(int64_t i, int64_t j) const { return data[i * si + j * sj]; }
};

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Sums v over the block; the result is valid in thread 0. Fixed order: deterministic.
template <int S>
__device__ void block_sum(float (&v)[S]) {
  __shared__ float partial[kThreads / 32][S];
  for (int s = 0; s < S; ++s)
    for (int off = 16; off > 0; off /= 2) v[s] += __shfl_down_sync(0xffffffffu, v[s], off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0)
    for (int s = 0; s < S; ++s) partial[warp][s] = v[s];
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      float acc = 0;
      for (int w = 0; w < kThreads / 32; ++w) acc += partial[w][s];
      v[s] = acc;
    }
  }
  __syncthreads();
}

// Block (r, split) sums its slice of k for row r; partial results go to
// part[(r * splits + split) * S + s]. `vec` says every row and `small` row starts 16-byte
// aligned with unit stride along k, so float4 loads are legal.
template <int S, bool vec>
__global__ void __launch_bounds__(kThreads) row_dot_kernel(float* __restrict__ part, const float* __restrict__ big,
                                                           View small, int64_t K, int64_t chunk, int splits) {
  const int64_t r = blockIdx.x / splits;
  const int split = blockIdx.x % splits;
  const int64_t k0 = split * chunk, k1 = min(K, k0 + chunk);
  const float* row = big + r * K;
  float acc[S] = {};
  if (vec) {
    // Four float4 loads in flight per thread keep enough bytes moving to cover latency.
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int64_t q0 = k0 / 4, q1 = k1 / 4;
#pragma unroll 4
    for (int64_t q = q0 + threadIdx.x; q < q1; q += kThreads) {
      float4 a = __ldcs(row4 + q);  // streamed once: do not keep it in L2
      for (int s = 0; s < S; ++s) {
        float4 b = *reinterpret_cast<const float4*>(small.data + s * small.si + 4 * q);
        acc[s] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      }
    }
  } else {
    for (int64_t k = k0 + threadIdx.x; k < k1; k += kThreads) {
      float a = row[k];
      for (int s = 0; s < S; ++s) acc[s] += a * small(s, k);
    }
  }
  block_sum<S>(acc);
  if (threadIdx.x == 0)
    for (int s = 0; s < S; ++s) part[(r * splits + split) * S + s] = acc[s];
}


// out(i, j) = sum over splits of part[(split-major or row-major)], in split order, + bias.
// part holds splits consecutive blocks of `count` values (i * cols + j) each.
__global__ void finish_kernel(float* out, const float* part, int64_t rows, int64_t cols, int splits,
                              int64_t os_i, int64_t os_j, const float* bias, int64_t b_i, int64_t b_j) {
  const int64_t count = rows * cols;
  TG_GRID_STRIDE(e, count) {
    const int64_t i = e / cols, j = e % cols;
    float acc = 0;
    for (int sp = 0; sp < splits; ++sp) acc += part[sp * count + e];
    if (bias) acc += bias[i * b_i + j * b_j];
    out[i * os_i + j * os_j] = acc;
  }
}

// Block (column block, split) sums rows [r0, r1) for its 4 * kThreads columns (vec) or
// kThreads columns; partials go to part[(split * S + s) * C + c].
template <int S, bool vec>
__global__ void __launch_bounds__(kThreads) col_reduce_kernel(float* __restrict__ part, const float* __restrict__ big,
                                                              View coef, int64_t R, int64_t C, int64_t rows_per_split) {
  constexpr int kCols = vec ? 4 : 1;
  const int64_t col_blocks = (C + kCols * kThreads - 1) / (kCols * kThreads);
  const int64_t split = blockIdx.x / col_blocks;
  const int64_t c = (blockIdx.x % col_blocks) * kCols * kThreads + kCols * threadIdx.x;
  const int64_t r0 = split * rows_per_split, r1 = min(R, r0 + rows_per_split);
  if (c >= C) return;
  float acc[S][kCols] = {};
#pragma unroll 4
  for (int64_t r = r0; r < r1; ++r) {
    float v[kCols];
    if constexpr (vec) {
      float4 a = __ldcs(reinterpret_cast<const float4*>(big + r * C + c));
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    } else {
      v[0] = big[r * C + c];
    }
    for (int s = 0; s < S; ++s) {
      const float w = coef(r, s);
      for (int j = 0; j < kCols; ++j) acc[s][j] += w * v[j];
    }
  }
  for (int s = 0; s < S; ++s) {
    float* dst = part + (split * S + s) * C + c;
    if constexpr (vec) {
      *reinterpret_cast<float4*>(dst) = make_float4(acc[s][0], acc[s][1], acc[s][2], acc[s][3]);
    } else {
      dst[0] = acc[s][0];
    }
  }
}

// out(r, c) = sum_s coef(r, s) * small(s, c) + bias(c); out is (R, C) row-major.
template <int S, bool vec>
__global__ void outer_kernel(float* __restrict__ out, View coef, View small, const float* bias, int64_t R, int64_t C) {
  if constexpr (vec) {
    const int64_t C4 = C / 4;
    TG_GRID_STRIDE(e, R * C4) {
      const int64_t r = e / C4, c = 4 * (e % C4);
      float4 acc = bias ? *reinterpret_cast<const float4*>(bias + c) : make_float4(0, 0, 0, 0);
      for (int s = 0; s < S; ++s) {
        const float w = coef(r, s);
        const float4 b = *reinterpret_cast<const float4*>(small.data + s * small.si + c);
        acc.x += w * b.x; acc.y += w * b.y; acc.z += w * b.z; acc.w += w * b.w;
      }
      __stcs(reinterpret_cast<float4*>(out + r * C + c), acc);  // written once, never re-read here
    }
  } else {
    TG_GRID_STRIDE(e, R * C) {
      const int64_t r = e / C, c = e % C;
      float acc = bias ? bias[c] : 0.f;
      for (int s = 0; s < S; ++s) acc += coef(r, s) * small(s, c);
      out[e] = acc;
    }
  }
}

// Calls f(std::integral_constant<int, S>) for the runtime S in 1..8.
template <class F>
void with_s(int64_t S, F&& f) {
  switch (S) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 3: f(std::integral_constant<int, 3>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    case 5: f(std::integral_constant<int, 5>()); break;
    case 6: f(std::integral_constant<int, 6>()); break;
    case 7: f(std::integral_constant<int, 7>()); break;
    default: f(std::integral_constant<int, 8>()); break;
  }
}

// Enough blocks for a few waves on the largest GPU we target (132 SMs x 8 blocks).
constexpr int64_t kTargetBlocks = 132 * 8;

// Where an output element (i, j) of a kernel lands in C, and which bias element it gets.
struct Placement {
  int64_t os_i, os_j, b_i, b_j;
};

void row_dot(float* c, const float* big, View small, int64_t R, int64_t K, int64_t S, Placement pl,
             const float* bias, const Device& dev) {
  const int splits = static_cast<int>(std::max<int64_t>(1, std::min(ceil_div(kTargetBlocks, R), ceil_div(K, 4 * 4 * kThreads))));
  const int64_t chunk = ceil_div(ceil_div(K, splits), 4) * 4;  // multiple of 4 keeps float4 alignment
  const bool vec = K % 4 == 0 && aligned16(big) && small.sj == 1 && small.si % 4 == 0 && aligned16(small.data);
  Tensor part = Tensor::empty(Shape{R * splits * S}, {.device = dev});
  cudaStream_t st = stream(dev.index);
  with_s(S, [&](auto s_const) {
    constexpr int kS = decltype(s_const)::value;
    const unsigned blocks = static_cast<unsigned>(R * splits);
    if (vec) row_dot_kernel<kS, true><<<blocks, kThreads, 0, st>>>(part.data<float>(), big, small, K, chunk, splits);
    else row_dot_kernel<kS, false><<<blocks, kThreads, 0, st>>>(part.data<float>(), big, small, K, chunk, splits);
  });
  TG_LAUNCH_CHECK();
  // part is (R, splits, S): reduce over splits with the finish kernel viewing it as
  // `splits` blocks of (R, S) only when splits == 1; otherwise transpose-free indexing below.
  if (splits == 1) {
    finish_kernel<<<grid_for(R * S, kThreads), kThreads, 0, st>>>(c, part.data<float>(), R, S, 1, pl.os_i, pl.os_j,
                                                                   bias, pl.b_i, pl.b_j);
  } else {
    // Reorder to (splits, R, S) so that finish_kernel sums matching elements in split order.
    Tensor reordered = part.reshape({R, splits, S}).permute({1, 0, 2});
    finish_kernel<<<grid_for(R * S, kThreads), kThreads, 0, st>>>(c, reordered.data<float>(), R, S, splits, pl.os_i,
                                                                   pl.os_j, bias, pl.b_i, pl.b_j);
  }
  TG_LAUNCH_CHECK();
}

void col_reduce(float* c, const float* big, View coef, int64_t R, int64_t C, int64_t S, Placement pl,
                const float* bias, const Device& dev) {
  const bool vec = C % 4 == 0 && aligned16(big);
  const int64_t cols_per_block = (vec ? 4 : 1) * kThreads;
  const int64_t col_blocks = ceil_div(C, cols_per_block);
  const int64_t splits = std::max<int64_t>(1, std::min(ceil_div(kTargetBlocks, col_blocks), ceil_div(R, 64)));
  const int64_t rows_per_split = ceil_div(R, splits);
  Tensor part = Tensor::empty(Shape{splits * S * C}, {.device = dev});  // (splits, S, C)
  cudaStream_t st = stream(dev.index);
  with_s(S, [&](auto s_const) {
    constexpr int kS = decltype(s_const)::value;
    const unsigned blocks = static_cast<unsigned>(col_blocks * splits);
    if (vec) col_reduce_kernel<kS, true><<<blocks, kThreads, 0, st>>>(part.data<float>(), big, coef, R, C, rows_per_split);
    else col_reduce_kernel<kS, false><<<blocks, kThreads, 0, st>>>(part.data<float>(), big, coef, R, C, rows_per_split);
  });
  TG_LAUNCH_CHECK();
  finish_kernel<<<grid_for(S * C, kThreads), kThreads, 0, st>>>(c, part.data<float>(), S, C, static_cast<int>(splits),
                                                                 pl.os_i, pl.os_j, bias, pl.b_i, pl.b_j);
  TG_LAUNCH_CHECK();
}

void outer(float* c, View coef, View small, int64_t R, int64_t C, int64_t S, const float* bias, const Device& dev) {
  const bool vec = C % 4 == 0 && small.sj == 1 && small.si % 4 == 0 && aligned16(small.data) && aligned16(c) &&
                   (!bias || aligned16(bias));
  cudaStream_t st = stream(dev.index);
  with_s(S, [&](auto s_const) {
    constexpr int kS = decltype(s_const)::value;
    if (vec) outer_kernel<kS, true><<<grid_for(R * C / 4, kThreads), kThreads, 0, st>>>(c, coef, small, bias, R, C);
    else outer_kernel<kS, false><<<grid_for(R * C, kThreads), kThreads, 0, st>>>(c, coef, small, bias, R, C);
  });
  TG_LAUNCH_CHECK();
}

}  // namespace

bool skinny_gemm_applies(const Tensor& c, const GemmProblem& p) {
  if (c.dtype() != DType::f32 || p.M == 0 || p.N == 0 || p.K == 0) return false;
  return p.K <= kSkinnyMax || p.N <= kSkinnyMax || p.M <= kSkinnyMax;
}

void skinny_gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p) {
  const Device dev = c.device();
  set_device(dev.index);
  const int64_t M = p.M, N = p.N, K = p.K;
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  const float* pbias = bias.defined() ? bias.data<float>() : nullptr;
  float* pc = c.data<float>();
  // opA(m, k) = pa[m * a_si + k * a_sj]; opB(k, n) = pb[k * b_si + n * b_sj].
  const int64_t a_si = p.transA ? 1 : K, a_sj = p.transA ? M : 1;
  const int64_t b_si = p.transB ? 1 : N, b_sj = p.transB ? K : 1;
  if (K <= kSkinnyMax) {
    outer(pc, View{pa, a_si, a_sj}, View{pb, b_si, b_sj}, M, N, K, pbias, dev);
  } else if (N <= kSkinnyMax && !p.transA) {
    // C(m, n) = dot(A row m, opB column n): stream A's rows.
    row_dot(pc, pa, View{pb, b_sj, b_si}, M, K, N, Placement{N, 1, 0, 1}, pbias, dev);
  } else if (N <= kSkinnyMax) {
    // A stored (K, M): C(m, n) = sum_k A(k, m) opB(k, n): stream A's rows, reduce over them.
    col_reduce(pc, pa, View{pb, b_si, b_sj}, K, M, N, Placement{1, N, 1, 0}, pbias, dev);
  } else if (p.transB) {
    // B stored (N, K): C(m, n) = dot(B row n, opA row m).
    row_dot(pc, pb, View{pa, a_si, a_sj}, N, K, M, Placement{1, N, 1, 0}, pbias, dev);
  } else {
    // B stored (K, N): C(m, n) = sum_k opA(m, k) B(k, n).
    col_reduce(pc, pb, View{pa, a_sj, a_si}, K, N, M, Placement{N, 1, 0, 1}, pbias, dev);
  }
}

}  // namespace tg::cuda
