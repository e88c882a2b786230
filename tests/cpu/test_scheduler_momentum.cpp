// OneCycleLR's momentum cycling (cycle_momentum, PyTorch's default): SGD's momentum and
// Adam's / AdamW's beta1 step by step against PyTorch's OneCycleLR.get_lr formulas (written
// out here: the phase table of _schedule_phases with start/end momentum, _annealing_cos and
// _annealing_linear), cos and linear, two- and three-phase, on two param groups; a few
// values by hand; that the optimizers update with the cycled value; that
// cycle_momentum = false leaves it alone; resuming; and the errors.
#include <cmath>
#include <numbers>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr double kPi = std::numbers::pi;

double cos_anneal(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1);
}
double linear_anneal(double start, double end, double pct) { return start + pct * (end - start); }

// PyTorch's phase table for max_lr `max_lr` and momenta (base, max): each phase ends at
// end_step and goes from start to end of lr and momentum.
struct Phase {
  double end_step, start_lr, end_lr, start_m, end_m;
};
std::vector<Phase> phases(double max_lr, int total, double pct, double div, double final_div, double base_m,
                          double max_m, bool three) {
  const double initial = max_lr / div, min_lr = initial / final_div;
  if (!three) return {{pct * total - 1, initial, max_lr, max_m, base_m}, {total - 1.0, max_lr, min_lr, base_m, max_m}};
  return {{pct * total - 1, initial, max_lr, max_m, base_m},
          {2 * pct * total - 2, max_lr, initial, base_m, max_m},
          {total - 1.0, initial, min_lr, max_m, max_m}};
}

// get_lr's loop: the first phase whose end_step >= t (or the last), pct within it.
std::pair<double, double> lr_and_momentum(const std::vector<Phase>& ph, int t, bool linear) {
  double start = 0;
  for (size_t i = 0; i < ph.size(); ++i) {
    if (t <= ph[i].end_step || i + 1 == ph.size()) {
      const double pct = (t - start) / (ph[i].end_step - start);
      if (linear) {
        // Step total is past the last end_step (pct > 1), where PyTorch's line reaches a
        // negative lr; tapegrad stops the line at the phase's end.
        const double q = pct > 1 ? 1.0 : pct;
        return {linear_anneal(ph[i].start_lr, ph[i].end_lr, q), linear_anneal(ph[i].start_m, ph[i].end_m, q)};
      }
      return {cos_anneal(ph[i].start_lr, ph[i].end_lr, pct), cos_anneal(ph[i].start_m, ph[i].end_m, pct)};
    }
    start = ph[i].end_step;
  }
  return {0, 0};
}

struct Case {
  int total;
  double pct, div, final_div, base_m, max_m;
  bool three, linear;
};

// Steps a OneCycleLR over `opt` (two groups, max lrs `max_lrs`) through the whole schedule
// and checks every group's lr and momentum at every step.
void expect_cycle(nn::Optimizer& opt, const std::vector<double>& max_lrs, const Case& c) {
  nn::OneCycleLR s(opt, {.total_steps = c.total,
                         .pct_start = c.pct,
                         .anneal_strategy = c.linear ? nn::AnnealStrategy::linear : nn::AnnealStrategy::cos,
                         .base_momentum = c.base_m,
                         .max_momentum = c.max_m,
                         .div_factor = c.div,
                         .final_div_factor = c.final_div,
                         .three_phase = c.three});
  for (int t = 0; t <= c.total; ++t) {
    if (t > 0) s.step();
    for (size_t g = 0; g < max_lrs.size(); ++g) {
      const auto [lr, m] =
          lr_and_momentum(phases(max_lrs[g], c.total, c.pct, c.div, c.final_div, c.base_m, c.max_m, c.three), t,
                          c.linear);
      EXPECT_NEAR(opt.lr(g), lr, 1e-15 * lr + 1e-300) << opt.name() << " group " << g << " step " << t;
      EXPECT_NEAR(opt.momentum(g), m, 1e-15) << opt.name() << " group " << g << " step " << t;
    }
  }
}

