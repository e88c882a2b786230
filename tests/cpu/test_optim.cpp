// Optimizers on the CPU: several steps with fixed, given grads against an independent
// re-implementation of PyTorch's update formulas in double, a few values worked out by
// hand, state handling (skipped parameters, checkpoint state), and option errors.
#include <cmath>
#include <functional>
#include <limits>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr int kSteps = 4;

// PyTorch's torch.optim.SGD (_single_tensor_sgd), written out per element.
std::vector<double> reference_sgd(std::vector<double> p, const std::vector<std::vector<double>>& grads,
                                  const nn::SGDOptions& o) {
  std::vector<double> buf(p.size());
  for (size_t t = 0; t < grads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d_p = grads[t][i];
      if (o.weight_decay != 0) d_p += o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = t == 0 ? d_p : o.momentum * buf[i] + (1 - o.dampening) * d_p;
        d_p = o.nesterov ? d_p + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d_p;
    }
  }
  return p;
}

// PyTorch's torch.optim.Adam / AdamW (_single_tensor_adam), written out per element.
std::vector<double> reference_adam(std::vector<double> p, const std::vector<std::vector<double>>& grads,
                                   const nn::AdamOptions& o, bool decoupled) {
  std::vector<double> m(p.size(), 0.0), v(p.size(), 0.0);
  for (size_t t = 1; t <= grads.size(); ++t) {
    double bc1 = 1 - std::pow(o.beta1, double(t)), bc2 = 1 - std::pow(o.beta2, double(t));
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grads[t - 1][i];
      if (decoupled) p[i] *= 1 - o.lr * o.weight_decay;
      else g += o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      double m_hat = m[i] / bc1, v_hat = v[i] / bc2;
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
  return p;
}

struct Problem {
  std::vector<double> p0;
  std::vector<std::vector<double>> grads;  // one per step
};

// 13 parameter values and a fresh random grad for every step (never zero).
Problem make_problem(uint64_t seed) {
  manual_seed(seed);
  Problem pr;
  pr.p0 = uniform({13}, -1.0, 1.0, {.dtype = f64}).to_vector<double>();
  for (int t = 0; t < kSteps; ++t) pr.grads.push_back(uniform({13}, -2.0, 2.0, {.dtype = f64}).to_vector<double>());
  return pr;
}

using MakeOptimizer = std::function<std::unique_ptr<nn::Optimizer>(std::vector<Tensor>)>;

// Runs the optimizer on the problem's parameter in `dt`; returns the final values.
std::vector<double> run(const Problem& pr, DType dt, const MakeOptimizer& make) {
  Tensor p = from_vector(pr.p0, {13}, {.dtype = dt}).requires_grad_();
  auto opt = make({p});
  for (const auto& g : pr.grads) {
    p.set_grad(from_vector(g, {13}, {.dtype = dt}));
    opt->step();
    opt->zero_grad();
  }
  return p.to_vector<double>();
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rtol * (1 + std::fabs(want[i]))) << "element " << i;
}

void check_sgd(const nn::SGDOptions& o) {
  Problem pr = make_problem(11);
  auto want = reference_sgd(pr.p0, pr.grads, o);
  MakeOptimizer make = [&](std::vector<Tensor> ps) { return std::make_unique<nn::SGD>(std::move(ps), o); };
  expect_close(run(pr, f64, make), want, 1e-13);
  expect_close(run(pr, f32, make), want, 2e-6);
  // The update moved the parameter: a test that compares two no-ops would pass too.
  EXPECT_GT(std::fabs(want[0] - pr.p0[0]), 1e-3);
}

