// Host launchers of the CUDA convolution kernels; same names and signatures as the CPU
// reference (ops/cpu/conv.h): outputs, inputs, problem size. Ordered on the framework
// stream of the outputs' device. Each launcher is the one place that chooses a kernel
// variant (today the general direct kernels; fast paths for shape classes plug in there).
// Every output is fully overwritten; no launcher reads its output first.
#pragma once
#include "../../core/tensor.h"
#include "../conv.h"

namespace tg::cuda {

void conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s);
void conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s);
void conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s);
// Both gradients at once (a fast path may read dy once for both).
void conv_grad_input_weight(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                            const ConvShape& s);
void conv_grad_bias(const Tensor& db, const Tensor& dy, const ConvShape& s);

}  // namespace tg::cuda
