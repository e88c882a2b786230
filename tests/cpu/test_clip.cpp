// clip_grad_norm_ and clip_grad_value_ on the CPU: the norm of all grads together for
// p = 2, 1, 3 and infinity against direct sums, the scaling by max_norm / (norm + 1e-6)
// applied only when below 1, parameters without grads skipped, f32 and f64 grads mixed,
// non-finite norms, and the errors.
#include <cmath>
#include <limits>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

// Three parameters with grads (odd sizes, f64 and f32) and one without.
struct Params {
  std::vector<Tensor> ps = {random({7, 3}).requires_grad_(), random({13}, f32).requires_grad_(),
                            random({2}).requires_grad_(), random({5, 9}).requires_grad_()};
  Params() {
    ps[0].set_grad(uniform({7, 3}, -2.0, 2.0, {.dtype = f64}));
    ps[1].set_grad(uniform({13}, -2.0, 2.0, {.dtype = f32}));
    ps[3].set_grad(uniform({5, 9}, -2.0, 2.0, {.dtype = f64}));
  }
  std::vector<std::vector<double>> grads() const {
    std::vector<std::vector<double>> out;
    for (const Tensor& p : ps) out.push_back(p.grad().defined() ? p.grad().to_vector<double>() : std::vector<double>{});
    return out;
  }
};

double direct_norm(const std::vector<std::vector<double>>& gs, double p) {
  double acc = 0;
  for (const auto& g : gs)
    for (double v : g) acc = std::isinf(p) ? std::max(acc, std::fabs(v)) : acc + std::pow(std::fabs(v), p);
  return std::isinf(p) ? acc : std::pow(acc, 1 / p);
}

}  // namespace

TEST(ClipGradNorm, NormAndScalingMatchDirectComputation) {
  for (double p : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(p);
    Params m;
    const auto before = m.grads();
    const double norm = direct_norm(before, p);
    const double max_norm = norm / 3;  // clips: scale about 1/3
    const double got = nn::clip_grad_norm_(m.ps, max_norm, p);
    EXPECT_NEAR(got, norm, 1e-13 * norm);
    const double scale = max_norm / (norm + 1e-6);
    const auto after = m.grads();
    for (size_t i = 0; i < after.size(); ++i) {
      const double tol = i == 1 ? 1e-7 : 1e-15;  // parameter 1's grad is f32
      for (size_t j = 0; j < after[i].size(); ++j)
        EXPECT_NEAR(after[i][j], before[i][j] * scale, tol * std::fabs(before[i][j])) << i << "," << j;
    }
    EXPECT_FALSE(m.ps[2].grad().defined());  // skipped, not given a grad
    // The clipped grads now have norm max_norm (up to the 1e-6 in the denominator).
    EXPECT_NEAR(direct_norm(after, p), max_norm, 1e-6 * max_norm + 1e-6);
  }
}

TEST(ClipGradNorm, BelowTheLimitTheGradsAreUntouched) {
  Params m;
  const auto before = m.grads();
  const double norm = direct_norm(before, 2);
  EXPECT_NEAR(nn::clip_grad_norm_(m.ps, norm * 1.5), norm, 1e-13 * norm);
  EXPECT_EQ(m.grads(), before);
  // max_norm == norm gives scale = norm / (norm + 1e-6) < 1: clipped, as PyTorch.
  nn::clip_grad_norm_(m.ps, norm);
  EXPECT_NE(m.grads(), before);
}

