// CPU reference kernels of the convolution family (im2col/vol2col + Eigen GEMM).
// Outputs first, then inputs, then the problem size; outputs are allocated and every
// argument validated by the caller (ops/conv.cpp). The CUDA launchers in ops/cuda/conv.h
// have the same names and signatures, so TG_DISPATCH picks either.
#pragma once
#include "../../core/tensor.h"
#include "../conv.h"

namespace tg::cpu {

// y = conv(x, w) + b; b may be undefined.       y (N, K, out) / (N, out, K)
void conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s);
// dx = gradient of conv's output dy with respect to x (overwritten).
void conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s);
// dw = gradient with respect to w (overwritten).   dw (K, C, kd?, kh, kw)
void conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s);
// db[k] = sum of dy over batch and output positions (overwritten).   db (K)
// Both gradients at once (a fast path may read dy once for both).
void conv_grad_input_weight(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                            const ConvShape& s);
void conv_grad_bias(const Tensor& db, const Tensor& dy, const ConvShape& s);

}  // namespace tg::cpu
