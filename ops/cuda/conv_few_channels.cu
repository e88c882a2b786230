// Forward convolution with few taps per output (C * kernel volume <= kFewMaxTaps: RGB stems,
// one-channel volumes) on FP32 FMAs. Such a layer's reduction is too short for the tensor-core
// kernels to pay back their tile fill (a 3x3x3 kernel over one channel reduces over 27 values,
// a 7x7 RGB stem over 147): its time is the output's bytes and 2 C kvol FLOPs per output.
// Here one thread owns one output pixel and a chunk of 16 or 32 output channels: the chunk's
// weights sit in shared memory as [tap][channel] (every lane of a warp reads the same word: a
// broadcast), each input value is loaded once per chunk and multiplied into every channel's
// accumulator. FP32 products and sums in a fixed order: FP32-accurate at either precision, and
// the same bits run to run. Design note: docs/kernels/few_channels.md.
#include "core/cuda_context.h"
#include "ops/cuda/conv_few_channels.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 128;

// The geometry in 32-bit coordinates (few_channels_forward_applies checks the ranges); offsets
// stay 64-bit.
struct FewGeometry {
  int32_t C, K, taps;
  int32_t in[3], out[3], kernel[3], stride[3], pad[3], dil[3];
  int64_t in_volume, out_volume, pixels;  // pixels = N * out_volume
  bool channels_last;
};

// y[n, k0 + k, p] for the block's pixels and chunk k0 = blockIdx.y * Chunk (+ b[k]).
template <int Chunk>
__global__ void __launch_bounds__(kThreads) few_channels_forward_kernel(float* __restrict__ y,
                                                                       const float* __restrict__ x,
                                                                       const float* __restrict__ w,
                                                                       const float* __restrict__ b,
                                                                       const FewGeometry g) {
  __shared__ float4 weights[kFewMaxTaps * Chunk / 4];  // [tap][channel of the chunk]; zero past K
  float* ws = reinterpret_cast<float*>(weights);
  const int k0 = blockIdx.y * Chunk;
  // w is (K, taps): read along the taps (coalesced), written transposed.
  for (int i = threadIdx.x; i < g.taps * Chunk; i += kThreads) {
    const int k = i / g.taps, t = i % g.taps;
    ws[t * Chunk + k] = k0 + k < g.K ? w[int64_t(k0 + k) * g.taps + t] : 0.f;
  }
  __syncthreads();
  const int64_t pixel = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (pixel >= g.pixels) return;
  const int64_t n = pixel / g.out_volume, p = pixel % g.out_volume;
  const int32_t ox = int32_t(p % g.out[2]), oy = int32_t((p / g.out[2]) % g.out[1]);
  const int32_t oz = int32_t(p / (int64_t(g.out[2]) * g.out[1]));
  const int32_t z0 = oz * g.stride[0] - g.pad[0], y0 = oy * g.stride[1] - g.pad[1], x0 = ox * g.stride[2] - g.pad[2];
  // Element (c, q) of image n: q the flat input position.
  const float* xn = x + n * g.in_volume * g.C;
  const int64_t c_step = g.channels_last ? 1 : g.in_volume, q_step = g.channels_last ? g.C : 1;

  float acc[Chunk];
#pragma unroll
  for (int k = 0; k < Chunk; ++k) acc[k] = 0.f;
  int t = 0;  // the tap: ((c * kd + tz) * kh + ty) * kw + tx, as w orders them
  for (int32_t c = 0; c < g.C; ++c) {
    const float* xc = xn + c * c_step;
    for (int32_t tz = 0; tz < g.kernel[0]; ++tz) {
      const int32_t iz = z0 + tz * g.dil[0];
      if (uint32_t(iz) >= uint32_t(g.in[0])) {
        t += g.kernel[1] * g.kernel[2];
        continue;
      }
      for (int32_t ty = 0; ty < g.kernel[1]; ++ty) {
        const int32_t iy = y0 + ty * g.dil[1];
        if (uint32_t(iy) >= uint32_t(g.in[1])) {
          t += g.kernel[2];
          continue;
        }
        const float* row = xc + (int64_t(iz) * g.in[1] + iy) * g.in[2] * q_step;
        for (int32_t tx = 0; tx < g.kernel[2]; ++tx, ++t) {
          const int32_t ix = x0 + tx * g.dil[2];
          if (uint32_t(ix) >= uint32_t(g.in[2])) continue;
          const float v = __ldg(row + int64_t(ix) * q_step);
          const float4* wt = weights + t * (Chunk / 4);
#pragma unroll
          for (int q = 0; q < Chunk / 4; ++q) {
            const float4 wq = wt[q];
            acc[4 * q] = fmaf(v, wq.x, acc[4 * q]);
            acc[4 * q + 1] = fmaf(v, wq.y, acc[4 * q + 1]);
            acc[4 * q + 2] = fmaf(v, wq.z, acc[4 * q + 2]);
            acc[4 * q + 3] = fmaf(v, wq.w, acc[4 * q + 3]);
          }
        }
      }
    }
  }
  const int kn = min(Chunk, g.K - k0);
  if (g.channels_last) {
    float* out = y + pixel * g.K + k0;
#pragma unroll
    for (int k = 0; k < Chunk; ++k)
      if (k < kn) out[k] = b ? acc[k] + b[k0 + k] : acc[k];
  } else {
    float* out = y + (n * g.K + k0) * g.out_volume + p;  // consecutive lanes: consecutive p
#pragma unroll
    for (int k = 0; k < Chunk; ++k)
      if (k < kn) out[int64_t(k) * g.out_volume] = b ? acc[k] + b[k0 + k] : acc[k];
  }
}

