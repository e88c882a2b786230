// Experiment (not built by CMake): convolutions with few input channels (stems, 3-D inputs of
// one channel, a U-Net's last layer seen from its grad-input) on the engine's TMA kernel in
// channel-quad mode (Im2colQuadBoxes) against what ran them before: the engine without it
// (EnginePolicy::tma_quads = -1: the cp.async wgmma / mma.sync kernels) and every other
// dispatcher row that implements the problem (the 3x3 kernels, the 1x1 kernels). For 16-31
// channels also quads against one 32-channel slice per tap (tma_quads 1 against 0). Last, the
// backward passes of the zoo rows whose forward+backward still loses to cuDNN (the 7x7 stem,
// 5x5 32 -> 64, Conv3d 1 -> 32), each pass on its own, to find which one does; for their
// few-channel grad-inputs the direct kernels as well.
// Per problem and precision: each row's time (median of 10 timings of 4 queued launches, ms),
// the row the default order takes, and each row's relative L2 distance from the default's
// output when above the precision's tolerance.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cmath>
#include <cstdio>
#include <string>

#include "core/cuda_context.h"
#include "core/tensor.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv_variants.h"
#include "ops/cuda/policy.h"
#include "probe_common.h"

namespace {

using namespace tg;

using probe_common::rel_l2;

struct Problem {
  const char* name;
  Shape x, w;
  ConvParams p;
  cuda::ConvPass pass;
};

void run(const Problem& pr, const ConvShape& s, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& dy,
         Precision precision) {
  switch (pr.pass) {
    case cuda::ConvPass::Forward: return cuda::conv_forward(out, x, w, Tensor(), s, precision);
    case cuda::ConvPass::GradInput: return cuda::conv_grad_input(out, dy, w, s, precision);
    case cuda::ConvPass::GradWeight: return cuda::conv_grad_weight(out, dy, x, s, precision);
  }
}

void measure(const Problem& pr) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", pr.x, pr.w, pr.p);
  const Tensor x = uniform(pr.x, -1, 1, {.device = gpu}), w = uniform(pr.w, -1, 1, {.device = gpu});
  const Tensor dy = uniform(s.y_shape(), -1, 1, {.device = gpu});
  const Shape out_shape = pr.pass == cuda::ConvPass::Forward     ? s.y_shape()
                          : pr.pass == cuda::ConvPass::GradInput ? pr.x
                                                                 : pr.w;
  const Tensor out = Tensor::empty(out_shape, {.device = gpu}), check = Tensor::empty(out_shape, {.device = gpu});
  for (Precision precision : {Precision::TF32, Precision::FP32}) {
    const cuda::ConvProblem problem = cuda::conv_problem(s, DType::f32, pr.pass, precision);
    cuda::ConvOperands operands{.out = out, .x = x, .w = w, .dy = dy};
    const std::string chosen(cuda::choose_conv_variant(problem, operands).name);
    run(pr, s, check, x, w, dy, precision);
    std::string line;
    auto time_row = [&](const char* label, const cuda::KernelPolicy& policy) {
      cuda::KernelPolicyGuard guard(policy);
      run(pr, s, out, x, w, dy, precision);
      const double err = rel_l2(out, check);
      const float ms = probe_common::median_ms(10, [&] { run(pr, s, out, x, w, dy, precision); }, 4, cuda::stream(0));
      char buf[128];
      std::snprintf(buf, sizeof buf, " %s %.4f", label, ms);
      line += buf;
      if (err > (precision == Precision::FP32 ? 1e-5 : 2e-3)) {
        std::snprintf(buf, sizeof buf, " (differs by %.1e)", err);
        line += buf;
      }
    };
    cuda::KernelPolicy quads, no_quads, wide_quads;
    quads.conv_variant = no_quads.conv_variant = wide_quads.conv_variant = "engine";
    no_quads.engine.tma_quads = -1;
    wide_quads.engine.tma_quads = 1;
    time_row("engine-quads", quads);
    time_row("engine-no-quads", no_quads);
    if (pr.pass != cuda::ConvPass::GradWeight && (pr.pass == cuda::ConvPass::Forward ? s.C : s.K) >= 16)
      time_row("engine-quads-to-31", wide_quads);
    // The direct (FFMA) kernels too for grad-inputs into 8 or fewer channels, which the engine
    // runs as a columns product (K deep, C kvol wide) and a gather.
    const bool direct_too = pr.pass == cuda::ConvPass::GradInput && s.C <= 8;
    for (const auto& row : cuda::conv_variants()) {
      if ((row.name == "direct" && !direct_too) || row.name == "engine" || !row.can_implement(problem, operands))
        continue;
      cuda::KernelPolicy forced;
      forced.conv_variant = row.name;
      time_row(std::string(row.name).c_str(), forced);
    }
    const char* pass = pr.pass == cuda::ConvPass::Forward ? "fwd" : pr.pass == cuda::ConvPass::GradInput ? "dgrad" : "wgrad";
    std::printf("%s %s %s: default %s |%s\n", pr.name, pass,
                precision == Precision::FP32 ? "fp32" : "tf32", chosen.c_str(), line.c_str());
  }
}

}  // namespace