// An optimizer without a momentum (the base class's default).
class NoMomentum : public nn::Optimizer {
 public:
  explicit NoMomentum(std::vector<Tensor> params) { add_group_params(std::move(params)); }

 protected:
  double group_lr(size_t) const override { return lr_; }
  void store_group_lr(size_t, double lr) override { lr_ = lr; }
  double group_weight_decay(size_t) const override { return 0; }
  std::vector<std::string> buffer_names(size_t) const override { return {}; }
  bool has_step_state() const override { return false; }
  void update(size_t, const Tensor&, ParamState&) override {}

 private:
  double lr_ = 0.1;
};

}  // namespace

TEST(OneCycleMomentum, SgdAndAdamFollowPyTorchsFormulas) {
  const std::vector<Case> cases = {
      {20, 0.3, 25, 1e4, 0.85, 0.95, false, false},  // PyTorch's defaults
      {20, 0.3, 25, 1e4, 0.85, 0.95, false, true},
      {25, 0.25, 10, 100, 0.8, 0.9, true, false},
      {25, 0.25, 10, 100, 0.5, 0.9, true, true},
      {13, 0.4, 5, 10, 0.9, 0.6, false, true},  // base above max: cycles the other way
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("total " + std::to_string(c.total) + (c.three ? " three_phase" : "") +
                 (c.linear ? " linear" : " cos"));
    Tensor p = random({3}).requires_grad_(), q = random({2}).requires_grad_();
    // Group 1 starts without momentum: the schedule turns it on, as PyTorch's.
    nn::SGD sgd({{.params = {p}}, {.params = {q}, .options = {.lr = 0.025, .momentum = 0}}},
                {.lr = 0.1, .momentum = 0.9});
    expect_cycle(sgd, {0.1, 0.025}, c);
    nn::Adam adam({{.params = {p}}, {.params = {q}, .options = {.lr = 0.025, .beta1 = 0.5}}}, {.lr = 0.1});
    expect_cycle(adam, {0.1, 0.025}, c);
    nn::AdamW adamw({p, q}, {.lr = 0.01});
    expect_cycle(adamw, {0.01}, c);
    EXPECT_EQ(adam.options(1).beta2, 0.999);  // only beta1 moves
  }
}

TEST(OneCycleMomentum, ValuesByHand) {
  // total 10, pct 0.3: phase 1 ends at step 2, phase 2 at step 9. Cos: momentum 0.95 at
  // step 0, (0.95 + 0.85) / 2 = 0.9 at step 1, 0.85 at step 2, back to 0.95 at step 9;
  // halfway through phase 2 (step 5.5, between 5 and 6) it is 0.9 again.
  Tensor p = random({1}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 1.0});
  EXPECT_EQ(sgd.momentum(0), 0.0);
  nn::OneCycleLR s(sgd, {.total_steps = 10});
  EXPECT_NEAR(sgd.momentum(0), 0.95, 1e-15);
  s.step();
  EXPECT_NEAR(sgd.momentum(0), 0.9, 1e-15);
  s.step();
  EXPECT_NEAR(sgd.momentum(0), 0.85, 1e-15);
  s.set_last_step(9);
  EXPECT_NEAR(sgd.momentum(0), 0.95, 1e-15);
  // Linear, three phases, total 20, pct 0.25: phases end at 4, 8, 19. Step 2: halfway down,
  // 0.9; step 6: halfway back up, 0.9; step 8 on: 0.95.
  nn::Adam adam({p}, {.lr = 0.1});
  nn::OneCycleLR a(adam, {.total_steps = 20, .pct_start = 0.25, .anneal_strategy = nn::AnnealStrategy::linear,
                          .three_phase = true});
  const std::vector<double> want = {0.95, 0.925, 0.9, 0.875, 0.85, 0.875, 0.9, 0.925, 0.95, 0.95};
  for (size_t t = 0; t < want.size(); ++t) {
    if (t) a.step();
    EXPECT_NEAR(adam.options().beta1, want[t], 1e-15) << t;
  }
  // The lr is linear too: 0.004 -> 0.1 over 4 steps.
  a.set_last_step(1);
  EXPECT_NEAR(adam.lr(), 0.004 + (0.1 - 0.004) / 4, 1e-16);
  // Step 20 (total_steps) is past the last phase's end (19): the line stops at min_lr
  // 0.004 / 1e4 and max_momentum, where PyTorch's would give a negative lr.
  a.set_last_step(20);
  EXPECT_NEAR(adam.lr(), 4e-7, 1e-18);  // (end - start) * 1 + start: rounded as PyTorch
  EXPECT_NEAR(adam.options().beta1, 0.95, 1e-15);
}

