// The 1x1 forward product on Hopper with its tiles moved by the TMA unit, both layouts, TF32 and
// FP32-accurate (ops/cuda/conv1x1/fprop_sm90.cu has the design). conv1x1/fprop_sm80.cu hands it the
// shapes it serves and keeps every other case.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace tg::cuda {

// y = A x (+ bias) at every pixel, A(m, r) = w[m * w_stride_m + r * w_stride_r] (M x R):
//   NCHW: x (images, R, pixels), y (images, M, pixels);
//   NHWC: x (images * pixels, R), y (images * pixels, M).
// split: FP32-accurate (each operand as a TF32 hi plus a TF32 lo, three products); otherwise
// TF32 (operands rounded to nearest TF32), FP32 accumulation either way.
struct PointwiseTmaProblem {
  float* y;
  const float* x;
  const float* w;
  int64_t w_stride_m, w_stride_r;
  const float* bias;  // M values, or nullptr
  int64_t images, pixels, M, R;
  bool nchw, split;
};

// Whether a Hopper kernel serves q on device dev: it runs sm_90a code, x and y are 16-byte
// aligned, their rows are whole 16-byte units (NCHW: pixels % 4 == 0; NHWC: R and M multiples
// of 4), TMA's 32-bit coordinates reach every tile, and either 1 <= R <= 64 (the weight resident
// in shared memory, both layouts) or q is NCHW (any R: the weight streamed,
// conv1x1/fprop_streamed_sm90.cu). Channels-last products past 64 reduction channels are the
// engine's.
bool pointwise_tma_applies(const PointwiseTmaProblem& q, int dev);

// Runs q ordered on st: the resident kernel up to 64 reduction channels (unless stream_weight),
// else the streamed one. Throws unless pointwise_tma_applies.
void pointwise_tma(const PointwiseTmaProblem& q, int dev, cudaStream_t st, bool stream_weight = false);

// The streamed-weight kernel alone (NCHW, any R >= 1): whether it serves q, and the pass. Its
// weight is first written, reordered and rounded, to a scratch on the framework's pool.
bool pointwise_tma_streamed_applies(const PointwiseTmaProblem& q, int dev);
void pointwise_tma_streamed(const PointwiseTmaProblem& q, int dev, cudaStream_t st);

}  // namespace tg::cuda
