// tg::sum_of (core/accumulate.h): the tape's gradient accumulation, kept in core so that
// autograd does not depend on ops. Values, and typed errors for operands that differ.
#include "common/test_util.h"
#include "core/accumulate.h"

using namespace tg;
using namespace tg::test;

TEST(Accumulate, SumsElementwiseInEveryDType) {
  const Tensor a = random({3, 5}, DType::f64), b = random({3, 5}, DType::f64);
  const Tensor s = sum_of(a, b);
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>(), vs = s.to_vector<double>();
  for (size_t i = 0; i < vs.size(); ++i) EXPECT_EQ(vs[i], va[i] + vb[i]);
  const Tensor f = sum_of(ones({4}), full({4}, 2.5));
  EXPECT_EQ(f.to_vector<float>(), std::vector<float>(4, 3.5f));
  EXPECT_FALSE(s.same(a));
}

TEST(Accumulate, OperandsThatDifferRaiseTypedErrors) {
  EXPECT_THROW(sum_of(ones({2, 3}), ones({3, 2})), ShapeError);
  EXPECT_THROW(sum_of(ones({2}), ones({2}, {.dtype = DType::f64})), DTypeError);
}

TEST(Accumulate, BackwardAccumulatesATensorUsedTwice) {
  Tensor x = random({7}, DType::f64).requires_grad_();
  Tensor y;
  {
    Tape tape;
    y = sum(add(mul(x, x), x), {0});
    tape.backward(y);
  }
  const std::vector<double> vx = x.to_vector<double>(), g = x.grad().to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], 2 * vx[i] + 1, 1e-12);
}