int main() {
  using P = cuda::ConvPass;
  const Problem problems[] = {
      {"3x3 3->64 @32x32 b64", {64, 3, 32, 32}, {64, 3, 3, 3}, {.padding = {1}}, P::Forward},
      {"3x3 3->64 @64x64 b16", {16, 3, 64, 64}, {64, 3, 3, 3}, {.padding = {1}}, P::Forward},
      {"3x3 3->64 @128x128 b4", {4, 3, 128, 128}, {64, 3, 3, 3}, {.padding = {1}}, P::Forward},
      {"3x3 3->64 @224x224 b8", {8, 3, 224, 224}, {64, 3, 3, 3}, {.padding = {1}}, P::Forward},
      {"3x3 1->32 @64x64 b16", {16, 1, 64, 64}, {32, 1, 3, 3}, {.padding = {1}}, P::Forward},
      {"7x7 s2 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}, P::Forward},
      {"nhwc 7x7 s2 4->64 @224 b16", {16, 224, 224, 4}, {64, 4, 7, 7},
       {.stride = {2}, .padding = {3}, .layout = Layout::NHWC}, P::Forward},
      {"5x5 8->32 @64x64 b16", {16, 8, 64, 64}, {32, 8, 5, 5}, {.padding = {2}}, P::Forward},
      {"3d 3x3x3 1->32 @64^3 b2", {2, 1, 64, 64, 64}, {32, 1, 3, 3, 3}, {.padding = {1}}, P::Forward},
      {"3d 3x3x3 4->32 @32^3 b2", {2, 4, 32, 32, 32}, {32, 4, 3, 3, 3}, {.padding = {1}}, P::Forward},
      {"3x3 16->64 @32x32 b64", {64, 16, 32, 32}, {64, 16, 3, 3}, {.padding = {1}}, P::Forward},
      {"3x3 24->96 @32x32 b64", {64, 24, 32, 32}, {96, 24, 3, 3}, {.padding = {1}}, P::Forward},
      {"5x5 32->64 @64x64 b16", {16, 32, 64, 64}, {64, 32, 5, 5}, {.padding = {2}}, P::Forward},
      {"3x3 64->3 @64x64 b16", {16, 64, 64, 64}, {3, 64, 3, 3}, {.padding = {1}}, P::GradInput},
      {"3d 3x3x3 32->1 @64^3 b2", {2, 32, 64, 64, 64}, {1, 32, 3, 3, 3}, {.padding = {1}}, P::GradInput},
      // The zoo's stem and 5x5 rows lose in fwd+bwd: their backward passes one by one.
      {"7x7 s2 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}, P::GradInput},
      {"7x7 s2 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}, P::GradWeight},
      {"5x5 32->64 @64x64 b16", {16, 32, 64, 64}, {64, 32, 5, 5}, {.padding = {2}}, P::GradInput},
      {"5x5 32->64 @64x64 b16", {16, 32, 64, 64}, {64, 32, 5, 5}, {.padding = {2}}, P::GradWeight},
      {"3d 3x3x3 1->32 @64^3 b2", {2, 1, 64, 64, 64}, {32, 1, 3, 3, 3}, {.padding = {1}}, P::GradWeight},
  };
  for (const Problem& pr : problems) measure(pr);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %s\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
