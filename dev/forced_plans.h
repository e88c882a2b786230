// The engine's passes under forced plans (dev/ probes; not built by CMake): wgrad_plan_probe.cu
// (grad-weight) and data_plan_probe.cu (forward, grad-input) time one problem under the default
// EnginePolicy and under each forced one, to see whether the planner leaves time on the table.
#pragma once
#include <cstdio>
#include <exception>
#include <span>
#include <string>

#include "conv_rows.h"
#include "ops/cuda/gemm/engine.h"

namespace forced_plans {

using namespace tg;

struct ForcedPlan {
  const char* name;
  cuda::EnginePolicy policy;
};

// One pass through the engine row under `policy`.
inline void run_engine(cuda::ConvPass pass, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& dy,
                       const ConvShape& s, Precision precision, const cuda::EnginePolicy& policy) {
  cuda::KernelPolicy forced;
  forced.conv_variant = "engine";
  forced.engine = policy;
  cuda::KernelPolicyGuard guard(forced);
  conv_rows::run_pass(pass, out, x, w, dy, s, precision);
}

// Times the pass into `out` (median of 10 timings of 4 queued launches) under the default policy
// and under every plan for which uses_tma(policy) holds (the TMA kernel runs it), after checking
// each plan's output against the default's (relative L2, noted where above the precision's
// tolerance); a plan the kernels refuse (an exception) is noted and skipped. Prints one line:
// label, the default's ms (default_note after "default"), every plan's, and the best.
template <class UsesTma>
void time_plans(const std::string& label, const char* default_note, std::span<const ForcedPlan> plans,
                cuda::ConvPass pass, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& dy,
                const ConvShape& s, Precision precision, UsesTma&& uses_tma) {
  const Tensor check = Tensor::empty(out.shape(), {.device = out.device()});
  const cuda::EnginePolicy by_default{};
  run_engine(pass, check, x, w, dy, s, precision, by_default);
  auto time = [&](const cuda::EnginePolicy& policy) {
    return probe_common::median_ms(10, [&] { run_engine(pass, out, x, w, dy, s, precision, policy); }, 4,
                                   cuda::stream(0));
  };
  const float base = time(by_default);
  std::string line;
  char buf[160];
  float best = base;
  const char* best_name = "default";
  for (const ForcedPlan& f : plans) {
    if (!uses_tma(f.policy)) continue;
    try {
      run_engine(pass, out, x, w, dy, s, precision, f.policy);
    } catch (const std::exception&) {  // a plan the kernels refuse: say so, go on
      line += std::string(" ") + f.name + " (refused)";
      continue;
    }
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
  std::printf("%s %s: default%s %.4f |%s | best %s x%.2f\n", label.c_str(),
              precision == Precision::FP32 ? "fp32" : "tf32", default_note, base, line.c_str(), best_name,
              best / base);
}

}  // namespace forced_plans