constexpr int64_t kCoordinateLimit = int64_t{1} << 30;

}  // namespace

bool few_channels_forward_applies(const ConvShape& s) {
  const int64_t taps = s.C * s.kernel_volume();
  if (s.C < 1 || s.K < 1 || taps > kFewMaxTaps || (s.K + 31) / 32 > 65535) return false;  // grid's y limit
  for (int d = 0; d < 3; ++d) {
    // Every coordinate the kernel forms (o * stride - pad + t * dilation) within 32 bits.
    if (s.in[d] >= kCoordinateLimit || s.out[d] >= kCoordinateLimit || s.pad[d] >= kCoordinateLimit) return false;
    if ((s.out[d] - 1) * s.stride[d] >= kCoordinateLimit || (s.kernel[d] - 1) * s.dilation[d] >= kCoordinateLimit)
      return false;
  }
  // Blocks along the pixels within the grid's x limit.
  return s.N * s.out_volume() / kThreads < (int64_t{1} << 31) - 1;
}

void few_channels_conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                               const ConvShape& s) {
  FewGeometry g{};
  g.C = int32_t(s.C);
  g.K = int32_t(s.K);
  g.taps = int32_t(s.C * s.kernel_volume());
  for (int d = 0; d < 3; ++d) {
    g.in[d] = int32_t(s.in[d]);
    g.out[d] = int32_t(s.out[d]);
    g.kernel[d] = int32_t(s.kernel[d]);
    g.stride[d] = int32_t(s.stride[d]);
    g.pad[d] = int32_t(s.pad[d]);
    g.dil[d] = int32_t(s.dilation[d]);
  }
  g.in_volume = s.in_volume();
  g.out_volume = s.out_volume();
  g.pixels = s.N * s.out_volume();
  g.channels_last = s.channels_last();
  if (g.pixels == 0) return;
  const int dev = y.device().index;
  set_device(dev);
  const dim3 grid(static_cast<unsigned>((g.pixels + kThreads - 1) / kThreads), static_cast<unsigned>((s.K + 31) / 32));
  const float* bias = b.defined() ? b.data<float>() : nullptr;
  if (s.K <= 16) {
    few_channels_forward_kernel<16><<<dim3(grid.x, 1), kThreads, 0, stream(dev)>>>(y.data<float>(), x.data<float>(),
                                                                                 w.data<float>(), bias, g);
  } else {
    few_channels_forward_kernel<32><<<grid, kThreads, 0, stream(dev)>>>(y.data<float>(), x.data<float>(),
                                                                       w.data<float>(), bias, g);
  }
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
