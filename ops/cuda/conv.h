// Host launchers of the CUDA convolution kernels; same names and signatures as the CPU
// reference (ops/cpu/conv.h): outputs, inputs, problem size. Ordered on the framework
// stream of the outputs' device. Each launcher runs the first row of the dispatcher's table
// (conv_variants.h: the 1x1 and 3x3 kernels, the engine, the direct kernels) that takes the
// problem. Every output is fully overwritten; no launcher reads its output first. `precision`
// is the TF32 contract the kernels keep (by default tg::precision() at the call).
#pragma once
#include "../../core/precision.h"
#include "../../core/tensor.h"
#include "../conv.h"

namespace tg::cuda {

void conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                  Precision precision = tg::precision());
void conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                     Precision precision = tg::precision());
// Whether the bf16 passes below take this problem (the engine's index limits); where not, the
// caller computes on f32 copies.
bool conv_bf16_can_implement(const ConvShape& s);
// y = conv(x, w) + b with every operand bf16 (b may be undefined): BF16 products accumulated in
// f32 (engine_conv_forward_bf16), the sum rounded once to bf16.
void conv_forward_bf16(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s);
// dx = its grad-input with dx, dy and w bf16 (engine_conv_grad_input_bf16), rounded once.
void conv_grad_input_bf16(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s);
// dw = its grad-weight with dw, dy and x bf16, rounded once: the engine's bf16 pass
// (engine_conv_grad_weight_bf16), or the f32 table's TF32 pass on f32 copies of dy and x where
// conv_grad_weight_bf16_on_f32_copies says that is faster (the 3x3 kernels take it).
bool conv_grad_weight_bf16_on_f32_copies(const ConvShape& s, const Device& device);
void conv_grad_weight_bf16(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s);
void conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                      Precision precision = tg::precision());
// Both gradients at once (a fast path may read dy once for both).
void conv_grad_input_weight(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                            const ConvShape& s);
void conv_grad_bias(const Tensor& db, const Tensor& dy, const ConvShape& s);

}  // namespace tg::cuda