void check_adam(const nn::AdamOptions& o, bool decoupled) {
  Problem pr = make_problem(12);
  auto want = reference_adam(pr.p0, pr.grads, o, decoupled);
  MakeOptimizer make = [&](std::vector<Tensor> ps) -> std::unique_ptr<nn::Optimizer> {
    if (!decoupled) return std::make_unique<nn::Adam>(std::move(ps), o);
    return std::make_unique<nn::AdamW>(std::move(ps), nn::AdamWOptions{.lr = o.lr, .beta1 = o.beta1,
                                       .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay});
  };
  expect_close(run(pr, f64, make), want, 1e-13);
  expect_close(run(pr, f32, make), want, 2e-6);
  EXPECT_GT(std::fabs(want[0] - pr.p0[0]), 1e-3);
}

// One parameter p = 1 with the given grads, in f64; returns p after each step.
std::vector<double> scalar_run(nn::Optimizer& opt, Tensor& p, const std::vector<double>& grads) {
  std::vector<double> out;
  for (double g : grads) {
    p.set_grad(full({1}, g, {.dtype = f64}));
    opt.step();
    out.push_back(p.item());
  }
  return out;
}

}  // namespace

TEST(SGD, PlainMatchesReference) { check_sgd({.lr = 0.1}); }
TEST(SGD, MomentumMatchesReference) { check_sgd({.lr = 0.05, .momentum = 0.9}); }
TEST(SGD, DampeningMatchesReference) { check_sgd({.lr = 0.05, .momentum = 0.8, .dampening = 0.3}); }
TEST(SGD, NesterovMatchesReference) { check_sgd({.lr = 0.05, .momentum = 0.9, .nesterov = true}); }
TEST(SGD, WeightDecayMatchesReference) {
  check_sgd({.lr = 0.1, .weight_decay = 0.2});
  check_sgd({.lr = 0.05, .momentum = 0.7, .dampening = 0.1, .weight_decay = 0.05});
}

TEST(SGD, HandComputedMomentum) {
  // p = 1, g = 0.5 twice, lr 0.1, momentum 0.9:
  //   step 1: buf = 0.5 (the first grad, no dampening)   p = 1 - 0.05 = 0.95
  //   step 2: buf = 0.9 * 0.5 + 0.5 = 0.95                p = 0.95 - 0.095 = 0.855
  // With dampening 0.5, step 1 is the same and step 2 has buf = 0.45 + 0.25 = 0.7, p = 0.88.
  Tensor p = ones({1}, {.dtype = f64}).requires_grad_();
  nn::SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});  // dampening skips step 1
  auto got = scalar_run(opt, p, {0.5, 0.5});
  EXPECT_NEAR(got[0], 0.95, 1e-15);
  EXPECT_NEAR(got[1], 0.95 - 0.1 * (0.9 * 0.5 + 0.5 * 0.5), 1e-15);  // 0.88
  Tensor q = ones({1}, {.dtype = f64}).requires_grad_();
  nn::SGD plain({q}, {.lr = 0.1, .momentum = 0.9});
  EXPECT_NEAR(scalar_run(plain, q, {0.5, 0.5})[1], 0.855, 1e-15);
  // Nesterov: step 1 d = 0.5 + 0.9 * 0.5 = 0.95 -> 0.905; step 2 buf = 0.95, d = 0.5 + 0.855 -> 0.7695
  Tensor r = ones({1}, {.dtype = f64}).requires_grad_();
  nn::SGD nesterov({r}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  auto nv = scalar_run(nesterov, r, {0.5, 0.5});
  EXPECT_NEAR(nv[0], 0.905, 1e-15);
  EXPECT_NEAR(nv[1], 0.7695, 1e-15);
}

TEST(Adam, MatchesReference) { check_adam({.lr = 0.01}, false); }
TEST(Adam, WeightDecayMatchesReference) { check_adam({.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1}, false); }
TEST(AdamW, MatchesReference) { check_adam({.lr = 0.01, .weight_decay = 1e-2}, true); }
TEST(AdamW, LargeDecayMatchesReference) { check_adam({.lr = 0.05, .beta1 = 0.5, .beta2 = 0.9, .weight_decay = 0.5}, true); }

