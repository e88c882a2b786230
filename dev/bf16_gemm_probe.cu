// Experiment (not built by CMake): the engine's BF16 matrix product (engine_gemm_bf16, the TMA
// kernel with bf16 boxes) against its TF32 product on f32 copies of the same operands, on
// Linear's forward shapes (c = a b^T, a (M, K), b (N, K)); and Linear under Autocast(bf16)
// (casts included) against the f32 Linear at TF32. Per shape: median ms of 20 timings of 4
// queued launches, TFLOP/s, and the relative L2 distance between the BF16 and TF32 outputs
// (both from the same bf16 values: only the accumulation order differs).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cmath>
#include <cstdio>

#include "core/autocast.h"
#include "core/cuda_context.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "ops/cuda/gemm/engine.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/reduce.h"
#include "probe_common.h"

namespace {

using namespace tg;

using probe_common::rel_l2;

void measure(int64_t M, int64_t N, int64_t K) {
  const Device gpu = Device::cuda(0);
  const GemmProblem p{.M = M, .N = N, .K = K, .transB = true};
  const Tensor a = uniform({M, K}, -1, 1, {.dtype = DType::bf16, .device = gpu});
  const Tensor b = uniform({N, K}, -1, 1, {.dtype = DType::bf16, .device = gpu});
  const Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32);
  const Tensor c = Tensor::empty({M, N}, {.device = gpu}), c32 = Tensor::empty({M, N}, {.device = gpu});
  auto bf16 = [&] { cuda::engine_gemm_bf16(c, a, b, Tensor(), p); };
  auto tf32 = [&] { cuda::engine_gemm(c32, a32, b32, Tensor(), p, Precision::TF32); };
  bf16();
  tf32();
  const double err = rel_l2(c, c32);
  const float ms_bf16 = probe_common::median_ms(20, bf16, 4, cuda::stream(0));
  const float ms_tf32 = probe_common::median_ms(20, tf32, 4, cuda::stream(0));
  // Linear as a user calls it: f32 x and w, under Autocast (casts and rounding included).
  const Tensor x = a32, w = b32;
  Tensor y;
  auto autocast_linear = [&] {
    Autocast ac(DType::bf16);
    y = linear(x, w);
  };
  auto f32_linear = [&] {
    PrecisionGuard tf(Precision::TF32);
    y = linear(x, w);
  };
  const float ms_auto = probe_common::median_ms(20, autocast_linear, 4, cuda::stream(0));
  const float ms_f32 = probe_common::median_ms(20, f32_linear, 4, cuda::stream(0));
  const double flops = 2.0 * double(M) * double(N) * double(K);
  std::printf("%lld x %lld x %lld: engine bf16 %.4f ms (%.0f TFLOP/s), tf32 %.4f ms (%.0f TFLOP/s), bf16/tf32 %.2f, "
              "outputs differ by %.1e | linear: autocast bf16 %.4f ms, f32 at tf32 %.4f ms\n",
              static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), ms_bf16,
              flops / ms_bf16 * 1e-9, ms_tf32, flops / ms_tf32 * 1e-9, ms_bf16 / ms_tf32, err, ms_auto, ms_f32);
}

}  // namespace

int main() {
  measure(8192, 3072, 768);
  measure(8192, 768, 3072);
  measure(4096, 4096, 4096);
  measure(8192, 8192, 8192);
  measure(64, 4096, 4096);
  measure(1, 4096, 11008);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %s\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
