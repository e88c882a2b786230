// tg::gradcheck's own contract: it passes a correct gradient, catches a wrong one, refuses an
// fn whose output shape changes between calls, and leaves the caller's tensors (their values
// and their grads) as they were, also when fn throws.
#include <stdexcept>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

// y = x * x recorded with a backward that returns `factor` * x * g (the true one: 2).
Tensor square_with_backward_factor(const Tensor& x, double factor) {
  Tensor y;
  {
    NoGradGuard plain;
    y = x * x;
  }
  if (should_record({x}))
    record("square", {x}, {y}, {x}, [factor](const BackwardArgs& args) {
      return std::vector<Tensor>{args.grad_outputs[0] * args.saved[0] * factor};
    });
  return y;
}

}  // namespace

TEST(Gradcheck, PassesTheTrueGradientAndCatchesAWrongOne) {
  Tensor x = param({3, 2});
  const auto with = [](double factor) {
    return [factor](const std::vector<Tensor>& in) { return square_with_backward_factor(in[0], factor); };
  };
  const GradcheckResult good = gradcheck(with(2.0), {x});
  EXPECT_TRUE(good.ok) << good.message;
  const GradcheckResult bad = gradcheck(with(2.001), {x});
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.message.find("input 0"), std::string::npos) << bad.message;
}

TEST(Gradcheck, OutputShapeThatChangesBetweenCallsIsRefused) {
  Tensor x = param({4});
  for (int64_t later : {1000, 1}) {  // larger, then smaller, than the first output
    int calls = 0;
    const auto fn = [&](const std::vector<Tensor>& in) {
      return ++calls == 1 ? in[0] * 2.0 : expand(sum(in[0]).reshape({1}), {later});
    };
    TG_EXPECT_ERROR(gradcheck(fn, {x}), "gradcheck: fn returned f64[", "on the first call");
  }
}

TEST(Gradcheck, CallersTensorsAreRestoredWhenFnThrows) {
  Tensor x = param({2});
  const std::vector<double> values = x.to_vector<double>();
  x.set_grad(from_vector(std::vector<double>{10, 10}, {2}));
  int calls = 0;
  const auto fn = [&](const std::vector<Tensor>& in) {
    if (++calls == 3) throw std::runtime_error("fn failed");  // on the second perturbed call
    return in[0] * 3.0;
  };
  EXPECT_THROW(gradcheck(fn, {x}), std::runtime_error);
  EXPECT_EQ(x.to_vector<double>(), values);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{10, 10}));
}
