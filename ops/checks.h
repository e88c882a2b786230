// Argument checks every op family shares (conv, linear, norm, loss, reduce, elementwise):
// defined operands, floating dtypes, one device and one dtype; typed errors naming the op.
#pragma once
#include "../core/tensor.h"

namespace tg {

void check_floating(const char* op, const Tensor& t);                               // DTypeError
void check_same_device_dtype(const char* op, const Tensor& a, const Tensor& b);  // DeviceError / DTypeError
// The same without the floating check, for the ops whose callers route half tensors to half
// kernels (conv_bf16, linear_bf16_impl).
void check_same_device_and_dtype(const char* op, const Tensor& a, const Tensor& b);
// A normalization's eps: finite and non-negative (an infinite eps makes every rstd 0 and
// the output silently constant; a NaN one makes it NaN).
void check_eps(const char* op, double eps);  // Error

}  // namespace tg
