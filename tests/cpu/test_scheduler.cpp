// Learning-rate schedulers, step by step against PyTorch's closed-form formulas (written out
// here from torch.optim.lr_scheduler's _get_closed_form_lr / OneCycleLR.get_lr, not taken
// from the library), on two param groups with different base lrs; a few values worked out
// by hand; resuming; that the optimizer really steps with the scheduled lr; option errors.
#include <cmath>
#include <numbers>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr double kPi = std::numbers::pi;

// An SGD with two groups: base lrs 0.1 and 0.025.
struct TwoGroups {
  Tensor p = random({3}).requires_grad_(), q = random({2}).requires_grad_();
  nn::SGD opt{{{.params = {p}}, {.params = {q}, .options = {.lr = 0.025}}}, {.lr = 0.1}};
};

// Steps the scheduler `steps` times; at every step (0 = after construction) each group's lr
// must equal formula(base_lr, step) to within rounding.
template <class F>
void expect_schedule(nn::LRScheduler& s, nn::Optimizer& opt, int steps, F formula) {
  const std::vector<double> base = {0.1, 0.025};
  for (int t = 0; t <= steps; ++t) {
    if (t > 0) s.step();
    ASSERT_EQ(s.last_step(), t);
    for (size_t g = 0; g < 2; ++g) {
      const double want = formula(base[g], t);
      EXPECT_NEAR(opt.lr(g), want, 1e-15 * std::fabs(want) + 1e-300) << "group " << g << " step " << t;
      EXPECT_EQ(s.last_lr()[g], opt.lr(g));
      EXPECT_EQ(s.lr_at(g, t), opt.lr(g));
    }
  }
}

}  // namespace

TEST(Scheduler, StepLR) {
  TwoGroups m;
  nn::StepLR s(m.opt, {.step_size = 3, .gamma = 0.5});
  // StepLR closed form: base_lr * gamma ** (last_epoch // step_size)
  expect_schedule(s, m.opt, 10, [](double base, int t) { return base * std::pow(0.5, t / 3); });
  EXPECT_EQ(m.opt.lr(0), 0.1 * 0.125);  // step 10: 0.5^3 exactly
}

TEST(Scheduler, MultiStepLR) {
  TwoGroups m;
  nn::MultiStepLR s(m.opt, {.milestones = {7, 2, 5, 5}, .gamma = 0.1});
  // MultiStepLR closed form: base_lr * gamma ** bisect_right(sorted(milestones), last_epoch)
  const std::vector<int> sorted = {2, 5, 5, 7};
  expect_schedule(s, m.opt, 9, [&](double base, int t) {
    int passed = 0;
    for (int m : sorted) passed += m <= t;
    return base * std::pow(0.1, passed);
  });
}

TEST(Scheduler, ExponentialLR) {
  TwoGroups m;
  nn::ExponentialLR s(m.opt, {.gamma = 0.9});
  // ExponentialLR closed form: base_lr * gamma ** last_epoch
  expect_schedule(s, m.opt, 12, [](double base, int t) { return base * std::pow(0.9, t); });
}

TEST(Scheduler, WarmupCosine) {
  for (double f : {0.0, 0.25}) {
    SCOPED_TRACE(f);
    TwoGroups m;
    const int W = 4, T = 7;
    const double eta_min = 0.001;
    nn::WarmupCosineLR s(m.opt, {.warmup_steps = W, .cosine_steps = T, .eta_min = eta_min, .warmup_start_factor = f});
    // LinearLR closed form: base * (start_factor + (1 - start_factor) * min(t, W) / W), then
    // CosineAnnealingLR closed form (T_max = T, counted from the end of warmup):
    //   eta_min + (base - eta_min) * (1 + cos(pi * (t - W) / T)) / 2, held at eta_min past T.
    expect_schedule(s, m.opt, W + T + 3, [&](double base, int t) {
      if (t < W) return base * (f + (1 - f) * double(t) / W);
      const double u = std::min(t - W, T);
      return eta_min + (base - eta_min) * (1 + std::cos(kPi * u / T)) / 2;
    });
  }
  // By hand: base 0.1, W = 2, T = 2, eta_min 0: 0, 0.05, 0.1, 0.05, 0, 0.
  Tensor p = random({1}).requires_grad_();
  nn::Adam adam({p}, {.lr = 0.1});
  nn::WarmupCosineLR s(adam, {.warmup_steps = 2, .cosine_steps = 2});
  const std::vector<double> want = {0, 0.05, 0.1, 0.05, 0, 0};
  for (size_t t = 0; t < want.size(); ++t) {
    if (t) s.step();
    EXPECT_NEAR(adam.lr(), want[t], 1e-17) << t;
  }
}

