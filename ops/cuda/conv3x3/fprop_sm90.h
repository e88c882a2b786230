// Fast path (TF32 and FP32-accurate) for 3x3, stride-1, dilation-1 2-D convolutions in NCHW on Hopper's
// asynchronous warpgroup MMA (wgmma, sm_90a): the forward pass and the input gradient, as
// implicit GEMMs reading NCHW directly (ops/cuda/conv3x3/fprop_sm90.cu explains the design).
// conv3x3_forward / conv3x3_grad_input (ops/cuda/conv3x3/conv3x3.h) route here when
// conv3x3_wgmma_applies says so; every other case keeps the mma.sync kernels.
// Results are the same bits on every run (no atomics).
#pragma once
#include "../../../core/device.h"
#include "../../../core/precision.h"
#include "../../../core/tensor.h"
#include "../../conv.h"

namespace tg::cuda {

// True when conv3x3_applies(s) (3x3, stride 1, dilation 1, NCHW 2-D, any padding, batch,
// spatial sizes and channel counts; in Precision::FP32 at most 128 channels each way), d is a GPU of compute
// capability 9.0 and this build carries the sm_90a code for it. Ask and launch with the same
// precision (TF32: TF32 products; FP32: split products, rel. error ~1e-6; by default
// tg::precision() at the call). The dtype (f32) is the caller's to check.
bool conv3x3_wgmma_applies(const ConvShape& s, Device d, Precision precision = tg::precision());

// y (N, K, Ho, Wo) = conv(x (N, C, H, W), w (K, C, 3, 3)) + b (K) or no bias (undefined b).
void conv3x3_wgmma_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                           Precision precision = tg::precision());
// dx (N, C, H, W) = gradient of the output dy (N, K, Ho, Wo) with respect to x (overwritten).
void conv3x3_wgmma_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                              Precision precision = tg::precision());

}  // namespace tg::cuda
