// The GPU's Autocast(bf16) path of a matrix op against the CPU's (compute_in_f32's bf16 path:
// f32 products on the same bf16 values, one rounding of each result), forward and backward.
#pragma once
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "autograd/tape.h"
#include "common/test_util.h"
#include "core/autocast.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace tg::test {

// y = op(x, w, b) under Autocast(bf16) on both devices from the same f32 x0, w0, b0 (leaves that
// take gradients), then backward through sum(y * up). The two sums differ in order only: the
// bf16 outputs are the same or one rounding apart (relative L2 <= 2^-8); the gradients pass two
// roundings to bf16 (dy at y's cast, the gradient at the op's boundary) and arrive in f32
// (<= 2^-7).
template <class Op>
void expect_autocast_gpu_matches_cpu(const std::string& where, const Tensor& x0, const Tensor& w0, const Tensor& b0,
                                     const Tensor& up, Op&& op) {
  Tensor ys[2], grads[2][3];
  for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
    const Device d = on_gpu ? Device::cuda(0) : Device::cpu();
    Tensor x = x0.to(d).requires_grad_(), w = w0.to(d).requires_grad_(), b = b0.to(d).requires_grad_();
    Tensor y;
    {
      Tape tape;
      {
        Autocast ac(DType::bf16);
        y = op(x, w, b);
      }
      tape.backward(sum(mul(y.to(DType::f32), up.to(d))));
    }
    ys[on_gpu] = y;
    grads[on_gpu][0] = x.grad();
    grads[on_gpu][1] = w.grad();
    grads[on_gpu][2] = b.grad();
  }
  ASSERT_EQ(ys[1].dtype(), DType::bf16) << where;
  EXPECT_LE(rel_l2(ys[1].to(DType::f32), ys[0].to(DType::f32)), std::ldexp(1.0, -8)) << where;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(grads[1][i].dtype(), DType::f32) << where << ", gradient " << i;
    EXPECT_LE(rel_l2(grads[1][i], grads[0][i]), std::ldexp(1.0, -7)) << where << ", gradient " << i;
  }
}

}  // namespace tg::test