TEST(Scheduler, OneCycleTwoPhase) {
  TwoGroups m;
  const int total = 20;
  const double pct = 0.3, div = 25, final_div = 1e4;
  nn::OneCycleLR s(m.opt, {.total_steps = total, .pct_start = pct, .div_factor = div, .final_div_factor = final_div});
  // OneCycleLR.get_lr with anneal_strategy='cos' (_annealing_cos: end + (start - end) / 2 *
  // (cos(pi * pct) + 1)); phases end at pct_start * total - 1 (initial -> max) and total - 1
  // (max -> initial / final_div_factor); initial = max_lr / div_factor.
  auto cos_anneal = [](double start, double end, double pct) {
    return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1);
  };
  expect_schedule(s, m.opt, total, [&](double max_lr, int t) {
    const double initial = max_lr / div, min_lr = initial / final_div;
    const double e1 = pct * total - 1, e2 = total - 1.0;
    if (t <= e1) return cos_anneal(initial, max_lr, t / e1);
    return cos_anneal(max_lr, min_lr, (t - e1) / (e2 - e1));
  });
  TG_EXPECT_ERROR(s.step(), "OneCycleLR: tried to step 21 times", "total_steps 20");
  EXPECT_EQ(s.last_step(), total);  // unchanged by the refused step

  // By hand: max_lr 1, total 10, pct 0.3 (phase 1 ends at step 2): step 0 = 1/25 = 0.04,
  // step 1 = 1 + (0.04 - 1) / 2 = 0.52, step 2 = 1, step 9 = 0.04 / 1e4 = 4e-6.
  Tensor p = random({1}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 1.0});
  nn::OneCycleLR h(sgd, {.total_steps = 10});
  EXPECT_NEAR(sgd.lr(), 0.04, 1e-16);
  h.step();
  EXPECT_NEAR(sgd.lr(), 0.52, 1e-15);
  h.step();
  EXPECT_NEAR(sgd.lr(), 1.0, 1e-15);
  h.set_last_step(9);
  EXPECT_NEAR(sgd.lr(), 4e-6, 1e-20);
}

TEST(Scheduler, OneCycleThreePhase) {
  TwoGroups m;
  const int total = 25;
  const double pct = 0.25, div = 10, final_div = 100;
  nn::OneCycleLR s(m.opt, {.total_steps = total, .pct_start = pct, .div_factor = div, .final_div_factor = final_div,
                           .three_phase = true});
  // three_phase: initial -> max until pct*total - 1, max -> initial until 2*pct*total - 2,
  // initial -> initial / final_div_factor until total - 1 (OneCycleLR._schedule_phases).
  auto cos_anneal = [](double start, double end, double pct) {
    return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1);
  };
  expect_schedule(s, m.opt, total, [&](double max_lr, int t) {
    const double initial = max_lr / div, min_lr = initial / final_div;
    const double e1 = pct * total - 1, e2 = 2 * pct * total - 2, e3 = total - 1.0;
    if (t <= e1) return cos_anneal(initial, max_lr, t / e1);
    if (t <= e2) return cos_anneal(max_lr, initial, (t - e1) / (e2 - e1));
    return cos_anneal(initial, min_lr, (t - e2) / (e3 - e2));
  });
}

