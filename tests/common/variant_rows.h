// Running the CUDA dispatcher tables (ops/cuda/variant_table.h) row by row in the tests: the
// kernel policy that forces one row, the tolerance every row is held to, and the check that
// each row of a table ran on some case.
#pragma once
#include <set>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "core/precision.h"
#include "ops/cuda/policy.h"

namespace tg::test {

// The current kernel policy with the convolution table's row `name` forced.
inline cuda::KernelPolicy forcing_conv_row(std::string_view name) {
  cuda::KernelPolicy policy = cuda::kernel_policy();
  policy.conv_variant = name;
  return policy;
}
// The same for the matrix-product table.
inline cuda::KernelPolicy forcing_gemm_row(std::string_view name) {
  cuda::KernelPolicy policy = cuda::kernel_policy();
  policy.gemm_variant = name;
  return policy;
}

// Relative L2 against the f64 reference: FP32 1e-5; TF32 2e-3 (each operand rounded to 10
// mantissa bits, ~2^-11 per factor, so ~7e-4 per product, which random signs do not let grow in
// the sum; measured 3e-4 - 8e-4).
inline double row_tolerance(Precision p) { return p == Precision::FP32 ? 1e-5 : 2e-3; }

// Every row of `rows` (a table of KernelVariant) has its name in `ran`: none goes untested.
template <class Rows>
void expect_every_row_ran(const Rows& rows, const std::set<std::string>& ran) {
  for (const auto& row : rows)
    EXPECT_TRUE(ran.count(std::string(row.name))) << "no case exercised row " << row.name;
}

}  // namespace tg::test
