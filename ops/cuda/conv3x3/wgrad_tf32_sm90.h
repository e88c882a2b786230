// TF32 grad-weight of 3x3, stride-1, dilation-1 2-D convolutions in NCHW on Hopper's warpgroup
// MMA with both operands in shared memory (wgmma SS, sm_90a): dw = sum over images and output
// pixels of dy x shifted x, as a GEMM with M = 64 output channels, N = 3 column taps x 64 input
// channels, reduction = the pixels of an output row, read from NCHW rows directly
// (ops/cuda/conv3x3/wgrad_tf32_sm90.cu explains the design). conv3x3_grad_weight (ops/cuda/conv3x3/conv3x3.h)
// routes here in TF32 mode when conv3x3_wgmma_dw_applies says so. Results are the same bits on
// every run (per-block partials summed in a fixed order; no atomics).
#pragma once
#include "../../../core/device.h"
#include "../../../core/precision.h"
#include "../../../core/tensor.h"
#include "../../conv.h"

namespace tg::cuda {

// True when precision (by default tg::precision() at the call) is Precision::TF32,
// conv3x3_applies(s) (3x3, stride 1, dilation 1,
// NCHW 2-D, any padding, batch, spatial sizes and channel counts), d is a GPU of compute
// capability 9.0 and this build carries the sm_90a code for it. Ask and launch under the same
// precision. The dtype (f32) is the caller's to check. TF32 products: dy rounded, x truncated by
// the tensor core (rel. L2 error ~4e-4; the .cu explains).
bool conv3x3_wgmma_dw_applies(const ConvShape& s, Device d, Precision precision = tg::precision());

// dw (K, C, 3, 3) = gradient of the output dy (N, K, Ho, Wo) with respect to the weights of the
// convolution of x (N, C, H, W) (overwritten).
void conv3x3_wgmma_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                               Precision precision = tg::precision());

}  // namespace tg::cuda
