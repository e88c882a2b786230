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
#include <algorithm>
#include <cstdio>
#include <string>

#include "conv_rows.h"

namespace {

using namespace tg;

void sweep(const char* family, int64_t kernel, Layout layout, int& misses, int& problems) {
  const int64_t channel_pairs[][2] = {{32, 32},  {64, 64},  {96, 96},  {128, 128}, {192, 192}, {256, 256},
                                      {512, 512}, {64, 256}, {256, 64}, {96, 384},  {384, 96}};
  for (const auto& ck : channel_pairs)
    for (int64_t size : {8, 16, 32, 64, 128, 256}) {
      const int64_t C = ck[0], K = ck[1], n = std::max<int64_t>(1, 65536 / (size * size));
      const Shape x_shape = layout == Layout::NHWC ? Shape{n, size, size, C} : Shape{n, C, size, size};
      const ConvShape s = make_conv_shape("probe", x_shape, {K, C, kernel, kernel},
                                          {.padding = {kernel / 2}, .layout = layout});
      char label[128];
      std::snprintf(label, sizeof label, "%s %s %lldx%lld->%lld @%lldx%lld", family,
                    layout == Layout::NHWC ? "nhwc" : "nchw", static_cast<long long>(n), static_cast<long long>(C),
                    static_cast<long long>(K), static_cast<long long>(size), static_cast<long long>(size));
      for (Precision precision : {Precision::TF32, Precision::FP32})
        for (const conv_rows::Pass& pass : conv_rows::kPasses) {
          misses += conv_rows::time_rows(label, s, pass, precision, /*direct=*/false);
          ++problems;
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
