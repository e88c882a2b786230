// The fixed-order reduction of split grad-weight partials, shared by the grad-weight kernels of
// the 3x3 (conv3x3/wgrad_sm80.cu mma.sync, conv3x3/wgrad_tf32_sm90.cu wgmma) and 1x1 (conv1x1/backward_sm80.cu)
// fast paths: each block of those writes its slice's sum into part[split], and this kernel adds
// the slices in split order, so the result is the same bits on every run (no atomics).
#pragma once
#include <cstdint>

#include "../../core/cuda_context.h"
#include "../../core/tensor.h"

namespace tg::cuda {
namespace {

// dw[e] = sum over splits of part[split][e], in split order (f64: the sum adds no error).
__global__ void sum_partials_kernel(float* __restrict__ dw, const float* __restrict__ part, int64_t count,
                                    int64_t splits) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x) {
    double sum = 0;
    for (int64_t s = 0; s < splits; ++s) sum += part[s * count + e];
    dw[e] = static_cast<float>(sum);
  }
}

// Where a split reduction's kernel writes: straight into dw when there is one slice, else into
// `scratch` (splits, dw.numel()), allocated here (freed stream-ordered after the kernels using it).
inline float* partial_slices(Tensor& scratch, const Tensor& dw, int64_t splits) {
  if (splits == 1) return dw.data<float>();
  scratch = Tensor::empty({splits, dw.numel()}, {.dtype = DType::f32, .device = dw.device()});
  return scratch.data<float>();
}

// dw (count floats) = the sum of the slices at `part` in slice order; nothing to do for one slice
// written straight into dw.
inline void sum_partials(float* dw, const float* part, int64_t count, int64_t splits, cudaStream_t stream) {
  if (part == dw) return;
  constexpr int kThreads = 256;
  sum_partials_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(dw, part, count, splits);
  TG_LAUNCH_CHECK();
}

}  // namespace
}  // namespace tg::cuda