TEST(Adam, HandComputed) {
  // p = 1, lr 0.1, default betas, grads 0.5 then -0.25.
  //   step 1: m = 0.05, v = 0.00025, m_hat = 0.5, v_hat = 0.25
  //           p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.900000002
  //   step 2: m = 0.045 - 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225
  //           m_hat = 0.02 / 0.19 = 0.1052631579, v_hat = 0.00031225 / 0.001999 = 0.1562031016
  //           p = 0.900000002 - 0.1 * 0.1052631579 / 0.3952253808 = 0.8733662987
  Tensor p = ones({1}, {.dtype = f64}).requires_grad_();
  nn::Adam opt({p}, {.lr = 0.1});
  auto got = scalar_run(opt, p, {0.5, -0.25});
  EXPECT_NEAR(got[0], 0.900000002, 1e-15);
  EXPECT_NEAR(got[1], 0.8733662987078463, 1e-12);
  // AdamW, weight_decay 0.1, one step: p = 1 * (1 - 0.01) - 0.1 * 0.5 / (0.5 + 1e-8) = 0.890000002
  Tensor q = ones({1}, {.dtype = f64}).requires_grad_();
  nn::AdamW w({q}, {.lr = 0.1, .weight_decay = 0.1});
  EXPECT_NEAR(scalar_run(w, q, {0.5})[0], 0.890000002, 1e-15);
}

TEST(Optimizer, SkipsParametersWithoutGrad) {
  Tensor a = random({3}).requires_grad_(), b = random({5}).requires_grad_();
  std::vector<double> b0 = b.to_vector<double>();
  nn::Adam opt({a, b}, {.lr = 0.1});
  a.set_grad(random({3}));
  opt.step();
  opt.step();
  EXPECT_EQ(b.to_vector<double>(), b0);
  EXPECT_EQ(opt.step_count(), 2);
  EXPECT_EQ(opt.step_count(0), 2);
  EXPECT_EQ(opt.step_count(1), 0);
  // Adam's bias correction counts the steps b actually took: its first update is a first step.
  b.set_grad(full({5}, 0.5, {.dtype = f64}));
  opt.step();
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(b.to_vector<double>()[i], b0[i] - 0.1 * 0.5 / (0.5 + 1e-8), 1e-14);
}

TEST(Optimizer, StepBumpsVersionAndIsNotRecorded) {
  Tensor p = random({4}).requires_grad_();
  nn::SGD opt({p}, {.lr = 0.1, .momentum = 0.5});
  p.set_grad(random({4}));
  uint64_t before = p.version();
  Tape tape;
  opt.step();
  EXPECT_GT(p.version(), before);
  EXPECT_TRUE(tape.entries().empty());
  EXPECT_TRUE(p.is_leaf());
}

TEST(Optimizer, ZeroGradDropsGrads) {
  Tensor p = random({4}).requires_grad_();
  nn::SGD opt({p}, {.lr = 0.1});
  p.set_grad(random({4}));
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
}