TEST(ClipGradNorm, ByHand) {
  // grads (3, 4) and (12): 2-norm sqrt(9 + 16 + 144) = 13, inf-norm 12, 1-norm 19.
  Tensor a = zeros({2}, {.dtype = f64}).requires_grad_(), b = zeros({1}, {.dtype = f64}).requires_grad_();
  auto set = [&] {
    a.set_grad(from_vector(std::vector<double>{3, 4}, {2}));
    b.set_grad(from_vector(std::vector<double>{12}, {1}));
  };
  set();
  EXPECT_DOUBLE_EQ(nn::clip_grad_norm_({a, b}, 6.5), 13.0);
  EXPECT_NEAR(a.grad().to_vector<double>()[0], 3 * 6.5 / (13 + 1e-6), 1e-15);
  set();
  EXPECT_EQ(nn::clip_grad_norm_({a, b}, 100, std::numeric_limits<double>::infinity()), 12.0);
  set();
  EXPECT_DOUBLE_EQ(nn::clip_grad_norm_({a, b}, 100, 1.0), 19.0);
  EXPECT_EQ(b.grad().item(), 12.0);
  // No grads at all: norm 0, nothing to do.
  Tensor c = random({3}).requires_grad_();
  EXPECT_EQ(nn::clip_grad_norm_({c}, 1.0), 0.0);
  EXPECT_EQ(nn::clip_grad_norm_({}, 1.0), 0.0);
}

TEST(ClipGradNorm, NonFiniteNormLeavesGradsAndIsReported) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf}) {
    for (double p : {2.0, inf}) {
      SCOPED_TRACE(testing::Message() << bad << " p=" << p);
      Params m;
      auto g = m.ps[3].grad();
      g.data<double>()[17] = bad;
      const auto before = m.grads();
      const double norm = nn::clip_grad_norm_(m.ps, 0.1, p);
      if (std::isnan(bad)) {
        EXPECT_TRUE(std::isnan(norm));
      } else {
        EXPECT_EQ(norm, inf);
      }
      const auto after = m.grads();
      for (size_t i = 0; i < after.size(); ++i)
        for (size_t j = 0; j < after[i].size(); ++j)
          if (!std::isnan(before[i][j])) {
            EXPECT_EQ(after[i][j], before[i][j]);
          }
      TG_EXPECT_ERROR(nn::clip_grad_norm_(m.ps, 0.1, p, true), "clip_grad_norm_", "left unchanged");
    }
  }
}

TEST(ClipGradNorm, BadArgumentsAreRejected) {
  Params m;
  const auto before = m.grads();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  TG_EXPECT_ERROR(nn::clip_grad_norm_(m.ps, -1.0), "clip_grad_norm_: max_norm -1 must be >= 0");
  TG_EXPECT_ERROR(nn::clip_grad_norm_(m.ps, nan), "clip_grad_norm_: max_norm nan");
  TG_EXPECT_ERROR(nn::clip_grad_norm_(m.ps, 1.0, 0.0), "clip_grad_norm_: norm_type 0 must be > 0");
  TG_EXPECT_ERROR(nn::clip_grad_norm_(m.ps, 1.0, nan), "norm_type nan");
  TG_EXPECT_ERROR(nn::clip_grad_norm_({m.ps[0], Tensor()}, 1.0), "parameter 1 is an undefined tensor");
  EXPECT_EQ(m.grads(), before);
}

TEST(ClipGradValue, ClampsEveryGrad) {
  Params m;
  const auto before = m.grads();
  nn::clip_grad_value_(m.ps, 0.5);
  const auto after = m.grads();
  int clamped = 0;
  for (size_t i = 0; i < after.size(); ++i)
    for (size_t j = 0; j < after[i].size(); ++j) {
      EXPECT_EQ(after[i][j], std::clamp(before[i][j], -0.5, 0.5));
      clamped += std::fabs(before[i][j]) > 0.5;
    }
  EXPECT_GT(clamped, 10);
  EXPECT_FALSE(m.ps[2].grad().defined());
  // NaN stays NaN (as torch.clamp); bad clip values are refused.
  m.ps[0].grad().data<double>()[3] = std::nan("");
  nn::clip_grad_value_(m.ps, 0.1);
  EXPECT_TRUE(std::isnan(m.ps[0].grad().to_vector<double>()[3]));
  TG_EXPECT_ERROR(nn::clip_grad_value_(m.ps, -0.1), "clip_grad_value_: clip_value -0.1 must be >= 0");
  TG_EXPECT_ERROR(nn::clip_grad_value_(m.ps, std::nan("")), "clip_grad_value_", "nan");
}
