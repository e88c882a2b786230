// The engine's convolution grad-weight on Hopper as a TMA matrix product (TF32, or FP32 as split TF32):
// dw (K, C * kvol) = dy (K, pixels) x cols (C * kvol, pixels)^T, the reduction running over
// every output pixel of every image. The TMA kernel reads both operands with the reduction
// contiguous, which neither stored tensor has along the pixels of all images, so both are
// written out first: dy as (K, N * P) and the input's columns cols[c * kvol + t][n * P + p] =
// x at output pixel p's tap t (zero in the padding), rows padded with zeros to a multiple of 4
// pixels (the TMA's 16-byte rule). The columns cost C * kvol * N * P floats written once and
// read once; the product then streams at the TMA kernel's rate, and its split reduction is the
// engine's fixed-order one (deterministic). Design note: docs/kernels/gemm_tma.md.
#include <algorithm>

#include "core/cuda_context.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/gemm/columns.cuh"
#include "ops/cuda/gemm/planning.h"

namespace tg::cuda::engine {
namespace {

// The columns may take at most this many floats (1 GiB); beyond, the cp.async kernel serves.
constexpr int64_t kMaxColumnFloats = int64_t(1) << 28;
// Each column float written and read feeds 2 K FLOPs: with few output channels the columns
// cost more than the cp.async kernel's gathers. Measured (H200, TF32 forward + backward, against
// that kernel): K 64 and more win (5x5 32 -> 64 at 64x64 0.66 -> 0.54 ms, Conv3d 64 at 32^3
// 1.11 -> 0.88, Conv3d 128 at 16^3 0.39 -> 0.32), and where the reduction's other side is
// narrow (C * kvol <= 64: a stem with one input channel) from K 32.
constexpr int64_t kMinOutputChannels = 64, kMinOutputChannelsNarrow = 32, kNarrowColumns = 64;

// out[k][n * P + p] = dy[n][k][p] (channels-first dy), zeros up to row_len: one row k per
// blockIdx.y, threads along the row, several r each (as columns_kernel).
template <class T>
__global__ void gather_dy_kernel(T* __restrict__ out, const T* __restrict__ dy, uint32_t N, int64_t K,
                                 FastDivmod div_P, uint32_t row_len) {
  const uint32_t pixels = N * div_P.divisor;
  for (int64_t k = blockIdx.y; k < K; k += gridDim.y) {
    for (uint32_t r = blockIdx.x * blockDim.x + threadIdx.x; r < row_len; r += gridDim.x * blockDim.x) {
      T v = T(0);
      if (r < pixels) {
        uint32_t n, p;
        div_P.divmod(r, n, p);
        v = dy[(int64_t(n) * K + k) * div_P.divisor + p];
      }
      out[k * row_len + r] = v;
    }
  }
}

template <class T>
bool wgrad_columns_fit(const ConvShape& s, int dev, const EnginePolicy& policy) {
  const int64_t pixels = s.N * s.out_volume(), row_len = round_up(pixels, kRowMultiple<T>);
  const int64_t col_rows = s.C * s.kernel_volume();
  const int64_t min_k = col_rows <= kNarrowColumns ? kMinOutputChannelsNarrow : kMinOutputChannels;
  if (policy.wgrad_columns < 0 || (policy.wgrad_columns == 0 && s.K < min_k) || !device_runs_wgmma(dev)) return false;
  return fits(row_len) && fits(col_rows) && col_rows <= kMaxColumnFloats / row_len &&
         s.K <= kMaxColumnFloats / row_len && (row_len + 31) / 32 <= 65535;
}

// dw (f32) over written-out dy rows and input columns of element type T; `product` runs the
// TMA matrix product of the two (f32 or bf16 boxes).
template <class T, class Product>
void wgrad_columns(const Tensor& dw, const T* dy, const T* x, const ConvShape& s, Precision precision,
                   const EnginePolicy& policy, Product&& product) {
  const int dev = dw.device().index;
  cudaStream_t st = stream(dev);
  const TensorOptions rows_type{.dtype = sizeof(T) == 4 ? DType::f32 : DType::bf16, .device = dw.device()};
  const int64_t pixels = s.N * s.out_volume(), row_len = round_up(pixels, kRowMultiple<T>);
  const int64_t col_rows = s.C * s.kernel_volume();

  Tensor dy_rows = Tensor::empty({s.K * row_len}, rows_type);
  T* dy_out = static_cast<T*>(dy_rows.raw_data());
  if (s.channels_last()) {
    transpose_into(dy_out, dy, 1, pixels, s.K, row_len, st);
  } else {
    const dim3 grid(row_blocks(row_len), static_cast<unsigned>(std::min<int64_t>(s.K, 65535)));
    gather_dy_kernel<T><<<grid, kThreads, 0, st>>>(dy_out, dy, uint32_t(s.N), s.K, FastDivmod(uint32_t(s.out_volume())),
                                                   uint32_t(row_len));
    TG_LAUNCH_CHECK();
  }
  Tensor cols = Tensor::empty({col_rows * row_len}, rows_type);
  T* cols_out = static_cast<T*>(cols.raw_data());
  write_columns(cols_out, x, s, row_len, st);

  // dw (K, C * kvol) is the product's C[m][n] with m = k and n = column c * kvol + t; with 64
  // or fewer output channels the product is taken transposed (m = column, n = k), so that the
  // narrow side fills a 64-wide tile instead of half a 128-row one (FP32 too, unless policy.tile
  // is 128).
  const bool bf16 = sizeof(T) == 2;
  const bool transposed = s.K <= 64 && col_rows > 64;
  const int64_t M = transposed ? col_rows : s.K, N = transposed ? s.K : col_rows;
  const int narrow = N <= 64 ? 64 : 128;
  const int cols_wide = !bf16 && precision == Precision::FP32 ? (policy.tile == 128 ? 128 : narrow)
                        : policy.tile == 256 ? 256 : narrow;
  const Plan plan = make_tma_plan(M, N, row_len, cols_wide, dev, policy, precision, bf16);
  MainloopArgs args{};
  args.M = int32_t(M);
  args.N = int32_t(N);
  args.red = int32_t(row_len);
  args.out = output_map(dw.data<float>(), nullptr, M, N);
  if (transposed) {  // C[m][n] -> dw[n * M + m]: the channels-first map with one "image" of M pixels
    args.out.mode = OutputMap::kChannelsFirst;
    args.out.div = FastDivmod(uint32_t(M));
  }
  const T* a = transposed ? cols_out : dy_out;
  const T* b = transposed ? dy_out : cols_out;
  run_plan(plan, args, dw.device(), [&](const MainloopArgs& ma, cudaStream_t stm) { product(a, b, plan, ma, stm); });
}

}  // namespace

bool conv_wgrad_tma_applies(const ConvShape& s, int dev, const EnginePolicy& policy) {
  return conv_wgrad_shifted_applies(s, dev, policy, false) || wgrad_columns_fit<float>(s, dev, policy);
}

void conv_wgrad_tma(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s, Precision precision,
                    const EnginePolicy& policy) {
  if (conv_wgrad_shifted_applies(s, dw.device().index, policy, false))
    return conv_wgrad_shifted(dw, dy, x, s, precision, policy);
  wgrad_columns<float>(dw, dy.data<float>(), x.data<float>(), s, precision, policy, launch_matmul_tma);
}

bool conv_wgrad_bf16_tma_applies(const ConvShape& s, int dev, const EnginePolicy& policy) {
  return conv_wgrad_shifted_applies(s, dev, policy, true) || wgrad_columns_fit<uint16_t>(s, dev, policy);
}

void conv_wgrad_bf16_tma(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                         const EnginePolicy& policy) {
  if (conv_wgrad_shifted_applies(s, dw.device().index, policy, true))
    return conv_wgrad_shifted(dw, dy, x, s, Precision::TF32, policy);
  wgrad_columns<uint16_t>(dw, bf16_bits(dy), bf16_bits(x), s, Precision::TF32, policy, launch_matmul_tma_bf16);
}

}  // namespace tg::cuda::engine
