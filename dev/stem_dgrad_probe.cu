// Experiment (not built by CMake): where a first layer's grad-input spends its time. The 7x7 s2
// RGB stem's grad-input (the zoo's c2d_7x7_s2_3to64_224_bias fwd+bwd, 1.05-1.14x PyTorch) runs the
// engine's columns pass (ops/cuda/gemm/dgrad_columns.cu): NCHW dy transposed to (N P, K) rows, the
// product cols (C kvol, N P) = w^T dy, then a gather of each dx element's taps. Its floor is ~15 us
// (dy read once, dx written once); it takes ~0.39 ms TF32. For each problem and precision: the
// routed pass, the direct FFMA row, and the columns pass's two big steps on their own (the
// transpose and the product; the gather is the rest), median ms of 10 timings of 4 launches.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cstdio>

#include "conv_rows.h"
#include "ops/cuda/gemm/engine.h"
#include "ops/cuda/gemm/planning.h"

using namespace tg;
using conv_rows::Problem;

namespace {

void time_problem(const Problem& pr) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", pr.x, pr.w, pr.p);
  const TensorOptions f32{.dtype = DType::f32, .device = gpu};
  const Tensor w = uniform(s.w_shape(), -1, 1, f32), dy = uniform(s.y_shape(), -1, 1, f32);
  const Tensor dx = Tensor::empty(s.x_shape(), f32);
  const int64_t P = s.N * s.out_volume(), red = s.channels_last() ? s.K : (s.K + 3) / 4 * 4;
  const int64_t rows = s.C * s.kernel_volume();
  const Tensor wt = uniform({rows, red}, -1, 1, f32), dy_rows = uniform({P, red}, -1, 1, f32);
  const Tensor cols = Tensor::empty({rows, P}, f32);
  const GemmProblem product{.M = rows, .N = P, .K = red, .transA = false, .transB = true};
  for (const Precision precision : {Precision::TF32, Precision::FP32}) {
    auto time = [&](auto&& launch) { return probe_common::median_ms(10, launch, 4, cuda::stream(0)); };
    const float routed = time([&] { cuda::conv_grad_input(dx, dy, w, s, precision); });
    float direct = 0;
    {
      cuda::KernelPolicy forced;
      forced.conv_variant = "direct";
      cuda::KernelPolicyGuard guard(forced);
      direct = time([&] { cuda::conv_grad_input(dx, dy, w, s, precision); });
    }
    const float transpose = s.channels_last() ? 0.f : time([&] {
      cuda::engine::transpose_into(const_cast<float*>(dy_rows.data<float>()), dy.data<float>(), s.N, s.K,
                                   s.out_volume(), red, cuda::stream(0));
    });
    const float gemm = time([&] { cuda::engine_gemm(cols, wt, dy_rows, Tensor(), product, precision); });
    std::printf("%s %s: routed %.4f | direct %.4f | columns pass: transpose %.4f product %.4f (%lld x %lld x %lld) "
                "gather ~%.4f\n",
                pr.name, precision == Precision::FP32 ? "fp32" : "tf32", routed, direct, transpose, gemm,
                static_cast<long long>(rows), static_cast<long long>(P), static_cast<long long>(red),
                routed - transpose - gemm);
  }
}

}  // namespace

int main() {
  const Layout NHWC = Layout::NHWC;
  const Problem problems[] = {
      {"7x7 s2 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"7x7 s2 3->64 @224 b16 nhwc", {16, 224, 224, 3}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}, .layout = NHWC}},
      {"3x3 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 3, 3}, {.padding = {1}}},
      {"3x3x3 1->32 @64^3 b2", {2, 1, 64, 64, 64}, {32, 1, 3, 3, 3}, {.padding = {1}}},
      {"5x5 1->32 @28 b64", {64, 1, 28, 28}, {32, 1, 5, 5}, {.padding = {2}}},
  };
  for (const Problem& p : problems) time_problem(p);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done (%s)\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
