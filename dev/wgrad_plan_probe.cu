// Experiment (not built by CMake): the engine's grad-weight on the ResNet-style model's layers
// (bench/zoo: x [64, 3, 64, 64], width 64) and the zoo's 3x3 rows under forced plans, to see
// whether the planner's choice (make_tma_plan: reduction split, blocks per SM, shifted rows or
// columns) leaves time on the table. For each problem and precision: the default plan's median
// ms and each forced plan's (10 timings of 4 queued launches), after a check of its output
// against the default's (relative L2, printed where above the precision's tolerance). The
// model's grad-weights are about a third of its TF32 step's convolution time.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cstdio>

#include "forced_plans.h"

namespace {

using namespace tg;
using conv_rows::Problem;
using forced_plans::ForcedPlan;

const ForcedPlan kPlans[] = {
    {"s1", {.splits = 1}},         {"s2", {.splits = 2}},           {"s3", {.splits = 3}},
    {"s4", {.splits = 4}},         {"s6", {.splits = 6}},           {"s8", {.splits = 8}},
    {"s12", {.splits = 12}},       {"b1", {.blocks_per_sm = 1}},    {"b2", {.blocks_per_sm = 2}},
    {"t64", {.tile = 64}},         {"cols", {.wgrad_shifted = -1}}, {"shift", {.wgrad_shifted = 1}},
    {"shift-s2", {.splits = 2, .wgrad_shifted = 1}}, {"shift-s4", {.splits = 4, .wgrad_shifted = 1}},
    // 128 x 256 tiles (a quarter fewer bytes per product), where the planner only takes them unsplit.
    {"t256", {.tile = 256}},       {"t256-s2", {.tile = 256, .splits = 2}}, {"t256-s4", {.tile = 256, .splits = 4}},
    {"t256-s8", {.tile = 256, .splits = 8}},
};

void time_problem(const Problem& pr) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", pr.x, pr.w, pr.p);
  const Tensor x = uniform(s.x_shape(), -1, 1, {.device = gpu}), dy = uniform(s.y_shape(), -1, 1, {.device = gpu});
  const Tensor dw = Tensor::empty(s.w_shape(), {.device = gpu});
  for (const Precision precision : {Precision::TF32, Precision::FP32}) {
    const bool shifted = cuda::engine_conv_grad_weight_uses_shifted_rows(s, dw, precision, false, {});
    forced_plans::time_plans(pr.name, shifted ? "/shifted" : "", kPlans, cuda::ConvPass::GradWeight, dw, x, Tensor(),
                             dy, s, precision, [&](const cuda::EnginePolicy& policy) {
                               return cuda::engine_conv_grad_weight_uses_tma(s, dw, precision, policy);
                             });
  }
}

}  // namespace

int main() {
  const ConvParams p1{.padding = {1}}, s2{.stride = {2}, .padding = {1}}, down{.stride = {2}};
  const Problem listed[] = {
      {"model 64->64 @64 (x4)", {64, 64, 64, 64}, {64, 64, 3, 3}, p1},
      {"model 64->128 s2 @64", {64, 64, 64, 64}, {128, 64, 3, 3}, s2},
      {"model 128->128 @32 (x3)", {64, 128, 32, 32}, {128, 128, 3, 3}, p1},
      {"model down 64->128 1x1 s2", {64, 64, 64, 64}, {128, 64, 1, 1}, down},
      {"model 128->256 s2 @32", {64, 128, 32, 32}, {256, 128, 3, 3}, s2},
      {"model 256->256 @16 (x3)", {64, 256, 16, 16}, {256, 256, 3, 3}, p1},
      {"model 256->512 s2 @16", {64, 256, 16, 16}, {512, 256, 3, 3}, s2},
      {"model 512->512 @8 (x3)", {64, 512, 8, 8}, {512, 512, 3, 3}, p1},
      {"zoo 3x3 192 @32", {16, 192, 32, 32}, {192, 192, 3, 3}, p1},
      {"zoo 3x3 384 @16", {16, 384, 16, 16}, {384, 384, 3, 3}, p1},
      {"zoo 3x3 512 @8", {32, 512, 8, 8}, {512, 512, 3, 3}, p1},
      {"zoo 3x3 s2 192->384", {16, 192, 32, 32}, {384, 192, 3, 3}, s2},
      {"zoo nhwc 3x3 192 @32", {16, 32, 32, 192}, {192, 192, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"zoo 7x7 s2 3->64 @224", {16, 3, 224, 224}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"zoo c3d s2 64->128", {2, 64, 32, 32, 32}, {128, 64, 3, 3, 3}, {.stride = {2}, .padding = {1}}},
  };
  for (const Problem& p : listed) time_problem(p);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done (%s)\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
