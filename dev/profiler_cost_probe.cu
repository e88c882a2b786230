// Experiment (not built by CMake): where do the ~4.5 us per recorded op of tg::Profiler go on
// a GPU (bench/RESULTS.md, "Profiler overhead")? Host microseconds per call of each CUDA call
// the profiler makes per op, on a stream kept busy with small kernels like a training step's,
// and the profiler itself on a chain of small relus (off, on, off again).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include "core/cuda_context.h"
#include "core/profiler.h"
#include "ops/elementwise.h"

namespace {

__global__ void spin(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 0.999f + 1.f;
}

// Host microseconds per call of fn, each call after one small kernel on `s` (the stream stays
// busy, as in a step).
double us_per_call(cudaStream_t s, float* buf, int n, const std::function<void(int)>& fn) {
  for (int i = 0; i < 100; ++i) {
    spin<<<4, 256, 0, s>>>(buf, 1024);
    fn(i);
  }
  cudaStreamSynchronize(s);
  double with = 0, without = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      spin<<<4, 256, 0, s>>>(buf, 1024);
      if (pass == 0) fn(i);
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    cudaStreamSynchronize(s);
    (pass == 0 ? with : without) = us / n;
  }
  return with - without;
}

}  // namespace

int main() {
  const int dev = 0;
  tg::cuda::set_device(dev);
  cudaStream_t s = tg::cuda::stream(dev);
  float* buf;
  cudaMalloc(&buf, 4096 * 4);
  const int n = 20000;
  std::vector<cudaEvent_t> ev(2 * n + 200);
  for (auto& e : ev) cudaEventCreate(&e);

  std::printf("host us per call, stream busy with small kernels:\n");
  std::printf("  cudaEventRecord (timing event)    %.3f\n", us_per_call(s, buf, n, [&](int i) { cudaEventRecord(ev[i], s); }));
  std::printf("  two cudaEventRecord               %.3f\n", us_per_call(s, buf, n, [&](int i) {
                cudaEventRecord(ev[2 * i], s);
                cudaEventRecord(ev[2 * i + 1], s);
              }));
  std::printf("  cudaEventCreate + cudaEventDestroy %.3f\n", us_per_call(s, buf, n, [&](int) {
                cudaEvent_t e;
                cudaEventCreate(&e);
                cudaEventDestroy(e);
              }));
  cudaDeviceSynchronize();
  std::printf("  cudaEventElapsedTime (completed)  %.3f\n",
              us_per_call(s, buf, n, [&](int i) { float ms; cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]); }));
  std::printf("  nvtxRangePushA + nvtxRangePop     %.3f\n", us_per_call(s, buf, n, [&](int) {
                nvtxRangePushA("relu");
                nvtxRangePop();
              }));
  std::printf("  cudaGetLastError                  %.3f\n", us_per_call(s, buf, n, [&](int) { cudaGetLastError(); }));
  std::printf("  cudaFuncSetAttribute (same size)  %.3f\n", us_per_call(s, buf, n, [&](int) {
                cudaFuncSetAttribute(spin, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
              }));
  std::printf("  tg::cuda::allow_dynamic_smem      %.3f\n", us_per_call(s, buf, n, [&](int) {
                tg::cuda::allow_dynamic_smem(spin, 64 * 1024);
              }));

  // The profiler on a chain of relus on 256 floats (a kernel per op, like a small model's).
  tg::Tensor x = tg::randn({256}, {.device = tg::Device::cuda(0)});
  auto chain = [&](int ops) {
    tg::Tensor y = x;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < ops; ++i) y = tg::relu(y);
    cudaStreamSynchronize(s);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / ops;
  };
  chain(2000);
  const double off = chain(20000);
  double on;
  {
    tg::Profiler prof;
    on = chain(20000);
    prof.stop();
  }
  const double off2 = chain(20000);
  std::printf("relu chain, us per op: off %.3f, profiler on %.3f, off again %.3f\n", off, on, off2);
  std::printf("probe done: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
