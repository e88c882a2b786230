// TF32 fast path for 3x3, stride-1, dilation-1 2-D convolutions in NCHW on Hopper's warpgroup MMA
// with both operands in shared memory (wgmma SS, sm_90a): the forward pass and the input
// gradient, as implicit GEMMs (M = output channels, N = 128 or 256 output pixels of a row) reading NCHW
// directly through a transposed (channel-quad-innermost) shared-memory halo
// (ops/cuda/conv3x3/fprop_tf32_sm90.cu explains the design). Not routed from conv3x3_forward /
// conv3x3_grad_input: the caller decides between this and conv3x3_wgmma.
// Results are the same bits on every run (no atomics).
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
// precision. The dtype (f32) is the caller's to check. Activations are truncated to TF32 by the
// tensor core (weights rounded): rel. L2 error ~5e-4.
bool conv3x3_wgmma_ss_applies(const ConvShape& s, Device d, Precision precision = tg::precision());

// y (N, K, Ho, Wo) = conv(x (N, C, H, W), w (K, C, 3, 3)) + b (K) or no bias (undefined b).
void conv3x3_wgmma_ss_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                              Precision precision = tg::precision());
// dx (N, C, H, W) = gradient of the output dy (N, K, Ho, Wo) with respect to x (overwritten).
void conv3x3_wgmma_ss_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                                 Precision precision = tg::precision());

}  // namespace tg::cuda