// The optimizer steps with the scheduled lr: p -= lr_t * g for plain SGD.
TEST(Scheduler, OptimizerUsesTheScheduledLr) {
  Tensor p = from_vector(std::vector<double>{1.0}, {1}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 0.2});
  nn::ExponentialLR s(sgd, {.gamma = 0.5});
  double want = 1.0;
  for (int t = 0; t < 4; ++t) {
    p.set_grad(full({1}, 0.75, {.dtype = f64}));
    sgd.step();
    want -= 0.2 * std::pow(0.5, t) * 0.75;
    EXPECT_NEAR(p.item(), want, 1e-15);
    s.step();
  }
}

TEST(Scheduler, ResumingAtAStepMatchesSteppingThere) {
  TwoGroups a, b;
  nn::OneCycleLR sa(a.opt, {.total_steps = 30});
  nn::OneCycleLR sb(b.opt, {.total_steps = 30});
  for (int t = 0; t < 17; ++t) sa.step();
  sb.set_last_step(17);
  EXPECT_EQ(sa.last_lr(), sb.last_lr());
  sa.step();
  sb.step();
  EXPECT_EQ(sa.last_lr(), sb.last_lr());
  EXPECT_EQ(sb.last_step(), 18);
  EXPECT_EQ(sb.base_lrs(), (std::vector<double>{0.1, 0.025}));
}

TEST(Scheduler, BadOptionsAndGroupChangesAreRejected) {
  TwoGroups m;
  TG_EXPECT_ERROR(nn::StepLR(m.opt, {}), "StepLR: step_size 0 must be >= 1");
  TG_EXPECT_ERROR(nn::StepLR(m.opt, {.step_size = 2, .gamma = 0}), "StepLR: gamma 0");
  TG_EXPECT_ERROR(nn::MultiStepLR(m.opt, {.milestones = {3, -1}}), "MultiStepLR: milestone -1");
  TG_EXPECT_ERROR(nn::ExponentialLR(m.opt, {.gamma = std::nan("")}), "ExponentialLR: gamma");
  TG_EXPECT_ERROR(nn::WarmupCosineLR(m.opt, {.warmup_steps = 3}), "cosine_steps 0");
  TG_EXPECT_ERROR(nn::WarmupCosineLR(m.opt, {.warmup_steps = -1, .cosine_steps = 3}), "warmup_steps -1");
  TG_EXPECT_ERROR(nn::WarmupCosineLR(m.opt, {.cosine_steps = 3, .eta_min = -1}), "eta_min");
  TG_EXPECT_ERROR(nn::WarmupCosineLR(m.opt, {.cosine_steps = 3, .warmup_start_factor = 2}), "warmup_start_factor");
  TG_EXPECT_ERROR(nn::OneCycleLR(m.opt, {}), "OneCycleLR: total_steps 0");
  TG_EXPECT_ERROR(nn::OneCycleLR(m.opt, {.total_steps = 10, .pct_start = 1.0}), "pct_start 1");
  TG_EXPECT_ERROR(nn::OneCycleLR(m.opt, {.total_steps = 10, .pct_start = 0.1}), "leaves a phase of no steps");
  TG_EXPECT_ERROR(nn::OneCycleLR(m.opt, {.total_steps = 10, .div_factor = 0}), "div_factor");
  // Refused constructions set no lr, and record no initial lr.
  EXPECT_EQ(m.opt.lr(0), 0.1);
  EXPECT_EQ(m.opt.lr(1), 0.025);
  EXPECT_FALSE(m.opt.initial_lr(0).has_value());
  EXPECT_FALSE(m.opt.initial_lr(1).has_value());
  nn::StepLR s(m.opt, {.step_size = 1});
  TG_EXPECT_ERROR(s.set_last_step(-2), "StepLR: step -2 is negative");
  m.opt.add_param_group({random({4}).requires_grad_()});
  TG_EXPECT_ERROR(s.step(), "StepLR", "3 param groups but the scheduler was built for 2");
}

