// The elementwise losses (binary_cross_entropy_with_logits, l1, smooth_l1, huber) on the CPU:
// values against loops written from the textbook definitions (not the library's formulas),
// every reduction, numerical stability, gradients against central differences in f64 at
// odd shapes, the nn modules, and the error paths.
#include <cmath>
#include <functional>
#include <limits>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

const Reduction kReductions[] = {Reduction::mean, Reduction::sum, Reduction::none};

// Textbook per-element definitions.
double bce_def(double x, double y) {
  const double s = 1 / (1 + std::exp(-x));  // only for moderate x (the inputs here are in [-3, 3])
  return -(y * std::log(s) + (1 - y) * std::log(1 - s));
}
double smooth_l1_def(double d, double beta) {
  return std::fabs(d) < beta ? 0.5 * d * d / beta : std::fabs(d) - 0.5 * beta;
}
double huber_def(double d, double delta) {
  return std::fabs(d) <= delta ? 0.5 * d * d : delta * (std::fabs(d) - 0.5 * delta);
}

// The per-element values, reduced as asked, against the op's output.
void expect_reduces(const Tensor& got, const std::vector<double>& per_element, Reduction r, const Shape& shape) {
  double sum = 0;
  for (double v : per_element) sum += v;
  if (r == Reduction::none) {
    ASSERT_EQ(got.shape(), shape);
    auto g = got.to_vector<double>();
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], per_element[i], 1e-13 * (1 + std::fabs(per_element[i])));
  } else {
    ASSERT_EQ(got.shape(), Shape{});
    const double want = r == Reduction::sum ? sum : sum / double(per_element.size());
    EXPECT_NEAR(got.item(), want, 1e-12 * (1 + std::fabs(want)));
  }
}

using Loss = std::function<Tensor(const Tensor&, const Tensor&, Reduction)>;

struct Case {
  const char* name;
  Loss loss;
  std::function<double(double, double)> def;  // (pred, target) -> loss
};

std::vector<Case> cases() {
  return {
      {"bce_with_logits", [](const Tensor& x, const Tensor& y, Reduction r) {
         return binary_cross_entropy_with_logits(x, y, r); }, bce_def},
      {"l1", [](const Tensor& x, const Tensor& y, Reduction r) { return l1_loss(x, y, r); },
       [](double x, double y) { return std::fabs(x - y); }},
      {"smooth_l1 beta 0.5", [](const Tensor& x, const Tensor& y, Reduction r) {
         return smooth_l1_loss(x, y, {.beta = 0.5, .reduction = r}); },
       [](double x, double y) { return smooth_l1_def(x - y, 0.5); }},
      {"smooth_l1 beta 0", [](const Tensor& x, const Tensor& y, Reduction r) {
         return smooth_l1_loss(x, y, {.beta = 0.0, .reduction = r}); },
       [](double x, double y) { return std::fabs(x - y); }},
      {"huber delta 0.7", [](const Tensor& x, const Tensor& y, Reduction r) {
         return huber_loss(x, y, {.delta = 0.7, .reduction = r}); },
       [](double x, double y) { return huber_def(x - y, 0.7); }},
  };
}

// pred in [-3, 3) and target in [0, 1) (a probability for BCE, a value for the others):
// |pred - target| spans both sides of every kink.
Tensor preds(const Shape& s) { return uniform(s, -3.0, 3.0, {.dtype = f64}); }
Tensor targets(const Shape& s) { return rand(s, {.dtype = f64}); }

}  // namespace

TEST(PointwiseLoss, ValuesMatchDefinitionsForEveryReduction) {
  const Shape shape{7, 9, 13};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = preds(shape), y = targets(shape);
    auto vx = x.to_vector<double>(), vy = y.to_vector<double>();
    std::vector<double> want(vx.size());
    for (size_t i = 0; i < vx.size(); ++i) want[i] = c.def(vx[i], vy[i]);
    for (Reduction r : kReductions) {
      SCOPED_TRACE(reduction_name(r));
      expect_reduces(c.loss(x, y, r), want, r, shape);
    }
    // f32 inputs give f32 losses within f32 rounding.
    Tensor l32 = c.loss(x.to(f32), y.to(f32), Reduction::sum);
    EXPECT_EQ(l32.dtype(), f32);
    EXPECT_NEAR(l32.item(), c.loss(x, y, Reduction::sum).item(), 1e-5 * std::fabs(l32.item()));
  }
}

