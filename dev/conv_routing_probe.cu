// Experiment (not built by CMake): where does each row of the convolution dispatcher's table
// win? The table's `preferred` rules (ops/cuda/conv.cu) were set from a few measured shapes;
// this times every row that can implement a problem over a grid of ordinary shapes, so that
// the crossovers come from a sweep rather than from the benchmark's listed rows.
//
// Grid: NCHW 3x3 stride 1 (the 3x3 kernels against the engine), NCHW and NHWC 1x1 stride 1 (the
// 1x1 kernels against the engine); channels 32..512 in and out (and 64 <-> 256, 96 <-> 384);
// images 8x8 .. 256x256 with the batch chosen for about 64K output pixels; the forward,
// grad-input and grad-weight passes; TF32 and FP32. For each problem: every row's time (median
// of 10 timings of 4 queued launches, ms), the row the default order takes, and "MISS" where
// another row is more than 10% faster. Each row's output is first compared with the engine's
// (relative L2, printed when above the precision's tolerance: a wrong row would make its time
// meaningless).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cmath>
#include <cstdio>
#include <algorithm>
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

struct Pass {
  const char* name;
  cuda::ConvPass pass;
};
const Pass kPasses[] = {{"fwd", cuda::ConvPass::Forward}, {"dgrad", cuda::ConvPass::GradInput},
                        {"wgrad", cuda::ConvPass::GradWeight}};

using probe_common::rel_l2;

void run_pass(cuda::ConvPass pass, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& dy,
              const ConvShape& s, Precision precision) {
  switch (pass) {
    case cuda::ConvPass::Forward: return cuda::conv_forward(out, x, w, Tensor(), s, precision);
    case cuda::ConvPass::GradInput: return cuda::conv_grad_input(out, dy, w, s, precision);
    case cuda::ConvPass::GradWeight: return cuda::conv_grad_weight(out, dy, x, s, precision);
  }
}

void sweep(const char* family, int64_t kernel, Layout layout, int& misses, int& problems) {
  const Device gpu = Device::cuda(0);
  const int64_t channel_pairs[][2] = {{32, 32},  {64, 64},  {96, 96},  {128, 128}, {192, 192}, {256, 256},
                                      {512, 512}, {64, 256}, {256, 64}, {96, 384},  {384, 96}};
  for (const auto& ck : channel_pairs)
    for (int64_t size : {8, 16, 32, 64, 128, 256}) {
      const int64_t C = ck[0], K = ck[1], n = std::max<int64_t>(1, 65536 / (size * size));
      const Shape x_shape = layout == Layout::NHWC ? Shape{n, size, size, C} : Shape{n, C, size, size};
      const ConvShape s = make_conv_shape("probe", x_shape, {K, C, kernel, kernel},
                                          {.padding = {kernel / 2}, .layout = layout});
      const Tensor x = uniform(x_shape, -1, 1, {.device = gpu}), w = uniform(s.w_shape(), -1, 1, {.device = gpu});
      const Tensor dy = uniform(s.y_shape(), -1, 1, {.device = gpu});
      for (Precision precision : {Precision::TF32, Precision::FP32})
        for (const Pass& pass : kPasses) {
          const Shape out_shape = pass.pass == cuda::ConvPass::Forward     ? s.y_shape()
                                  : pass.pass == cuda::ConvPass::GradInput ? x_shape
                                                                           : s.w_shape();
          const cuda::ConvProblem problem = cuda::conv_problem(s, DType::f32, pass.pass, precision);
          const Tensor out = Tensor::empty(out_shape, {.device = gpu}), check = Tensor::empty(out_shape, {.device = gpu});
          cuda::ConvOperands operands{.out = out, .x = x, .w = w, .dy = dy};
          const std::string chosen(cuda::choose_conv_variant(problem, operands).name);  // the default policy's row
          {
            cuda::KernelPolicy engine;
            engine.conv_variant = "engine";
            cuda::KernelPolicyGuard guard(engine);
            run_pass(pass.pass, check, x, w, dy, s, precision);
          }
          std::string line;
          double best = 1e30, chosen_ms = 0;
          std::string best_row;
          for (const auto& row : cuda::conv_variants()) {
            if (row.name == "direct" || !row.can_implement(problem, operands)) continue;
            cuda::KernelPolicy forced;
            forced.conv_variant = row.name;
            cuda::KernelPolicyGuard guard(forced);
            run_pass(pass.pass, out, x, w, dy, s, precision);
            const double err = rel_l2(out, check);
            const float ms = probe_common::median_ms(10, [&] { run_pass(pass.pass, out, x, w, dy, s, precision); }, 4,
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
          misses += miss;
          ++problems;
          std::printf("%s %s %lldx%lld->%lld @%lldx%lld %s %s: default %s |%s%s\n", family,
                      layout == Layout::NHWC ? "nhwc" : "nchw", static_cast<long long>(n), static_cast<long long>(C),
                      static_cast<long long>(K), static_cast<long long>(size), static_cast<long long>(size), pass.name,
                      precision == Precision::FP32 ? "fp32" : "tf32", chosen.c_str(), line.c_str(),
                      miss ? ("  MISS (best " + best_row + ")").c_str() : "");
        }
    }
}

}  // namespace

int main() {
  int misses = 0, problems = 0;
  sweep("3x3", 3, Layout::NCHW, misses, problems);
  sweep("1x1", 1, Layout::NCHW, misses, problems);
  sweep("1x1", 1, Layout::NHWC, misses, problems);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %d of %d problems routed more than 10%% slower than the best row (%s)\n", misses, problems,
              e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
