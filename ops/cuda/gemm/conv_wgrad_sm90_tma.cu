// The engine's TF32 convolution grad-weight on Hopper as a TMA matrix product:
// dw (K, C * kvol) = dy (K, pixels) x cols (C * kvol, pixels)^T, the reduction running over
// every output pixel of every image. The TMA kernel reads both operands with the reduction
// contiguous, which neither stored tensor has along the pixels of all images, so both are
// written out first: dy as (K, N * P) and the input's columns cols[c * kvol + t][n * P + p] =
// x at output pixel p's tap t (zero in the padding), rows padded with zeros to a multiple of 4
// pixels (the TMA's 16-byte rule). The columns cost C * kvol * N * P floats written once and
// read once; the product then streams at the TMA kernel's rate, and its split reduction is the
// engine's fixed-order one (deterministic). Design note: docs/kernels/gemm.md.
#include <algorithm>

#include "core/cuda_context.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/gemm/planning.h"

namespace tg::cuda::engine {
namespace {

// The columns may take at most this many floats (1 GiB); beyond, the cp.async kernel serves.
constexpr int64_t kMaxColumnFloats = int64_t(1) << 28;
// Each column float written and read feeds 2 K FLOPs: with few output channels the columns
// cost more than the cp.async kernel's gathers. Measured (H200, TF32 forward + backward, against
// that kernel): K 192-384 win (3x3 stride 2 96 -> 192 at 64x64 0.74 -> 0.66 ms, NHWC 192 at
// 32x32 0.70 -> 0.60), K 64-128 lose (5x5 32 -> 64 at 64x64 0.69 -> 0.80, Conv3d 64 at 32^3 1.14
// -> 1.43). Except where the reduction's other side is narrow (C * kvol <= 64: a stem with one
// input channel, 1.32 -> 0.96), where the cp.async kernel's tiles are mostly empty.
constexpr int64_t kMinOutputChannels = 160, kMinOutputChannelsNarrow = 32, kNarrowColumns = 64;

// cols[j = c * kvol + t][r = n * P + p] for r < N * P, zeros up to row_len: one row j per
// blockIdx.y (its channel and tap decoded once), threads along r (writes coalesced; NCHW reads
// along the output row too).
__global__ void columns_kernel(float* __restrict__ cols, const float* __restrict__ x, ConvGeometry g,
                               bool channels_last, int64_t row_len, int64_t rows) {
  const int64_t pixels = int64_t(g.N) * g.out_volume;
  for (int64_t j = blockIdx.y; j < rows; j += gridDim.y) {
    uint32_t c, t, tz, ty, tx, rest;
    g.div_kernel_volume.divmod(uint32_t(j), c, t);
    g.div_kernel_w.divmod(t, rest, tx);
    g.div_kernel_h.divmod(rest, tz, ty);
    float* out = cols + j * row_len;
    for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < row_len; r += int64_t(gridDim.x) * blockDim.x) {
      float v = 0.f;
      if (r < pixels) {
        uint32_t n, p;
        g.div_out_volume.divmod(uint32_t(r), n, p);
        int32_t od, oh, ow;
        g.unravel_out(p, od, oh, ow);
        const int32_t iw = ow * g.stride[2] - g.pad[2] + int32_t(tx) * g.dil[2];
        const int32_t ih = oh * g.stride[1] - g.pad[1] + int32_t(ty) * g.dil[1];
        const int32_t id = od * g.stride[0] - g.pad[0] + int32_t(tz) * g.dil[0];
        if (iw >= 0 && iw < g.in[2] && ih >= 0 && ih < g.in[1] && id >= 0 && id < g.in[0]) {
          const int64_t pixel = (int64_t(id) * g.in[1] + ih) * g.in[2] + iw;
          v = channels_last ? x[(n * g.in_volume + pixel) * g.C + c] : x[(int64_t(n) * g.C + c) * g.in_volume + pixel];
        }
      }
      out[r] = v;
    }
  }
}

// out[k][n * P + p] = dy[n][k][p] (channels-first dy), zeros up to row_len.
__global__ void gather_dy_kernel(float* __restrict__ out, const float* __restrict__ dy, int64_t N, int64_t K,
                                 int64_t P, int64_t row_len) {
  const int64_t total = K * row_len;
  TG_GRID_STRIDE(e, total) {
    const int64_t r = e % row_len, k = e / row_len;
    out[e] = r < N * P ? dy[((r / P) * K + k) * P + r % P] : 0.f;
  }
}

}  // namespace

bool conv_wgrad_tma_applies(const ConvShape& s, int dev) {
  const int64_t pixels = s.N * s.out_volume(), row_len = round_up(pixels, 4);
  const int64_t col_rows = s.C * s.kernel_volume();
  const int64_t min_k = col_rows <= kNarrowColumns ? kMinOutputChannelsNarrow : kMinOutputChannels;
  if (s.K < min_k || !device_runs_wgmma(dev)) return false;
  return fits(row_len) && fits(col_rows) && col_rows <= kMaxColumnFloats / row_len &&
         s.K <= kMaxColumnFloats / row_len && (row_len + 31) / 32 <= 65535;
}

void conv_wgrad_tma(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                    const EnginePolicy& policy) {
  const int dev = dw.device().index;
  cudaStream_t st = stream(dev);
  const TensorOptions f32{.dtype = DType::f32, .device = dw.device()};
  const int64_t pixels = s.N * s.out_volume(), row_len = round_up(pixels, 4);
  const int64_t col_rows = s.C * s.kernel_volume();

  Tensor dy_rows = Tensor::empty({s.K * row_len}, f32);
  if (s.channels_last()) {
    transpose_into(dy_rows.data<float>(), dy.data<float>(), 1, pixels, s.K, row_len, st);
  } else {
    gather_dy_kernel<<<grid_for(dy_rows.numel(), kThreads), kThreads, 0, st>>>(
        dy_rows.data<float>(), dy.data<float>(), s.N, s.K, s.out_volume(), row_len);
    TG_LAUNCH_CHECK();
  }
  Tensor cols = Tensor::empty({col_rows * row_len}, f32);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((row_len + kThreads - 1) / kThreads, 1024)),
                  static_cast<unsigned>(std::min<int64_t>(col_rows, 65535)));
  columns_kernel<<<grid, kThreads, 0, st>>>(cols.data<float>(), x.data<float>(), geometry(s), s.channels_last(),
                                            row_len, col_rows);
  TG_LAUNCH_CHECK();

  const int cols_wide = policy.tile == 256 ? 256 : col_rows <= 64 ? 64 : 128;
  const Plan plan = make_tma_plan(s.K, col_rows, row_len, cols_wide, dev, policy);
  MainloopArgs args{};
  args.M = int32_t(s.K);
  args.N = int32_t(col_rows);
  args.red = int32_t(row_len);
  args.out = output_map(dw.data<float>(), nullptr, s.K, col_rows);  // (K, C, kvol): column c * kvol + t
  run_plan(plan, args, dw.device(), [&](const MainloopArgs& a, cudaStream_t stm) {
    launch_matmul_tma(dy_rows.data<float>(), cols.data<float>(), plan, a, stm);
  });
}

}  // namespace tg::cuda::engine
