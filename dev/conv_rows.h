// The conv dispatcher's rows timed side by side on one problem (dev/ probes; not built by
// CMake): conv_routing_probe.cu sweeps ordinary shapes, tiny_conv_probe.cu small training steps'.
#pragma once
#include <cstdio>
#include <span>
#include <string>

#include "core/cuda_context.h"
#include "core/tensor.h"
#include "ops/conv.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv_variants.h"
#include "ops/cuda/policy.h"
#include "probe_common.h"

namespace conv_rows {

using namespace tg;

struct Pass {
  const char* name;
  cuda::ConvPass pass;
};
inline constexpr Pass kPasses[] = {{"fwd", cuda::ConvPass::Forward},
                                   {"dgrad", cuda::ConvPass::GradInput},
                                   {"wgrad", cuda::ConvPass::GradWeight}};

inline void run_pass(cuda::ConvPass pass, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& dy,
                     const ConvShape& s, Precision precision) {
  switch (pass) {
    case cuda::ConvPass::Forward: return cuda::conv_forward(out, x, w, Tensor(), s, precision);
    case cuda::ConvPass::GradInput: return cuda::conv_grad_input(out, dy, w, s, precision);
    case cuda::ConvPass::GradWeight: return cuda::conv_grad_weight(out, dy, x, s, precision);
  }
}

// Times every row that implements (s, pass, precision) (the direct kernels too where `direct`),
// each after a check against the engine's output (relative L2, printed above the precision's
// tolerance: a wrong row's time means nothing), and prints one line: the default policy's row,
// every row's median ms (10 timings of `queued` launches back to back: 4 times the GPU's own
// work, 1 includes the launch), and MISS where another row is more than 10% faster. Returns
// whether it was a miss.
inline bool time_rows(const char* label, const ConvShape& s, const Pass& pass, Precision precision, bool direct,
                      int queued = 4) {
  const Device gpu = Device::cuda(0);
  const Tensor x = uniform(s.x_shape(), -1, 1, {.device = gpu}), w = uniform(s.w_shape(), -1, 1, {.device = gpu});
  const Tensor dy = uniform(s.y_shape(), -1, 1, {.device = gpu});
  const Shape out_shape = pass.pass == cuda::ConvPass::Forward     ? s.y_shape()
                          : pass.pass == cuda::ConvPass::GradInput ? s.x_shape()
                                                                   : s.w_shape();
  const cuda::ConvProblem problem = cuda::conv_problem(s, DType::f32, pass.pass, precision);
  const Tensor out = Tensor::empty(out_shape, {.device = gpu}), check = Tensor::empty(out_shape, {.device = gpu});
  const cuda::ConvOperands operands{.out = out, .x = x, .w = w, .dy = dy};
  const std::string chosen(cuda::choose_conv_variant(problem, operands).name);  // the default policy's row
  {
    cuda::KernelPolicy engine;
    engine.conv_variant = "engine";
    cuda::KernelPolicyGuard guard(engine);
    run_pass(pass.pass, check, x, w, dy, s, precision);
  }
  std::string line, best_row;
  double best = 1e30, chosen_ms = 0;
  for (const auto& row : cuda::conv_variants()) {
    if ((row.name == "direct" && !direct) || !row.can_implement(problem, operands)) continue;
    cuda::KernelPolicy forced;
    forced.conv_variant = row.name;
    cuda::KernelPolicyGuard guard(forced);
    run_pass(pass.pass, out, x, w, dy, s, precision);
    const double err = probe_common::rel_l2(out, check);
    const float ms = probe_common::median_ms(10, [&] { run_pass(pass.pass, out, x, w, dy, s, precision); }, queued,
                                             cuda::stream(0));
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s %.4f", std::string(row.name).c_str(), ms);
    line += buf;
    if (err > (precision == Precision::FP32 ? 1e-5 : 2e-3)) {
      std::snprintf(buf, sizeof buf, " (differs from the engine by %.1e)", err);
      line += buf;
    }
    if (ms < best) {
      best = ms;
      best_row = row.name;
    }
    if (row.name == chosen) chosen_ms = ms;
  }
  const bool miss = chosen_ms > 1.1 * best;
  std::printf("%s %s %s: default %s |%s%s\n", label, pass.name, precision == Precision::FP32 ? "fp32" : "tf32",
              chosen.c_str(), line.c_str(), miss ? ("  MISS (best " + best_row + ")").c_str() : "");
  return miss;
}

// A probe's problem: x and w shapes in the layout of p.
struct Problem {
  const char* name;
  Shape x, w;
  ConvParams p;
};

// time_rows on every problem, at TF32 and FP32, for each of `passes`; then the count of
// problems routed more than 10% slower than their best row. Returns the probe's exit status
// (0 unless the GPU reported an error).
inline int time_problems(std::span<const Problem> problems, std::span<const Pass> passes, bool direct) {
  int misses = 0, count = 0;
  for (const Problem& pr : problems) {
    const ConvShape s = make_conv_shape("probe", pr.x, pr.w, pr.p);
    for (Precision precision : {Precision::TF32, Precision::FP32})
      for (const Pass& pass : passes) {
        misses += time_rows(pr.name, s, pass, precision, direct);
        ++count;
      }
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %d of %d problems routed more than 10%% slower than the best row (%s)\n", misses, count,
              e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}

}  // namespace conv_rows
