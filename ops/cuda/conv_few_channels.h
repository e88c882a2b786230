// The few-tap forward convolution (conv_few_channels.cu): FP32 FMAs for layers whose outputs
// each reduce over at most kFewMaxTaps input values (C * kernel volume), where the tensor-core
// kernels' tiles would mostly wait; and the grad-input of such first layers
// (conv_few_channels_dgrad.cu). A row of the convolution dispatcher's table (conv.cu).
#pragma once
#include <cstdint>

#include "../../core/tensor.h"
#include "../conv.h"

namespace tg::cuda {

// The most taps (C * kernel volume) whose weights a block keeps in shared memory.
constexpr int64_t kFewMaxTaps = 160;

// Whether the kernel takes this geometry (taps, and every coordinate and grid extent in range;
// any layout, stride, padding and dilation). f32 tensors; the caller checks the dtype.
bool few_channels_forward_applies(const ConvShape& s);
// y = conv(x, w) + b (b undefined: no bias); the dispatcher has checked the arguments.
void few_channels_conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                               const ConvShape& s);

// Grad-input of first layers on FP32 FMAs (conv_few_channels_dgrad.cu): whether it takes this
// geometry (1-4 input channels, channels-first 2-D, equal strides of 1 or 2, dilation 1, kernels of
// at most 8 taps a side per stride phase, coordinates within its int range), and the pass
// (dx fully overwritten; the dispatcher has checked the arguments).
bool few_channels_grad_input_applies(const ConvShape& s);
void few_channels_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s);

}  // namespace tg::cuda