TEST(PointwiseLoss, BceWithLogitsIsStableForLargeLogits) {
  // exp(1000) overflows; the stable form gives the exact limits: 0 for a confident right
  // answer, |x| for a confident wrong one, log(2) + |x|/2 for y = 1/2.
  Tensor x = from_vector(std::vector<double>{1000, -1000, 1000, -1000, 800}, {5});
  Tensor y = from_vector(std::vector<double>{1, 0, 0, 1, 0.5}, {5});
  auto l = binary_cross_entropy_with_logits(x, y, Reduction::none).to_vector<double>();
  EXPECT_EQ(l[0], 0.0);
  EXPECT_EQ(l[1], 0.0);
  EXPECT_EQ(l[2], 1000.0);
  EXPECT_EQ(l[3], 1000.0);
  EXPECT_NEAR(l[4], 400.0, 1e-12);
  Tensor xf = x.to(f32).detach().requires_grad_();
  {
    Tape tape;
    tape.backward(binary_cross_entropy_with_logits(xf, y.to(f32), Reduction::sum));
  }
  // d/dx = sigmoid(x) - y: exactly 0, 0, 1, -1, 0.5, never NaN.
  EXPECT_EQ(xf.grad().to_vector<double>(), (std::vector<double>{0, 0, 1, -1, 0.5}));
  // Small logits: log1p keeps the precision that log(1 + exp(-|x|)) would lose.
  // log1p(e^-40) = e^-40 (1 - e^-40 / 2 + ...): e^-40 to within 1e-17 relative.
  Tensor tiny = full({1}, -40.0, {.dtype = f64}), zero = full({1}, 0.0, {.dtype = f64});
  EXPECT_NEAR(binary_cross_entropy_with_logits(tiny, zero).item(), std::exp(-40.0), 1e-33);
}

TEST(PointwiseLoss, GradientsMatchCentralDifferences) {
  for (const Case& c : cases()) {
    for (Reduction r : kReductions) {
      for (const Shape& s : {Shape{7, 9}, Shape{13}, Shape{3, 1, 5}}) {
        SCOPED_TRACE(testing::Message() << c.name << " " << reduction_name(r) << " " << s);
        Tensor x = preds(s).requires_grad_(), y = targets(s).requires_grad_();
        Loss loss = c.loss;
        Tensor fixed = targets(s);
        auto both = [&](const std::vector<Tensor>& in) { return loss(in[0], in[1], r); };
        auto pred_only = [&](const std::vector<Tensor>& in) { return loss(in[0], fixed, r); };
        TG_EXPECT_GRADCHECK(both, std::vector<Tensor>({x, y}));
        TG_EXPECT_GRADCHECK(pred_only, std::vector<Tensor>({x}));
      }
    }
  }
}

TEST(PointwiseLoss, GradientsByHand) {
  // pred 2, target 0.5 (d = 1.5) and pred -0.1, target 0.2 (d = -0.3), sum reduction:
  //   l1: sign(d) = 1, -1;  smooth_l1 beta 1: 1 (|d| >= beta), -0.3 (d / beta);
  //   huber delta 1: 1 (delta * sign), -0.3 (d);  huber delta 2: 1.5, -0.3 (both d).
  Tensor x = from_vector(std::vector<double>{2, -0.1}, {2}).requires_grad_();
  Tensor y = from_vector(std::vector<double>{0.5, 0.2}, {2}).requires_grad_();
  auto grads = [&](const std::function<Tensor()>& f) {
    x.zero_grad();
    y.zero_grad();
    Tape tape;
    tape.backward(f());
    auto gy = y.grad().to_vector<double>(), gx = x.grad().to_vector<double>();
    for (size_t i = 0; i < gx.size(); ++i) EXPECT_EQ(gy[i], -gx[i]);
    return gx;
  };
  auto expect2 = [](const std::vector<double>& g, double a, double b) {
    EXPECT_NEAR(g[0], a, 1e-15);
    EXPECT_NEAR(g[1], b, 1e-15);
  };
  expect2(grads([&] { return l1_loss(x, y, Reduction::sum); }), 1, -1);
  expect2(grads([&] { return smooth_l1_loss(x, y, {.reduction = Reduction::sum}); }), 1, -0.3);
  expect2(grads([&] { return huber_loss(x, y, {.delta = 1, .reduction = Reduction::sum}); }), 1, -0.3);
  expect2(grads([&] { return huber_loss(x, y, {.delta = 2, .reduction = Reduction::sum}); }), 1.5, -0.3);
  // The mean divides by the element count.
  expect2(grads([&] { return l1_loss(x, y); }), 0.5, -0.5);
  // BCE: d/dx = sigmoid(x) - y, d/dy = -x.
  x.zero_grad();
  y.zero_grad();
  {
    Tape tape;
    tape.backward(binary_cross_entropy_with_logits(x, y, Reduction::sum));
  }
  EXPECT_NEAR(x.grad().to_vector<double>()[0], 1 / (1 + std::exp(-2.0)) - 0.5, 1e-15);
  EXPECT_NEAR(y.grad().to_vector<double>()[1], 0.1, 1e-15);
}

