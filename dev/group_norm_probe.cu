// Experiment (not built by CMake): where does group_norm's time go on a GPU? The ResNet example's
// profile (bench/journal/notes_engine_sm90.md) has the backward at ~0.065 ms per call at batch
// 128, about twice what its fused kernel's traffic needs. This times, at the ResNet-18-style
// model's GroupNorm(32) shapes (batch 128 at 32x32 and batch 64 at 64x64 images), the forward,
// the backward with every gradient, and the backward without dgamma / dbeta (which skips the
// pass that sums the per-image terms over the batch): the difference is that pass's cost.
// GB/s count the minimum traffic (forward: x read, y written; backward: x, dy read, dx written).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cstdio>

#include "core/cuda_context.h"
#include "core/tensor.h"
#include "ops/cuda/norm.h"
#include "probe_common.h"

namespace {

using namespace tg;

void probe(int64_t N, int64_t C, int64_t H, int64_t groups) {
  const Device gpu = Device::cuda(0);
  const TensorOptions o{.dtype = DType::f32, .device = gpu};
  const GroupNormProblem p{.N = N, .C = C, .HW = H * H, .groups = groups, .eps = 1e-5};
  const Tensor x = uniform({N, C, H, H}, -1, 1, o), dy = uniform({N, C, H, H}, -1, 1, o);
  const Tensor gamma = uniform({C}, 0.5, 1.5, o), beta = uniform({C}, -1, 1, o);
  Tensor y = Tensor::empty({N, C, H, H}, o), dx = Tensor::empty({N, C, H, H}, o);
  Tensor mean = Tensor::empty({N, groups}, o), rstd = Tensor::empty({N, groups}, o);
  Tensor dgamma = Tensor::empty({C}, o), dbeta = Tensor::empty({C}, o);
  cudaStream_t s = cuda::stream(0);
  const float fwd = probe_common::median_ms(
      11, [&] { cuda::group_norm_forward(y, mean, rstd, x, gamma, beta, p); }, 4, s);
  const float bwd = probe_common::median_ms(
      11, [&] { cuda::group_norm_backward(dx, dgamma, dbeta, dy, x, gamma, mean, rstd, p); }, 4, s);
  const float bwd_dx = probe_common::median_ms(
      11, [&] { cuda::group_norm_backward(dx, Tensor(), Tensor(), dy, x, gamma, mean, rstd, p); }, 4, s);
  const double bytes = double(x.numel()) * 4;
  std::printf("N %3lld C %3lld %3lldx%-3lld groups %lld: forward %.4f ms (%.0f GB/s), backward %.4f ms (%.0f GB/s), "
              "without dgamma/dbeta %.4f ms: their pass %.4f ms\n",
              static_cast<long long>(N), static_cast<long long>(C), static_cast<long long>(H),
              static_cast<long long>(H), static_cast<long long>(groups), fwd, 2 * bytes / fwd / 1e6, bwd,
              3 * bytes / bwd / 1e6, bwd_dx, bwd - bwd_dx);
}

}  // namespace

int main() {
  // The model's four stages: width 64, 128, 256, 512 at a half, a quarter, an eighth of the
  // image side each time (64 at the full side).
  for (const int64_t side : {32, 64})
    for (int stage = 0; stage < 4; ++stage) probe(side == 32 ? 128 : 64, int64_t{64} << stage, side >> stage, 32);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %s\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