TEST(Optimizer, StateNamesAndRoundTrip) {
  Problem pr = make_problem(13);
  auto make_param = [&] { return from_vector(pr.p0, {13}, {.dtype = f64}).requires_grad_(); };
  Tensor a = make_param(), unused = random({2}).requires_grad_();
  nn::Adam first({a, unused}, {.lr = 0.03, .weight_decay = 0.01});
  for (int t = 0; t < 2; ++t) {
    a.set_grad(from_vector(pr.grads[t], {13}));
    first.step();
  }
  auto st = first.state();
  ASSERT_EQ(st.size(), 3u);  // the unused parameter has no state
  EXPECT_EQ(st[0].first, "0.step");
  EXPECT_EQ(st[0].second.item(), 2.0);
  EXPECT_EQ(st[1].first, "0.exp_avg");
  EXPECT_EQ(st[2].first, "0.exp_avg_sq");

  // A second optimizer on a copy of the parameter, loaded from the first, continues identically.
  Tensor b = from_vector(a.to_vector<double>(), {13}).requires_grad_();
  nn::Adam second({b, random({2}).requires_grad_()}, {.lr = 0.03, .weight_decay = 0.01});
  second.load_state(st);
  EXPECT_EQ(second.step_count(0), 2);
  for (int t = 2; t < kSteps; ++t) {
    a.set_grad(from_vector(pr.grads[t], {13}));
    b.set_grad(from_vector(pr.grads[t], {13}));
    first.step();
    second.step();
  }
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>());
  // Loaded buffers are private copies, not aliases of the checkpoint's tensors.
  EXPECT_FALSE(second.state()[1].second.impl()->storage == first.state()[1].second.impl()->storage);

  // SGD without momentum has no state; with momentum, a buffer per updated parameter.
  Tensor c = random({3}).requires_grad_();
  nn::SGD sgd({c}, {.lr = 0.1, .momentum = 0.9});
  c.set_grad(random({3}));
  sgd.step();
  auto s2 = sgd.state();
  ASSERT_EQ(s2.size(), 1u);
  EXPECT_EQ(s2[0].first, "0.momentum_buffer");
  EXPECT_EQ(s2[0].second.to_vector<double>(), c.grad().to_vector<double>());
}

TEST(Optimizer, BadStateIsRejected) {
  Tensor p = random({3}).requires_grad_();
  nn::Adam opt({p});
  TG_EXPECT_ERROR(opt.load_state({{"0.momentum_buffer", random({3})}}), "unknown state", "0.momentum_buffer");
  TG_EXPECT_ERROR(opt.load_state({{"1.exp_avg", random({3})}}), "parameter 1");
  TG_EXPECT_ERROR(opt.load_state({{"0.exp_avg", random({4})}}), "0.exp_avg", "[4]", "[3]");
  TG_EXPECT_ERROR(opt.load_state({{"exp_avg", random({3})}}), "exp_avg", "<parameter index>");
}

TEST(Optimizer, BadOptionsAndParamsAreRejected) {
  Tensor p = random({3}).requires_grad_();
  TG_EXPECT_ERROR(nn::SGD({p}, {.lr = -0.1}), "SGD", "learning rate");
  TG_EXPECT_ERROR(nn::SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}), "SGD", "nesterov");
  TG_EXPECT_ERROR(nn::SGD({p}, {.lr = 0.1, .nesterov = true}), "nesterov");
  TG_EXPECT_ERROR(nn::Adam({p}, {.beta1 = 1.0}), "Adam", "beta1");
  TG_EXPECT_ERROR(nn::AdamW({p}, {.beta2 = -0.1}), "AdamW", "beta2");
  TG_EXPECT_ERROR(nn::Adam({p}, {.eps = -1}), "eps");
  TG_EXPECT_ERROR(nn::SGD({p, p}, {.lr = 0.1}), "parameter 1", "same tensor");
  TG_EXPECT_ERROR(nn::SGD({Tensor()}, {.lr = 0.1}), "undefined");
  TG_EXPECT_ERROR(nn::SGD({arange(3, {.dtype = i64})}, {.lr = 0.1}), "not floating");
  Tape tape;
  Tensor computed = p * 2.0;
  TG_EXPECT_ERROR(nn::SGD({computed}, {.lr = 0.1}), "not a leaf");
}

