// Experiment (not built by CMake): the engine's grad-weight over shifted rows of the padded
// input (ops/cuda/gemm/conv_wgrad_shifted_sm90.cu) against the same engine over written-out
// columns (or its cp.async kernel where the columns do not apply), the 3x3 kernels where they
// implement the problem, and the default route. For each problem and precision (TF32, FP32, and
// BF16 operands): each path's median ms (10 timings of 4 queued launches), after a check of its
// output against the columns path (relative L2, printed where above the precision's tolerance).
//
// Shapes: the zoo's stride-1 rows, the ResNet-style model's 3x3 layers, and a sweep of image
// sizes (8 .. 64) and channel counts (16 .. 512, K from 16) that sets the preference rule
// (the padded grid's waste, the output channels).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cstdio>
#include <string>

#include "conv_rows.h"
#include "ops/cuda/gemm/engine.h"

namespace {

using namespace tg;
using conv_rows::Problem;

// The grad-weight under `policy` (forced through the engine row), f32 or bf16 operands.
void run(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s, Precision precision, bool bf16,
         const cuda::EnginePolicy& policy) {
  if (bf16) return cuda::engine_conv_grad_weight_bf16(dw, dy, x, s, policy);
  cuda::KernelPolicy forced;
  forced.conv_variant = "engine";
  forced.engine = policy;
  cuda::KernelPolicyGuard guard(forced);
  cuda::conv_grad_weight(dw, dy, x, s, precision);
}

void time_problem(const Problem& pr) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", pr.x, pr.w, pr.p);
  for (int mode = 0; mode < 3; ++mode) {
    const bool bf16 = mode == 2;
    const Precision precision = mode == 1 ? Precision::FP32 : Precision::TF32;
    const DType operands = bf16 ? DType::bf16 : DType::f32;
    const Tensor x = uniform(s.x_shape(), -1, 1, {.device = gpu}).to(operands);
    const Tensor dy = uniform(s.y_shape(), -1, 1, {.device = gpu}).to(operands);
    const Tensor dw = Tensor::empty(s.w_shape(), {.device = gpu}), check = Tensor::empty(s.w_shape(), {.device = gpu});
    const cuda::EnginePolicy shifted{.wgrad_shifted = 1}, columns{.wgrad_shifted = -1};
    const bool can_shift = cuda::engine_conv_grad_weight_uses_shifted_rows(s, dw, precision, bf16, shifted);
    const bool by_default = cuda::engine_conv_grad_weight_uses_shifted_rows(s, dw, precision, bf16);
    run(check, dy, x, s, precision, bf16, columns);
    auto time = [&](auto&& launch) {
      return probe_common::median_ms(10, launch, 4, cuda::stream(0));
    };
    const float columns_ms = time([&] { run(dw, dy, x, s, precision, bf16, columns); });
    std::string line;
    char buf[160];
    if (can_shift) {
      run(dw, dy, x, s, precision, bf16, shifted);
      const double err = probe_common::rel_l2(dw, check);
      const float ms = time([&] { run(dw, dy, x, s, precision, bf16, shifted); });
      std::snprintf(buf, sizeof buf, " shifted %.4f (x%.2f)", ms, ms / columns_ms);
      line += buf;
      if (err > (precision == Precision::FP32 && !bf16 ? 1e-5 : 2e-3)) {
        std::snprintf(buf, sizeof buf, " (differs by %.1e)", err);
        line += buf;
      }
    }
    if (!bf16) {
      const cuda::ConvProblem problem = cuda::conv_problem(s, DType::f32, cuda::ConvPass::GradWeight, precision);
      const cuda::ConvOperands ops{.out = dw, .x = x, .w = Tensor(), .dy = dy};
      const std::string chosen(cuda::choose_conv_variant(problem, ops).name);
      for (const auto& row : cuda::conv_variants()) {
        if (row.name != "conv3x3" || !row.can_implement(problem, ops)) continue;
        cuda::KernelPolicy forced;
        forced.conv_variant = row.name;
        cuda::KernelPolicyGuard guard(forced);
        const float ms = time([&] { cuda::conv_grad_weight(dw, dy, x, s, precision); });
        std::snprintf(buf, sizeof buf, " conv3x3 %.4f", ms);
        line += buf;
      }
      const float ms = time([&] { cuda::conv_grad_weight(dw, dy, x, s, precision); });
      std::snprintf(buf, sizeof buf, " | default %s%s %.4f", chosen.c_str(),
                    chosen == "engine" && by_default ? "/shifted" : "", ms);
      line += buf;
    }
    std::printf("%s %s: columns %.4f%s\n", pr.name, bf16 ? "bf16" : precision == Precision::FP32 ? "fp32" : "tf32",
                columns_ms, line.c_str());
  }
}

}  // namespace

int main() {
  const Problem listed[] = {
      {"zoo c3d 64 @32^3", {2, 64, 32, 32, 32}, {64, 64, 3, 3, 3}, {.padding = {1}}},
      {"zoo c3d 128 @16^3", {2, 128, 16, 16, 16}, {128, 128, 3, 3, 3}, {.padding = {1}}},
      {"zoo 5x5 32->64 @64", {16, 32, 64, 64}, {64, 32, 5, 5}, {.padding = {2}}},
      {"zoo 3x3 d2 128 @64", {8, 128, 64, 64}, {128, 128, 3, 3}, {.padding = {2}, .dilation = {2}}},
      {"zoo nhwc 3x3 192 @32", {16, 32, 32, 192}, {192, 192, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"zoo 3x3 96 @64", {16, 96, 64, 64}, {96, 96, 3, 3}, {.padding = {1}}},
      {"zoo 3x3 192 @32", {16, 192, 32, 32}, {192, 192, 3, 3}, {.padding = {1}}},
      {"zoo 3x3 384 @16", {16, 384, 16, 16}, {384, 384, 3, 3}, {.padding = {1}}},
      {"zoo 3x3 512 @8", {32, 512, 8, 8}, {512, 512, 3, 3}, {.padding = {1}}},
      {"model 3x3 128 @16 b64", {64, 128, 16, 16}, {128, 128, 3, 3}, {.padding = {1}}},
      {"model 3x3 256 @8 b64", {64, 256, 8, 8}, {256, 256, 3, 3}, {.padding = {1}}},
      {"model 3x3 512 @4 b64", {64, 512, 4, 4}, {512, 512, 3, 3}, {.padding = {1}}},
  };
  for (const Problem& p : listed) time_problem(p);
  // The sweep: 3x3 p1 NCHW, about 64K output pixels per problem.
  const int64_t pairs[][2] = {{16, 16}, {32, 16}, {16, 32}, {32, 32}, {64, 32}, {64, 64}, {128, 128}, {256, 256}};
  for (const auto& ck : pairs)
    for (int64_t size : {8, 16, 32, 64}) {
      const int64_t n = 65536 / (size * size);
      char name[96];
      std::snprintf(name, sizeof name, "sweep %lldx%lld->%lld @%lld", static_cast<long long>(n),
                    static_cast<long long>(ck[0]), static_cast<long long>(ck[1]), static_cast<long long>(size));
      const Problem p{name, {n, ck[0], size, size}, {ck[1], ck[0], 3, 3}, {.padding = {1}}};
      time_problem(p);
    }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done (%s)\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
