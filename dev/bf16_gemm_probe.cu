// Experiment (not built by CMake): the engine's BF16 matrix product (engine_gemm_bf16, the TMA
// kernel with bf16 boxes) against its TF32 product on f32 copies of the same operands, on
// Linear's forward shapes (c = a b^T, a (M, K), b (N, K)); and Linear under Autocast(bf16)
// (casts included) against the f32 Linear at TF32. Per shape: median ms of 20 timings of 4
// queued launches, TFLOP/s, and the relative L2 distance between the BF16 and TF32 outputs
// (both from the same bf16 values: only the accumulation order differs). Then the BF16
// convolution forward (engine_conv_forward_bf16) against the TF32 one (engine_conv_forward on
// f32 copies) on the zoo's convolution shapes, NCHW (the bf16 transpose included) and NHWC.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cmath>
#include <cstdio>

#include "core/autocast.h"
#include "core/cuda_context.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "ops/conv.h"
#include "ops/cuda/gemm/engine.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/reduce.h"
#include "probe_common.h"

namespace {

using namespace tg;

using probe_common::rel_l2;

void measure(int64_t M, int64_t N, int64_t K) {
  const Device gpu = Device::cuda(0);
  const GemmProblem p{.M = M, .N = N, .K = K, .transB = true};
  const Tensor a = uniform({M, K}, -1, 1, {.dtype = DType::bf16, .device = gpu});
  const Tensor b = uniform({N, K}, -1, 1, {.dtype = DType::bf16, .device = gpu});
  const Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32);
  const Tensor c = Tensor::empty({M, N}, {.device = gpu}), c32 = Tensor::empty({M, N}, {.device = gpu});
  auto bf16 = [&] { cuda::engine_gemm_bf16(c, a, b, Tensor(), p); };
  auto tf32 = [&] { cuda::engine_gemm(c32, a32, b32, Tensor(), p, Precision::TF32); };
  bf16();
  tf32();
  const double err = rel_l2(c, c32);
  const float ms_bf16 = probe_common::median_ms(20, bf16, 4, cuda::stream(0));
  const float ms_tf32 = probe_common::median_ms(20, tf32, 4, cuda::stream(0));
  // Linear as a user calls it: f32 x and w, under Autocast (casts and rounding included).
  const Tensor x = a32, w = b32;
  Tensor y;
  auto autocast_linear = [&] {
    Autocast ac(DType::bf16);
    y = linear(x, w);
  };
  auto f32_linear = [&] {
    PrecisionGuard tf(Precision::TF32);
    y = linear(x, w);
  };
  const float ms_auto = probe_common::median_ms(20, autocast_linear, 4, cuda::stream(0));
  const float ms_f32 = probe_common::median_ms(20, f32_linear, 4, cuda::stream(0));
  const double flops = 2.0 * double(M) * double(N) * double(K);
  std::printf("%lld x %lld x %lld: engine bf16 %.4f ms (%.0f TFLOP/s), tf32 %.4f ms (%.0f TFLOP/s), bf16/tf32 %.2f, "
              "outputs differ by %.1e | linear: autocast bf16 %.4f ms, f32 at tf32 %.4f ms\n",
              static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), ms_bf16,
              flops / ms_bf16 * 1e-9, ms_tf32, flops / ms_tf32 * 1e-9, ms_bf16 / ms_tf32, err, ms_auto, ms_f32);
}

void measure_conv(const char* name, const Shape& x_shape, const Shape& w_shape, const ConvParams& p) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", x_shape, w_shape, p);
  const Tensor x = uniform(x_shape, -1, 1, {.dtype = DType::bf16, .device = gpu});
  const Tensor w = uniform(w_shape, -1, 1, {.dtype = DType::bf16, .device = gpu});
  const Tensor x32 = x.to(DType::f32), w32 = w.to(DType::f32);
  const Tensor y = Tensor::empty(s.y_shape(), {.device = gpu}), y32 = Tensor::empty(s.y_shape(), {.device = gpu});
  auto bf16 = [&] { cuda::engine_conv_forward_bf16(y, x, w, Tensor(), s); };
  auto tf32 = [&] { cuda::engine_conv_forward(y32, x32, w32, Tensor(), s, Precision::TF32); };
  bf16();
  tf32();
  const double err = rel_l2(y, y32);
  const float ms_bf16 = probe_common::median_ms(20, bf16, 4, cuda::stream(0));
  const float ms_tf32 = probe_common::median_ms(20, tf32, 4, cuda::stream(0));
  const double flops = 2.0 * double(s.N) * double(s.K) * double(s.C) * double(s.kernel_volume()) * double(s.out_volume());
  std::printf("conv %s: engine bf16 %.4f ms (%.0f TFLOP/s, on the TMA kernel: %s), tf32 %.4f ms, bf16/tf32 %.2f, "
              "outputs differ by %.1e\n",
              name, ms_bf16, flops / ms_bf16 * 1e-9, cuda::engine_conv_forward_bf16_uses_tma(s, x) ? "yes" : "no",
              ms_tf32, ms_bf16 / ms_tf32, err);
}

}  // namespace

int main() {
  measure(8192, 3072, 768);
  measure(8192, 768, 3072);
  measure(4096, 4096, 4096);
  measure(8192, 8192, 8192);
  measure(64, 4096, 4096);
  measure(1, 4096, 11008);
  measure_conv("3x3 96 @64x64 b16", {16, 96, 64, 64}, {96, 96, 3, 3}, {.padding = {1}});
  measure_conv("3x3 192 @32x32 b16", {16, 192, 32, 32}, {192, 192, 3, 3}, {.padding = {1}});
  measure_conv("3x3 384 @16x16 b16", {16, 384, 16, 16}, {384, 384, 3, 3}, {.padding = {1}});
  measure_conv("nhwc 3x3 192 @32x32 b16", {16, 32, 32, 192}, {192, 192, 3, 3}, {.padding = {1}, .layout = Layout::NHWC});
  measure_conv("1x1 384->96 @32x32 b16", {16, 384, 32, 32}, {96, 384, 1, 1}, {});
  measure_conv("3x3 s2 96->192 @64x64 b16", {16, 96, 64, 64}, {192, 96, 3, 3}, {.stride = {2}, .padding = {1}});
  measure_conv("3d 3x3x3 64 @32^3 b2", {2, 64, 32, 32, 32}, {64, 64, 3, 3, 3}, {.padding = {1}});
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %s\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
