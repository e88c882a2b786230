// Experiment (not built by CMake): the few-channel grad-inputs that run far from their floor
// (the 7x7 s2 3 -> 64 stem at 224x224, batch 16: 0.553 ms at TF32 on an H200 against ~70 us of
// memory traffic; Conv3d 32 -> 1 at 64^3, batch 2: 0.196 ms against ~30 us), each run three
// times at TF32 and FP32, so that a per-kernel profiler splits the time between the transposes
// (the weights; NCHW dy), the columns product and the tap gather (dgrad_columns.cu):
//
//   ncu --metrics gpu__time_duration.sum --print-summary per-kernel build-gpu/dgrad_split_probe --once
//
// Without --once it also prints each pass's median time (10 timings of 4 queued passes).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cstdio>
#include <cstring>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "ops/conv.h"
#include "ops/cuda/conv.h"
#include "probe_common.h"

namespace {

using namespace tg;

bool g_once = false;

void measure(const char* name, const Shape& x_shape, const Shape& w_shape, const ConvParams& p) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", x_shape, w_shape, p);
  const Tensor w = uniform(w_shape, -1, 1, {.device = gpu}), dy = uniform(s.y_shape(), -1, 1, {.device = gpu});
  const Tensor dx = Tensor::empty(x_shape, {.device = gpu});
  for (Precision precision : {Precision::TF32, Precision::FP32}) {
    auto pass = [&] { cuda::conv_grad_input(dx, dy, w, s, precision); };
    for (int i = 0; i < 3; ++i) pass();  // what a per-kernel profiler sees
    if (g_once) continue;
    const float ms = probe_common::median_ms(10, pass, 4, cuda::stream(0));
    std::printf("%s dgrad %s: %.4f ms\n", name, precision == Precision::FP32 ? "fp32" : "tf32", ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  g_once = argc > 1 && std::strcmp(argv[1], "--once") == 0;
  measure("7x7 s2 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}});
  measure("3d 3x3x3 32->1 @64^3 b2", {2, 1, 64, 64, 64}, {32, 1, 3, 3, 3}, {.padding = {1}});
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %s\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
