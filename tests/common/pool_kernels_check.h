// The pooling tests' kernel-level check (tests/cuda/test_shape_pool_cuda.cpp,
// test_pool_options_cuda.cpp): the CUDA forward and backward into NaN-poisoned outputs against
// the CPU reference on the same problem, values within tol and max-pool indices identical.
#pragma once
#include "common/cuda_compare.h"
#include "ops/cpu/shape_pool_kernels.h"
#include "ops/cuda/shape_pool_kernels.h"

namespace tg::test {

inline void expect_pool_kernels_match_cpu(const Tensor& x, const PoolProblem& p, DType dt, double tol) {
  const bool is_max = p.kind == PoolKind::max;
  const Shape ys = pool_output_shape(p);
  Tensor y = poisoned_gpu(ys, dt);
  Tensor idx = is_max ? poisoned_gpu(ys, DType::i64) : Tensor();
  cuda::pool_forward(y, idx, x, p);
  Tensor y_ref = Tensor::empty(ys, {.dtype = dt});
  Tensor idx_ref = is_max ? Tensor::empty(ys, {.dtype = DType::i64}) : Tensor();
  cpu::pool_forward(y_ref, idx_ref, x.cpu(), p);
  EXPECT_LE(rel_l2(y, y_ref), tol) << "forward";
  if (is_max) {
    EXPECT_EQ(idx.to_vector<int64_t>(), idx_ref.to_vector<int64_t>()) << "indices";
  }

  Tensor dy = random(ys, dt, x.device());
  Tensor dx = poisoned_gpu(x.shape(), dt);
  cuda::pool_backward(dx, dy, idx, p);
  Tensor dx_ref = Tensor::empty(x.shape(), {.dtype = dt});
  cpu::pool_backward(dx_ref, dy.cpu(), idx_ref, p);
  EXPECT_LE(rel_l2(dx, dx_ref), tol) << "backward";
}

}  // namespace tg::test
