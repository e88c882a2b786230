// Experiment (not built by CMake): channels-first 1x1 forward and grad-input, the 1x1 row (on
// Hopper the streamed-weight kernel past 64 reduction channels, conv1x1/fprop_streamed_sm90.cu)
// against the engine (a transpose of the input, then its TMA product), over channel pairs
// 64..2048 and images 7x7..64x64 (batch for about 64K output pixels, and the zoo's rows). Sets
// the dispatcher's 1x1 channels-first rule (ops/cuda/conv.cu). Each row's output is checked
// against the engine's first (conv_rows.h).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <algorithm>
#include <cstdio>

#include "conv_rows.h"

using namespace tg;

int main() {
  const conv_rows::Pass passes[] = {conv_rows::kPasses[0], conv_rows::kPasses[1]};
  int misses = 0, problems = 0;
  const int64_t pairs[][2] = {{64, 128},  {96, 96},   {128, 128},  {96, 384},   {384, 96},  {256, 256},
                              {512, 512}, {1024, 256}, {256, 1024}, {512, 2048}, {2048, 512}};
  for (const auto& ck : pairs)
    for (int64_t size : {7, 14, 16, 28, 32, 64}) {
      const int64_t C = ck[0], K = ck[1], n = std::max<int64_t>(1, 65536 / (size * size));
      const ConvShape s = make_conv_shape("probe", {n, C, size, size}, {K, C, 1, 1}, {});
      char label[128];
      std::snprintf(label, sizeof label, "1x1 nchw %lldx%lld->%lld @%lldx%lld", static_cast<long long>(n),
                    static_cast<long long>(C), static_cast<long long>(K), static_cast<long long>(size),
                    static_cast<long long>(size));
      for (Precision precision : {Precision::TF32, Precision::FP32})
        for (const conv_rows::Pass& pass : passes) {
          misses += conv_rows::time_rows(label, s, pass, precision, /*direct=*/false);
          ++problems;
        }
    }
  const conv_rows::Problem zoo[] = {
      {"zoo 1x1 384->96 @32", {16, 384, 32, 32}, {96, 384, 1, 1}, {}},
      {"zoo 1x1 96->384 @32", {16, 96, 32, 32}, {384, 96, 1, 1}, {}},
      {"zoo 1x1 1024->256 @14", {32, 1024, 14, 14}, {256, 1024, 1, 1}, {}},
  };
  for (const auto& pr : zoo) {
    const ConvShape s = make_conv_shape("probe", pr.x, pr.w, pr.p);
    for (Precision precision : {Precision::TF32, Precision::FP32})
      for (const conv_rows::Pass& pass : passes) {
        misses += conv_rows::time_rows(pr.name, s, pass, precision, /*direct=*/false);
        ++problems;
      }
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %d of %d problems routed more than 10%% slower than the best row (%s)\n", misses, problems,
              e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
