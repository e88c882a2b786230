// The channels-last 1x1 forward product y (rows, M) = x (rows, R) A^T + bias on Hopper, TF32,
// with its tiles moved by the TMA unit (ops/cuda/conv1x1_nhwc_tma.cu has the design). conv1x1.cu
// hands it the shapes it serves and keeps every other case.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace tg::cuda {

// Whether the kernel serves y (rows, M) = x (rows, R) A^T on device dev: it runs sm_90a code,
// R <= 64, R and M are multiples of 4 (16-byte rows), x and y are 16-byte aligned and
// rows < 2^31 - 128 (TMA coordinates are 32-bit).
bool pointwise_nhwc_tma_applies(const float* y, const float* x, int64_t rows, int64_t M, int64_t R, int dev);

// y (rows, M) = x (rows, R) A^T (+ bias[m] if bias != nullptr), A(m, r) = w[m * w_stride_m +
// r * w_stride_r], in TF32 (x and A rounded to nearest TF32, FP32 accumulation), ordered on st.
// Throws unless pointwise_nhwc_tma_applies.
void pointwise_nhwc_tma(float* y, const float* x, const float* w, int64_t w_stride_m, int64_t w_stride_r,
                        const float* bias, int64_t rows, int64_t M, int64_t R, int dev, cudaStream_t st);

}  // namespace tg::cuda