// An lr of 0 (what SGDOptions{} leaves) or a non-finite one would train nothing, or
// poison the weights, without a word: construction and set_lr refuse them, naming the
// optimizer. PyTorch's SGD has no default lr either.
TEST(Optimizer, LearningRateMustBePositiveAndFinite) {
  Tensor p = random({3}).requires_grad_();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  TG_EXPECT_ERROR(nn::SGD({p}, {}), "SGD", "learning rate", "no default");
  TG_EXPECT_ERROR(nn::SGD({p}, {.lr = 0}), "SGD", "learning rate");
  TG_EXPECT_ERROR(nn::SGD({p}, {.lr = inf}), "SGD", "learning rate", "inf");
  TG_EXPECT_ERROR(nn::SGD({p}, {.lr = nan}), "SGD", "learning rate");
  for (double lr : {0.0, -1e-3, inf, -inf, nan}) {
    TG_EXPECT_ERROR(nn::Adam({p}, {.lr = lr}), "Adam", "learning rate");
    TG_EXPECT_ERROR(nn::AdamW({p}, {.lr = lr}), "AdamW", "learning rate");
  }
  nn::SGD sgd({p}, {.lr = 0.1});
  nn::Adam adam({p}, {.lr = 0.1});
  nn::AdamW adamw({p}, {.lr = 0.1});
  for (double lr : {0.0, -0.5, inf, nan}) {
    TG_EXPECT_ERROR(sgd.set_lr(lr), "SGD", "learning rate");
    TG_EXPECT_ERROR(adam.set_lr(lr), "Adam", "learning rate");
    TG_EXPECT_ERROR(adamw.set_lr(lr), "AdamW", "learning rate");
  }
  // A refused set_lr keeps the old rate; a valid one is taken.
  EXPECT_EQ(sgd.lr(), 0.1);
  EXPECT_EQ(adamw.lr(), 0.1);
  sgd.set_lr(1e-4);
  adam.set_lr(2e-5);
  EXPECT_EQ(sgd.lr(), 1e-4);
  EXPECT_EQ(adam.lr(), 2e-5);
  // Adam keeps PyTorch's default lr (1e-3), which is valid.
  EXPECT_EQ(nn::Adam({p}).lr(), 1e-3);
  EXPECT_EQ(nn::AdamW({p}).lr(), 1e-3);
}

TEST(Optimizer, OtherOptionsMustBeFiniteAndInRange) {
  Tensor p = random({3}).requires_grad_();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (double m : {-0.1, 1.0, 1.5, inf, nan}) TG_EXPECT_ERROR(nn::SGD({p}, {.lr = 0.1, .momentum = m}), "SGD", "momentum");
  for (double d : {-0.1, 1.5, inf, nan})
    TG_EXPECT_ERROR(nn::SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = d}), "SGD", "dampening");
  for (double wd : {-0.1, inf, nan}) {
    TG_EXPECT_ERROR(nn::SGD({p}, {.lr = 0.1, .weight_decay = wd}), "SGD", "weight_decay");
    TG_EXPECT_ERROR(nn::Adam({p}, {.weight_decay = wd}), "Adam", "weight_decay");
    TG_EXPECT_ERROR(nn::AdamW({p}, {.weight_decay = wd}), "AdamW", "weight_decay");
  }
  for (double b : {-0.1, 1.0, inf, nan}) {
    TG_EXPECT_ERROR(nn::Adam({p}, {.beta1 = b}), "Adam", "beta1");
    TG_EXPECT_ERROR(nn::Adam({p}, {.beta2 = b}), "Adam", "beta2");
    TG_EXPECT_ERROR(nn::AdamW({p}, {.beta1 = b}), "AdamW", "beta1");
  }
  for (double eps : {-1e-8, inf, nan}) TG_EXPECT_ERROR(nn::Adam({p}, {.eps = eps}), "Adam", "eps");
  // The edges of each range are accepted.
  EXPECT_NO_THROW(nn::SGD({p}, {.lr = 0.1, .momentum = 0.0, .dampening = 1.0, .weight_decay = 0.0}));
  EXPECT_NO_THROW(nn::SGD({p}, {.lr = 0.1, .momentum = 0.999, .dampening = 0.0}));
  EXPECT_NO_THROW(nn::Adam({p}, {.lr = 1e-3, .beta1 = 0.0, .beta2 = 0.0, .eps = 0.0, .weight_decay = 0.0}));
}

