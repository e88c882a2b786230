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

#include "forced_plans.h"

namespace {

using namespace tg;
using conv_rows::Problem;
using forced_plans::ForcedPlan;

const ForcedPlan kPlans[] = {
    {"s1", {.splits = 1}},        {"s2", {.splits = 2}},       {"s3", {.splits = 3}},
    {"s4", {.splits = 4}},        {"s6", {.splits = 6}},       {"b1", {.blocks_per_sm = 1}},
    {"b2", {.blocks_per_sm = 2}}, {"t64", {.tile = 64}},       {"t128", {.tile = 128}},
    {"t256", {.tile = 256}},
};

void time_problem(const Problem& pr) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", pr.x, pr.w, pr.p);
  const Tensor x = uniform(s.x_shape(), -1, 1, {.device = gpu}), w = uniform(s.w_shape(), -1, 1, {.device = gpu});
  const Tensor dy = uniform(s.y_shape(), -1, 1, {.device = gpu});
  for (const conv_rows::Pass& pass : {conv_rows::kPasses[0], conv_rows::kPasses[1]}) {
    const bool forward = pass.pass == cuda::ConvPass::Forward;
    const Tensor out = Tensor::empty(forward ? s.y_shape() : s.x_shape(), {.device = gpu});
    for (const Precision precision : {Precision::TF32, Precision::FP32})
      forced_plans::time_plans(std::string(pr.name) + " " + pass.name, "", kPlans, pass.pass, out, x, w, dy, s,
                               precision, [&](const cuda::EnginePolicy& policy) {
                                 return forward ? cuda::engine_conv_forward_uses_tma(s, x, precision, policy)
                                                : cuda::engine_conv_grad_input_uses_tma(s, dy, precision, policy);
                               });
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