// A step that throws changes nothing: group 1's lr overflows to inf at step 1 (1e308 * 2),
// so group 0's (0.1 -> 0.2) must not be set either, nor the step counted.
TEST(Scheduler, AStepThatThrowsChangesNoGroup) {
  Tensor p = random({3}).requires_grad_(), q = random({2}).requires_grad_();
  nn::SGD opt{{{.params = {p}}, {.params = {q}, .options = {.lr = 1e308}}}, {.lr = 0.1}};
  nn::ExponentialLR s(opt, {.gamma = 2});
  TG_EXPECT_ERROR(s.step(), "invalid scheduled learning rate inf");
  EXPECT_EQ(opt.lr(0), 0.1);
  EXPECT_EQ(opt.lr(1), 1e308);
  EXPECT_EQ(s.last_step(), 0);
  TG_EXPECT_ERROR(s.set_last_step(5), "invalid scheduled learning rate inf");
  EXPECT_EQ(opt.lr(0), 0.1);
  EXPECT_EQ(s.last_step(), 0);
  // The same for a schedule that also sets momenta: group 1's final lr (1e308 / 1e-10)
  // overflows, so its second phase, from step 3 on, has no finite lr.
  nn::SGD sgd{{{.params = {p}}, {.params = {q}, .options = {.lr = 1e308}}}, {.lr = 0.1, .momentum = 0.9}};
  nn::OneCycleLR cycle(sgd, {.total_steps = 10, .pct_start = 0.3, .div_factor = 1, .final_div_factor = 1e-10});
  cycle.step();
  cycle.step();
  const double lr0 = sgd.lr(0), momentum0 = sgd.momentum(0), momentum1 = sgd.momentum(1);
  TG_EXPECT_ERROR(cycle.step(), "SGD param group 1: invalid scheduled learning rate");
  EXPECT_EQ(sgd.lr(0), lr0);
  EXPECT_EQ(sgd.momentum(0), momentum0);
  EXPECT_EQ(sgd.momentum(1), momentum1);
  EXPECT_EQ(cycle.last_step(), 2);
}

// The first scheduler records each group's lr as its initial lr; a later scheduler over the
// same optimizer schedules from it, not from the lr the first one left (PyTorch's
// "initial_lr"): with a warmup from 0 that lr is 0, and a base of 0 would stay 0.
TEST(Scheduler, LaterSchedulersStartFromTheInitialLr) {
  TwoGroups m;
  {
    nn::WarmupCosineLR first(m.opt, {.warmup_steps = 4, .cosine_steps = 10});
    EXPECT_EQ(m.opt.lr(0), 0.0);
    EXPECT_EQ(m.opt.initial_lr(0), 0.1);
    EXPECT_EQ(m.opt.initial_lr(1), 0.025);
    first.step();
  }
  nn::WarmupCosineLR second(m.opt, {.warmup_steps = 4, .cosine_steps = 10});
  EXPECT_EQ(second.base_lrs(), (std::vector<double>{0.1, 0.025}));
  second.set_last_step(6);
  // Reference: the cosine phase at u = 2 of T = 10 from base 0.1 to 0.
  EXPECT_NEAR(m.opt.lr(0), 0.1 * (1 + std::cos(kPi * 2 / 10)) / 2, 1e-17);
  // set_initial_lr is checked and can unset.
  TG_EXPECT_ERROR(m.opt.set_initial_lr(0, -1.0), "initial learning rate -1");
  TG_EXPECT_ERROR(m.opt.set_initial_lr(2, 0.1), "param group 2 out of range");
  m.opt.set_initial_lr(1, std::nullopt);
  m.opt.set_lr(1, 0.5);
  nn::StepLR third(m.opt, {.step_size = 2});
  EXPECT_EQ(third.base_lrs(), (std::vector<double>{0.1, 0.5}));
  EXPECT_EQ(m.opt.initial_lr(1), 0.5);
}