TEST(PointwiseLoss, ModulesCallTheOps) {
  Tensor x = preds({5, 3}), y = targets({5, 3});
  EXPECT_EQ(nn::BCEWithLogitsLoss{}(x, y).item(), binary_cross_entropy_with_logits(x, y).item());
  EXPECT_EQ(nn::L1Loss{.reduction = Reduction::sum}(x, y).item(), l1_loss(x, y, Reduction::sum).item());
  EXPECT_EQ(nn::SmoothL1Loss{.beta = 0.25}(x, y).item(), smooth_l1_loss(x, y, {.beta = 0.25}).item());
  const nn::HuberLoss huber{.reduction = Reduction::none, .delta = 0.3};
  const HuberOptions same{.delta = 0.3, .reduction = Reduction::none};
  EXPECT_EQ(huber(x, y).to_vector<double>(), huber_loss(x, y, same).to_vector<double>());
  EXPECT_NE(nn::SmoothL1Loss{.beta = 0.25}(x, y).item(), nn::SmoothL1Loss{}(x, y).item());
}

TEST(PointwiseLoss, BadArgumentsAreRejected) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  TG_EXPECT_ERROR(l1_loss(random({4, 3}), random({4, 2})), "l1_loss: prediction [4, 3] and target [4, 2] differ");
  TG_EXPECT_ERROR(binary_cross_entropy_with_logits(random({4}), random({5})),
                  "binary_cross_entropy_with_logits: logits [4] and target [5] differ");
  TG_EXPECT_ERROR(smooth_l1_loss(random({3}), random({3}, f32)), "smooth_l1_loss", "dtypes differ");
  TG_EXPECT_ERROR(huber_loss(random({3}), Tensor()), "huber_loss", "undefined");
  TG_EXPECT_ERROR(l1_loss(arange(3, {.dtype = i64}), arange(3, {.dtype = i64})), "l1_loss", "i64");
  TG_EXPECT_ERROR(l1_loss(random({0, 3}), random({0, 3})), "l1_loss", "mean of an empty");
  EXPECT_EQ(l1_loss(random({0, 3}), random({0, 3}), Reduction::sum).item(), 0.0);
  EXPECT_EQ(l1_loss(random({0, 3}), random({0, 3}), Reduction::none).shape(), Shape({0, 3}));
  for (double beta : {-0.1, nan, std::numeric_limits<double>::infinity()})
    TG_EXPECT_ERROR(smooth_l1_loss(random({3}), random({3}), {.beta = beta}), "smooth_l1_loss: beta");
  for (double delta : {0.0, -1.0, nan})
    TG_EXPECT_ERROR(huber_loss(random({3}), random({3}), {.delta = delta}), "huber_loss: delta");
  TG_EXPECT_ERROR(l1_loss(random({3}), random({3}), static_cast<Reduction>(7)), "l1_loss", "unknown reduction");
  // The kernel entry points check their buffers too.
  const PointwiseLossParams p{.kind = PointwiseLoss::huber, .reduction = Reduction::none};
  Tensor out = Tensor::empty({}, {.dtype = f64});
  TG_EXPECT_ERROR(cpu::pointwise_loss_forward(out, random({4}), random({4}), p), "huber_loss",
                  "reduction 'none'", "[4]");
  Tensor bad = Tensor::empty({5}, {.dtype = f64});
  TG_EXPECT_ERROR(cpu::pointwise_loss_backward(bad, Tensor(), random({4}), random({4}), random({4}), p),
                  "huber_loss_backward", "gradient buffer");
}