TEST(Optimizer, MismatchedGradIsRejectedBeforeAnyUpdate) {
  Tensor a = random({3}).requires_grad_(), b = random({3}).requires_grad_();
  std::vector<double> a0 = a.to_vector<double>();
  nn::SGD opt({a, b}, {.lr = 0.1});
  a.set_grad(random({3}));
  b.set_grad(random({4}));
  TG_EXPECT_ERROR(opt.step(), "parameter 1", "[3]", "[4]");
  EXPECT_EQ(a.to_vector<double>(), a0);
  b.set_grad(random({3}, f32));
  TG_EXPECT_ERROR(opt.step(), "parameter 1", "f32");
}

// Loaded state values: a NaN, negative, fractional or huge step, a negative exp_avg_sq or a
// non-finite buffer would turn every weight into NaN at the next step (and a step's cast to
// int64 could be undefined). Each is refused, naming the key, and the state is unchanged.
TEST(Optimizer, LoadedStateValuesAreChecked) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  Tensor p = random({3}, f32).requires_grad_();
  nn::Adam opt({p}, {.lr = 0.1});
  p.set_grad(random({3}, f32));
  opt.step();
  const auto before = opt.state();
  auto expect_unchanged = [&] {
    auto now = opt.state();
    ASSERT_EQ(now.size(), before.size());
    for (size_t i = 0; i < now.size(); ++i) {
      EXPECT_EQ(now[i].first, before[i].first);
      EXPECT_EQ(now[i].second.to_vector<double>(), before[i].second.to_vector<double>()) << now[i].first;
    }
    EXPECT_EQ(opt.step_count(0), 1);
  };
  auto state = [&](Tensor step, Tensor avg, Tensor sq) {
    return std::vector<std::pair<std::string, Tensor>>{{"0.step", step}, {"0.exp_avg", avg}, {"0.exp_avg_sq", sq}};
  };
  const Tensor ok = full({3}, 0.5), one = full({}, 1.0, {.dtype = f64});
  for (double s : {nan, inf, -inf, -1.0, 0.5, 9007199254740994.0, 1e300}) {
    TG_EXPECT_ERROR(opt.load_state(state(full({}, s, {.dtype = f64}), ok, ok)), "'0.step'", "step count",
                    "[0, 2^53]");
    expect_unchanged();
  }
  // i64 steps are checked exactly: 2^53 + 1 is not rounded down to 2^53 first.
  TG_EXPECT_ERROR(opt.load_state(state(from_vector(std::vector<int64_t>{(int64_t{1} << 53) + 1}, {}), ok, ok)),
                  "9007199254740993");
  TG_EXPECT_ERROR(opt.load_state(state(from_vector(std::vector<int64_t>{-5}, {}), ok, ok)), "-5");
  expect_unchanged();
  TG_EXPECT_ERROR(opt.load_state(state(one, ok, from_vector(std::vector<float>{1, -2, 3}, {3}))), "'0.exp_avg_sq'",
                  "-2", "element 1", ">= 0");
  TG_EXPECT_ERROR(opt.load_state(state(one, from_vector(std::vector<float>{1, 2, nan}, {3}), ok)), "'0.exp_avg'",
                  "nan", "element 2", "must be finite");
  TG_EXPECT_ERROR(opt.load_state(state(one, ok, full({3}, inf))), "'0.exp_avg_sq'", "inf");
  // Checked in the parameter's dtype: 1e300 is finite in f64 but inf once in an f32 buffer.
  TG_EXPECT_ERROR(opt.load_state(state(one, full({3}, 1e300, {.dtype = f64}), ok)), "'0.exp_avg'", "inf", "f32");
  expect_unchanged();
  // Incomplete or repeated state, and an error after valid entries, change nothing either.
  TG_EXPECT_ERROR(opt.load_state({{"0.exp_avg", ok}, {"0.exp_avg_sq", ok}}), "lacks '0.step'");
  TG_EXPECT_ERROR(opt.load_state({{"0.step", one}}), "lacks '0.exp_avg'");
  TG_EXPECT_ERROR(opt.load_state({{"0.step", one}, {"0.step", one}, {"0.exp_avg", ok}, {"0.exp_avg_sq", ok}}),
                  "'0.step' is given twice");
  expect_unchanged();
  // Valid values, the edges included, are taken.
  opt.load_state(state(from_vector(std::vector<int64_t>{int64_t{1} << 53}, {}), full({3}, -7.0), full({3}, 0.0)));
  EXPECT_EQ(opt.step_count(0), int64_t{1} << 53);
  opt.load_state(state(full({}, 3.0, {.dtype = f32}), ok, ok));
  EXPECT_EQ(opt.step_count(0), 3);

  // SGD's momentum buffer: finite (it may be negative).
  Tensor q = random({2}).requires_grad_();
  nn::SGD sgd({q}, {.lr = 0.1, .momentum = 0.9});
  TG_EXPECT_ERROR(sgd.load_state({{"0.momentum_buffer", full({2}, nan)}}), "'0.momentum_buffer'", "must be finite");
  TG_EXPECT_ERROR(sgd.load_state({{"0.step", one}}), "unknown state '0.step'", "SGD");
  EXPECT_TRUE(sgd.state().empty());
  sgd.load_state({{"0.momentum_buffer", full({2}, -1.0)}});
  EXPECT_EQ(sgd.step_count(0), 1);
}

