// The CUDA matrix-product dispatcher's table (ops/cuda/linear.cu), as ConvVariant is the
// convolutions' (conv_variants.h): one problem description that every variant, its CPU
// reference (ops/cpu/linear.h, the same GemmProblem) and its tests share, and the ordered list
// of variants, each with what it can implement, what the default order lets it take, and the
// GPUs it serves. tg::cuda::gemm walks the table; KernelPolicy::gemm_variant forces one row
// (tests run every row on every case it can implement: tests/cuda/test_gemm_variants_cuda.cpp).
#pragma once
#include <span>
#include <string_view>

#include "../../core/precision.h"
#include "../../core/tensor.h"
#include "../linear.h"
#include "variant_table.h"

namespace tg::cuda {

// One product c = op(a) op(b) + bias: sizes and transposes (GemmProblem), element type, and the
// precision the tensor-core kernels compute in (read once, at dispatch).
struct GemmCase {
  GemmProblem shape;
  DType dtype = DType::f32;
  Precision precision = Precision::FP32;
};

// The product's tensors (bias undefined where there is none).
struct GemmOperands {
  Tensor c{}, a{}, b{}, bias{};
};

// A row of the table ("skinny", "pointwise", "engine", "direct"): variant_table.h.
using GemmVariant = KernelVariant<GemmCase, GemmOperands>;

// The table, in dispatch order; the last row ("direct") implements everything.
std::span<const GemmVariant> gemm_variants();
// The row tg::cuda::gemm runs under the current KernelPolicy (a forced row that cannot
// implement the problem is an UnsupportedError naming both).
const GemmVariant& choose_gemm_variant(const GemmCase& problem, const GemmOperands& operands);
// A GemmCase for these arguments under the current precision.
GemmCase gemm_case(const GemmProblem& p, DType dtype);

}  // namespace tg::cuda
