// The CUDA convolution dispatcher's table (ops/cuda/conv.cu): one problem description that
// every variant, its CPU reference (ops/cpu/conv.h, the same ConvShape) and its tests share,
// and the ordered list of variants, each with what it can implement, what the default order
// lets it take, and the GPUs it serves. The launchers of ops/cuda/conv.h walk the table;
// KernelPolicy::conv_variant forces one row (tests run every row on every case it can
// implement: tests/cuda/test_conv_variants_cuda.cpp).
#pragma once
#include <span>
#include <string_view>

#include "../../core/precision.h"
#include "../../core/tensor.h"
#include "../conv.h"
#include "variant_table.h"

namespace tg::cuda {

enum class ConvPass { Forward, GradInput, GradWeight };

// One convolution pass: sizes, stride, padding, dilation and layout (ConvShape), element type,
// and the precision the tensor-core kernels compute in (read once, at dispatch).
struct ConvProblem {
  ConvShape shape;
  DType dtype = DType::f32;
  Precision precision = Precision::FP32;
  ConvPass pass = ConvPass::Forward;
};

// The pass's tensors (undefined where the pass has none): out is y, dx or dw.
struct ConvOperands {
  Tensor out{}, x{}, w{}, b{}, dy{};  // default-initialised: designated initialisers may name a few
};

// A row of the table ("pointwise", "few_channels", "conv3x3", "engine", "direct"): variant_table.h.
using ConvVariant = KernelVariant<ConvProblem, ConvOperands>;

// The table, in dispatch order; the last row ("direct") implements everything.
std::span<const ConvVariant> conv_variants();
// The row the launchers run under the current KernelPolicy (forced rows that cannot implement
// the problem are an UnsupportedError naming both).
const ConvVariant& choose_conv_variant(const ConvProblem& problem, const ConvOperands& operands);
// A ConvProblem for these arguments (by default under the current precision).
ConvProblem conv_problem(const ConvShape& s, DType dtype, ConvPass pass, Precision precision = tg::precision());

}  // namespace tg::cuda