TEST(OneCycleMomentum, OptimizersUpdateWithTheCycledValue) {
  // SGD: buf_1 = g_1 (PyTorch's first step), buf_t = m_t * buf + g_t; p -= lr_t * buf_t.
  Tensor p = from_vector(std::vector<double>{1.0}, {1}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 0.5});
  nn::OneCycleLR s(sgd, {.total_steps = 10});
  const std::vector<double> grads = {0.75, -0.5, 0.25, 1.0};
  double want = 1.0, buf = 0;
  for (size_t t = 0; t < grads.size(); ++t) {
    const double lr = sgd.lr(), m = sgd.momentum(0);
    p.set_grad(full({1}, grads[t], {.dtype = f64}));
    sgd.step();
    buf = t == 0 ? grads[t] : m * buf + grads[t];
    want -= lr * buf;
    EXPECT_NEAR(p.item(), want, 1e-15) << t;
    s.step();
  }
  // Adam: exp_avg with the step's beta1, bias correction 1 - beta1_t^t as PyTorch.
  Tensor a = from_vector(std::vector<double>{1.0}, {1}).requires_grad_();
  nn::Adam adam({a}, {.lr = 0.1});
  nn::OneCycleLR sa(adam, {.total_steps = 10});
  double wa = 1.0, m1 = 0, m2 = 0;
  for (size_t t = 0; t < grads.size(); ++t) {
    const double lr = adam.lr(), b1 = adam.options().beta1, b2 = 0.999, k = double(t + 1);
    a.set_grad(full({1}, grads[t], {.dtype = f64}));
    adam.step();
    m1 = b1 * m1 + (1 - b1) * grads[t];
    m2 = b2 * m2 + (1 - b2) * grads[t] * grads[t];
    wa -= lr / (1 - std::pow(b1, k)) * m1 / (std::sqrt(m2) / std::sqrt(1 - std::pow(b2, k)) + 1e-8);
    EXPECT_NEAR(a.item(), wa, 1e-14) << t;
    sa.step();
  }
}

TEST(OneCycleMomentum, OffLeavesMomentumAlone) {
  Tensor p = random({3}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 0.1, .momentum = 0.5});
  nn::Adam adam({p}, {.lr = 0.1, .beta1 = 0.8});
  nn::OneCycleLR s(sgd, {.total_steps = 10, .cycle_momentum = false});
  nn::OneCycleLR a(adam, {.total_steps = 10, .cycle_momentum = false});
  for (int t = 0; t < 10; ++t) {
    s.step();
    a.step();
    EXPECT_EQ(sgd.momentum(0), 0.5);
    EXPECT_EQ(adam.options().beta1, 0.8);
  }
  // The lr schedule is the same either way.
  Tensor q = random({3}).requires_grad_();
  nn::SGD other({q}, {.lr = 0.1, .momentum = 0.5});
  nn::OneCycleLR o(other, {.total_steps = 10});
  for (int t = 0; t < 10; ++t) o.step();
  EXPECT_EQ(other.lr(), sgd.lr());
  // Without momentum cycling, an optimizer without a momentum is fine.
  NoMomentum plain({random({2}).requires_grad_()});
  EXPECT_FALSE(plain.has_momentum());
  EXPECT_NO_THROW(nn::OneCycleLR(plain, {.total_steps = 10, .cycle_momentum = false}));
}

