// Fast path for pointwise (1x1, stride 1, pad 0, dilation 1) convolutions on tensor cores.
// A 1x1 convolution is a GEMM per image: NCHW  y[n] (K, P) = w (K, C) * x[n] (C, P), P = H*W;
// NHWC  y (N*P, K) = x (N*P, C) * w^T. Also serves 3-D 1x1x1 convolutions (NCDHW, P = D*H*W).
// f32 only; the precision argument (by default tg::precision() at the call; the dispatchers pass
// their problem's) picks plain TF32 or FP32-accurate (split TF32 + bf16) math.
//
// The general launchers (ops/cuda/conv.h) hand these shapes over with
//   if (conv1x1_applies(s, y.dtype())) return conv1x1_forward(y, x, w, b, s);
// Same contract as those launchers: outputs first, every output fully overwritten, ordered on
// the framework stream of the outputs' device, no atomics (the same bits on every run).
// On Hopper the forward and grad-input products run on the TMA kernel (conv1x1/fprop_sm90.h) where it
// applies, unless KernelPolicy::conv1x1.tma (ops/cuda/policy.h) is false.
#pragma once
#include "../../../core/dtype.h"
#include "../../../core/precision.h"
#include "../../../core/tensor.h"
#include "../../conv.h"

namespace tg::cuda {

// True for the geometry this file serves: every kernel extent 1, stride 1, padding 0,
// dilation 1 (any N, C, K, spatial size, either layout; no alignment needed).
bool conv1x1_applies(const ConvShape& s);
// The same, and the dtype is f32 (the only one the launchers below take).
bool conv1x1_applies(const ConvShape& s, DType dtype);

// Whether the forward (grad_input false: out y, in x) or the grad-input (out dx, in dy) of s runs
// on a Hopper TMA kernel for these tensors (conv1x1/fprop_sm90.h: the weight resident up to 64
// reduction channels, either layout; streamed past that, channels-first only), as the launchers
// below would run it under the current KernelPolicy.
bool conv1x1_runs_on_tma(const Tensor& out, const Tensor& in, const ConvShape& s, bool grad_input);

// y = conv(x, w) + b; b may be undefined.
void conv1x1_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                     Precision precision = tg::precision());
// dx = w^T dy.
void conv1x1_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                        Precision precision = tg::precision());
// dw = sum over images and pixels of dy x^T (per-block partials, then a fixed-order sum).
void conv1x1_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                         Precision precision = tg::precision());
// Both gradients; dx or dw may be undefined to skip it. When both are asked for and the
// shape allows it (K <= 128, C <= 64), one kernel reads dy once for both.
void conv1x1_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const ConvShape& s, Precision precision = tg::precision());

// The same product for plain matrices: a batched linear layer y (rows, K) = x (rows, C) w^T + b
// is a channels-last 1x1 convolution whose pixels are the rows (ops/cuda/linear.cu routes
// matrix products of these shapes here). 2-D f32 tensors on one CUDA device; b may be undefined.
// y (rows, K) = x (rows, C) * w (K, C)^T + b (K)
void pointwise_matmul_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                              Precision precision = tg::precision());
// dx (rows, C) = dy (rows, K) * w (K, C)
void pointwise_matmul_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w,
                                 Precision precision = tg::precision());
// dw (K, C) = dy (rows, K)^T * x (rows, C)
void pointwise_matmul_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x,
                                  Precision precision = tg::precision());
// Both, reading dy once where conv1x1_backward can (K <= 128, C <= 64).
void pointwise_matmul_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                               Precision precision = tg::precision());

}  // namespace tg::cuda
