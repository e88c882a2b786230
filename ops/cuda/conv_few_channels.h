// The few-tap forward convolution (conv_few_channels.cu): FP32 FMAs for layers whose outputs
// each reduce over at most kFewMaxTaps input values (C * kernel volume), where the tensor-core
// kernels' tiles would mostly wait. A row of the convolution dispatcher's table (conv.cu).
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

}  // namespace tg::cuda
