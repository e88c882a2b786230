// Experiment (not built by CMake): the engine's forward and grad-input under forced plans on the
// zoo's rows that still lose to cuDNN at TF32 (3x3 384 at 16x16 forward 1.35, 3x3x3 s2 64 -> 128
// forward 1.27, 3x3 512 at 8x8 forward 1.0-1.1) and the ResNet-style model's 3x3 layers, to see
// whether the planner's choice (make_tma_plan: reduction split, blocks per SM, tile width) leaves
// time on the table, as dev/wgrad_plan_probe.cu does for the grad-weight. For each problem, pass
// and precision: the default plan's median ms and each forced plan's (10 timings of 4 queued
// launches), after a check of its output against the default's (relative L2, printed where above
// the precision's tolerance).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cstdio>
#include <string>

#include "conv_rows.h"
#include "ops/cuda/gemm/engine.h"

namespace {

using namespace tg;
using conv_rows::Problem;

void run(cuda::ConvPass pass, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& dy,
         const ConvShape& s, Precision precision, const cuda::EnginePolicy& policy) {
  cuda::KernelPolicy forced;
  forced.conv_variant = "engine";
  forced.engine = policy;
  cuda::KernelPolicyGuard guard(forced);
  conv_rows::run_pass(pass, out, x, w, dy, s, precision);
}

struct Forced {
  const char* name;
  cuda::EnginePolicy policy;
};

void time_problem(const Problem& pr) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", pr.x, pr.w, pr.p);
  const Forced forced[] = {
      {"s1", {.splits = 1}},  {"s2", {.splits = 2}},         {"s3", {.splits = 3}},
      {"s4", {.splits = 4}},  {"s6", {.splits = 6}},         {"b1", {.blocks_per_sm = 1}},
      {"b2", {.blocks_per_sm = 2}}, {"t64", {.tile = 64}},   {"t128", {.tile = 128}},
      {"t256", {.tile = 256}},
  };
  const Tensor x = uniform(s.x_shape(), -1, 1, {.device = gpu}), w = uniform(s.w_shape(), -1, 1, {.device = gpu});
  const Tensor dy = uniform(s.y_shape(), -1, 1, {.device = gpu});
  for (const conv_rows::Pass& pass : {conv_rows::kPasses[0], conv_rows::kPasses[1]}) {
    const Shape out_shape = pass.pass == cuda::ConvPass::Forward ? s.y_shape() : s.x_shape();
    const Tensor out = Tensor::empty(out_shape, {.device = gpu}), check = Tensor::empty(out_shape, {.device = gpu});
    for (const Precision precision : {Precision::TF32, Precision::FP32}) {
      const cuda::EnginePolicy by_default{};
      run(pass.pass, check, x, w, dy, s, precision, by_default);
      auto time = [&](const cuda::EnginePolicy& policy) {
        return probe_common::median_ms(10, [&] { run(pass.pass, out, x, w, dy, s, precision, policy); }, 4,
                                       cuda::stream(0));
      };
      const float base = time(by_default);
      std::string line;
      char buf[160];
      float best = base;
      const char* best_name = "default";
      for (const Forced& f : forced) {
        const bool tma = pass.pass == cuda::ConvPass::Forward
                             ? cuda::engine_conv_forward_uses_tma(s, x, precision, f.policy)
                             : cuda::engine_conv_grad_input_uses_tma(s, dy, precision, f.policy);
        if (!tma) continue;
        run(pass.pass, out, x, w, dy, s, precision, f.policy);
        const double err = probe_common::rel_l2(out, check);
        const float ms = time(f.policy);
        std::snprintf(buf, sizeof buf, " %s %.4f", f.name, ms);
        line += buf;
        if (err > (precision == Precision::FP32 ? 1e-5 : 2e-3)) {
          std::snprintf(buf, sizeof buf, " (differs by %.1e)", err);
          line += buf;
        }
        if (ms < best) {
          best = ms;
          best_name = f.name;
        }
      }
      std::printf("%s %s %s: default %.4f |%s | best %s x%.2f\n", pr.name, pass.name,
                  precision == Precision::FP32 ? "fp32" : "tf32", base, line.c_str(), best_name, best / base);
    }
  }
}

}  // namespace

int main() {
  const ConvParams p1{.padding = {1}}, s2{.stride = {2}, .padding = {1}};
  const Problem listed[] = {
      {"zoo 3x3 384 @16", {16, 384, 16, 16}, {384, 384, 3, 3}, p1},
      {"zoo 3x3 512 @8", {32, 512, 8, 8}, {512, 512, 3, 3}, p1},
      {"zoo c3d s2 64->128", {2, 64, 32, 32, 32}, {128, 64, 3, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"zoo 3x3 192 @32", {16, 192, 32, 32}, {192, 192, 3, 3}, p1},
      {"zoo nhwc 3x3 192 @32", {16, 32, 32, 192}, {192, 192, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"model 128->128 @32", {64, 128, 32, 32}, {128, 128, 3, 3}, p1},
      {"model 256->256 @16", {64, 256, 16, 16}, {256, 256, 3, 3}, p1},
      {"model 512->512 @8", {64, 512, 8, 8}, {512, 512, 3, 3}, p1},
      {"model 128->256 s2 @32", {64, 128, 32, 32}, {256, 128, 3, 3}, s2},
  };
  for (const Problem& p : listed) time_problem(p);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done (%s)\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
