// The sum of two tensors of one shape, dtype and device, never recorded on a tape: what the
// tape needs to accumulate gradients. It lives in core so that autograd does not call back
// into ops (DESIGN.md: a folder is a layer).
#pragma once
#include "tensor.h"

namespace tg {

// a + b elementwise into a new tensor. Throws ShapeError / DTypeError / DeviceError when the
// operands differ in shape, dtype or device (gradients of one tensor never do).
Tensor sum_of(const Tensor& a, const Tensor& b);

}  // namespace tg
