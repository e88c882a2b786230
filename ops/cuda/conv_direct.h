// The direct FFMA convolution kernels' launchers (ops/cuda/conv_direct.cu): the last row of the
// dispatcher's table, for every geometry, layout and floating dtype. Same argument order as
// ops/cuda/conv.h; the dispatcher has checked the arguments.
#pragma once
#include "../../core/tensor.h"
#include "../conv.h"

namespace tg::cuda {

void direct_conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s);
void direct_conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s);
void direct_conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s);

}  // namespace tg::cuda