TEST(Optimizer, StepCountIsChecked) {
  Tensor p = random({3}).requires_grad_();
  nn::SGD opt({p}, {.lr = 0.1});
  TG_EXPECT_ERROR(opt.set_step_count(-1), "set_step_count", "-1", "[0, 2^53]");
  TG_EXPECT_ERROR(opt.set_step_count((int64_t{1} << 53) + 1), "[0, 2^53]");
  EXPECT_EQ(opt.step_count(), 0);
  opt.set_step_count(int64_t{1} << 53);
  EXPECT_EQ(opt.step_count(), int64_t{1} << 53);
}

// One rule for the lr: constructors, set_lr and validate_lr (what tg::load checks a file's
// lr with) accept and refuse the same values, naming the optimizer.
TEST(Optimizer, ValidateLrIsTheRuleOfConstructorsAndSetLr) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  Tensor p = random({3}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 0.1});
  nn::Adam adam({p}, {.lr = 0.1});
  nn::AdamW adamw({p}, {.lr = 0.1});
  std::vector<nn::Optimizer*> all = {&sgd, &adam, &adamw};
  EXPECT_STREQ(sgd.name(), "SGD");
  EXPECT_STREQ(adam.name(), "Adam");
  EXPECT_STREQ(adamw.name(), "AdamW");
  for (double lr : {0.0, -1e-3, inf, -inf, nan, 1e-300, 1e300}) {
    bool constructs = true;
    try {
      nn::SGD s({p}, {.lr = lr});
      nn::Adam a({p}, {.lr = lr});
    } catch (const Error&) {
      constructs = false;
    }
    for (nn::Optimizer* o : all) {
      bool validates = true, sets = true;
      try {
        o->validate_lr(lr);
      } catch (const Error& e) {
        validates = false;
        EXPECT_NE(std::string(e.what()).find(o->name()), std::string::npos) << e.what();
      }
      try {
        o->set_lr(lr);
      } catch (const Error&) {
        sets = false;
      }
      EXPECT_EQ(validates, constructs) << o->name() << " lr " << lr;
      EXPECT_EQ(sets, constructs) << o->name() << " lr " << lr;
      o->set_lr(0.1);
    }
  }
}