TEST(OneCycleMomentum, ResumingRestoresTheMomentum) {
  Tensor p = random({3}).requires_grad_();
  nn::AdamW a({p}), b({p});
  nn::OneCycleLR sa(a, {.total_steps = 30, .three_phase = true}), sb(b, {.total_steps = 30, .three_phase = true});
  for (int t = 0; t < 13; ++t) sa.step();
  sb.set_last_step(13);
  EXPECT_EQ(a.options().beta1, b.options().beta1);
  EXPECT_NE(b.options().beta1, 0.95);
  sa.step();
  sb.step();
  EXPECT_EQ(a.options().beta1, b.options().beta1);
}

TEST(OneCycleMomentum, Errors) {
  Tensor p = random({3}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 0.1, .momentum = 0.3});
  // Momenta the optimizer refuses, named by the optimizer's own check; nothing changes.
  TG_EXPECT_ERROR(nn::OneCycleLR(sgd, {.total_steps = 10, .max_momentum = 1.0}), "SGD", "momentum 1");
  TG_EXPECT_ERROR(nn::OneCycleLR(sgd, {.total_steps = 10, .base_momentum = -0.1}), "SGD", "momentum -0.1");
  EXPECT_EQ(sgd.lr(), 0.1);
  EXPECT_EQ(sgd.momentum(0), 0.3);
  nn::Adam adam({p});
  TG_EXPECT_ERROR(nn::OneCycleLR(adam, {.total_steps = 10, .max_momentum = std::nan("")}), "Adam", "beta1");
  nn::SGD nesterov({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  TG_EXPECT_ERROR(nn::OneCycleLR(nesterov, {.total_steps = 10, .base_momentum = 0}), "SGD", "nesterov");
  EXPECT_NO_THROW(nn::OneCycleLR(nesterov, {.total_steps = 10}));
  NoMomentum plain({random({2}).requires_grad_()});
  TG_EXPECT_ERROR(nn::OneCycleLR(plain, {.total_steps = 10}), "OneCycleLR: cycle_momentum", "Optimizer",
                  "cycle_momentum = false");
  // The optimizer's momentum setters.
  TG_EXPECT_ERROR(plain.momentum(0), "has no momentum");
  TG_EXPECT_ERROR(plain.set_momentum(0, 0.5), "has no momentum");
  TG_EXPECT_ERROR(sgd.set_momentum(1, 0.5), "SGD::set_momentum", "param group 1 out of range");
  TG_EXPECT_ERROR(sgd.set_momentum(0, 1.5), "SGD", "momentum 1.5");
  TG_EXPECT_ERROR(adam.set_momentum(0, -1), "Adam", "beta1 -1");
  EXPECT_EQ(adam.options().beta1, 0.9);
  adam.set_momentum(0, 0.7);
  EXPECT_EQ(adam.momentum(0), 0.7);
  EXPECT_EQ(adam.options().beta1, 0.7);
  TG_EXPECT_ERROR(nesterov.set_momentum(0, 0), "nesterov");
  // A group added after the scheduler was built: refused before anything is set.
  nn::SGD two({p}, {.lr = 0.1});
  nn::OneCycleLR s(two, {.total_steps = 10});
  two.add_param_group({random({2}).requires_grad_()}, {.momentum = 0.2});
  TG_EXPECT_ERROR(s.step(), "OneCycleLR", "2 param groups");
  EXPECT_EQ(two.momentum(1), 0.2);
}
