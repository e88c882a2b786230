#include "nn/optim/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tg::nn {

LRScheduler::LRScheduler(Optimizer& opt) : opt_(opt) {
  for (size_t g = 0; g < opt.num_param_groups(); ++g) base_lrs_.push_back(opt.lr(g));
}

void LRScheduler::start() { apply(0); }

double LRScheduler::lr_at(size_t group, int64_t step) const {
  TG_CHECK(group < base_lrs_.size(), name(), ": param group ", group, " out of range (", base_lrs_.size(),
           " groups)");
  TG_CHECK(step >= 0, name(), ": step ", step, " is negative");
  check_step(step);
  return compute(base_lrs_[group], step);
}

void LRScheduler::apply(int64_t step) {
  TG_CHECK(opt_.num_param_groups() == base_lrs_.size(), name(), ": the optimizer has ", opt_.num_param_groups(),
           " param groups but the scheduler was built for ", base_lrs_.size(),
           " (build the scheduler after adding every group)");
  std::vector<double> lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g) lrs.push_back(lr_at(g, step));
  // All computed and checked: set them.
  for (size_t g = 0; g < lrs.size(); ++g) opt_.set_scheduled_lr(g, lrs[g]);
  step_ = step;
}

void LRScheduler::step() { apply(step_ + 1); }

void LRScheduler::set_last_step(int64_t step) { apply(step); }

std::vector<double> LRScheduler::last_lr() const {
  std::vector<double> out;
  for (size_t g = 0; g < base_lrs_.size(); ++g) out.push_back(opt_.lr(g));
  return out;
}

namespace {

void check_gamma(const char* who, double gamma) {
  TG_CHECK(std::isfinite(gamma) && gamma > 0, who, ": gamma ", gamma, " must be finite and > 0");
}

}  // namespace

StepLR::StepLR(Optimizer& opt, StepLROptions o) : LRScheduler(opt), o_(o) {
  TG_CHECK(o.step_size >= 1, "StepLR: step_size ", o.step_size, " must be >= 1");
  check_gamma("StepLR", o.gamma);
  start();
}

double StepLR::compute(double base, int64_t step) const {
  return base * std::pow(o_.gamma, static_cast<double>(step / o_.step_size));
}

MultiStepLR::MultiStepLR(Optimizer& opt, MultiStepLROptions o) : LRScheduler(opt), o_(std::move(o)) {
  for (int64_t m : o_.milestones) TG_CHECK(m >= 0, "MultiStepLR: milestone ", m, " is negative");
  check_gamma("MultiStepLR", o_.gamma);
  std::sort(o_.milestones.begin(), o_.milestones.end());
  start();
}

double MultiStepLR::compute(double base, int64_t step) const {
  const auto passed = std::upper_bound(o_.milestones.begin(), o_.milestones.end(), step) - o_.milestones.begin();
  return base * std::pow(o_.gamma, static_cast<double>(passed));
}

ExponentialLR::ExponentialLR(Optimizer& opt, ExponentialLROptions o) : LRScheduler(opt), o_(o) {
  check_gamma("ExponentialLR", o.gamma);
  start();
}

double ExponentialLR::compute(double base, int64_t step) const {
  return base * std::pow(o_.gamma, static_cast<double>(step));
}

WarmupCosineLR::WarmupCosineLR(Optimizer& opt, WarmupCosineLROptions o) : LRScheduler(opt), o_(o) {
  TG_CHECK(o.warmup_steps >= 0, "WarmupCosineLR: warmup_steps ", o.warmup_steps, " is negative");
  TG_CHECK(o.cosine_steps >= 1, "WarmupCosineLR: cosine_steps ", o.cosine_steps, " must be >= 1");
  TG_CHECK(std::isfinite(o.eta_min) && o.eta_min >= 0, "WarmupCosineLR: eta_min ", o.eta_min,
           " must be finite and >= 0");
  TG_CHECK(o.warmup_start_factor >= 0 && o.warmup_start_factor <= 1, "WarmupCosineLR: warmup_start_factor ",
           o.warmup_start_factor, " must be in [0, 1]");
  start();
}

double WarmupCosineLR::compute(double base, int64_t step) const {
  if (step < o_.warmup_steps) {
    const double f = o_.warmup_start_factor;
    return base * (f + (1 - f) * static_cast<double>(step) / static_cast<double>(o_.warmup_steps));
  }
  const int64_t u = std::min(step - o_.warmup_steps, o_.cosine_steps);
  const double c = std::cos(std::numbers::pi * static_cast<double>(u) / static_cast<double>(o_.cosine_steps));
  return o_.eta_min + (base - o_.eta_min) * (1 + c) / 2;
}

OneCycleLR::OneCycleLR(Optimizer& opt, OneCycleLROptions o) : LRScheduler(opt), o_(o) {
  TG_CHECK(o.total_steps >= 2, "OneCycleLR: total_steps ", o.total_steps, " must be >= 2");
  TG_CHECK(o.pct_start > 0 && o.pct_start < 1, "OneCycleLR: pct_start ", o.pct_start, " must be in (0, 1)");
  TG_CHECK(std::isfinite(o.div_factor) && o.div_factor > 0, "OneCycleLR: div_factor ", o.div_factor,
           " must be finite and > 0");
  TG_CHECK(std::isfinite(o.final_div_factor) && o.final_div_factor > 0, "OneCycleLR: final_div_factor ",
           o.final_div_factor, " must be finite and > 0");
  const double total = static_cast<double>(o.total_steps), up = o.pct_start * total - 1;
  const double last = total - 1, mid = o.three_phase ? 2 * o.pct_start * total - 2 : up;
  TG_CHECK(up > 0 && mid >= up && last > mid, "OneCycleLR: pct_start ", o.pct_start, " with total_steps ",
           o.total_steps, " leaves a phase of no steps (phases end at steps ", up,
           o.three_phase ? ", " + std::to_string(mid) : std::string(), " and ", last, ")");
  start();
}

void OneCycleLR::check_step(int64_t step) const {
  TG_CHECK(step <= o_.total_steps, "OneCycleLR: tried to step ", step, " times; the schedule has total_steps ",
           o_.total_steps);
}

double OneCycleLR::compute(double max_lr, int64_t step) const {
  const double initial = max_lr / o_.div_factor, min_lr = initial / o_.final_div_factor;
  const double total = static_cast<double>(o_.total_steps), t = static_cast<double>(step);
  struct Phase {
    double end_step, start_lr, end_lr;
  };
  std::vector<Phase> phases;
  if (o_.three_phase) {
    phases = {{o_.pct_start * total - 1, initial, max_lr},
              {2 * o_.pct_start * total - 2, max_lr, initial},
              {total - 1, initial, min_lr}};
  } else {
    phases = {{o_.pct_start * total - 1, initial, max_lr}, {total - 1, max_lr, min_lr}};
  }
  double start_step = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase& p = phases[i];
    if (t <= p.end_step || i + 1 == phases.size()) {
      const double pct = (t - start_step) / (p.end_step - start_step);
      return p.end_lr + (p.start_lr - p.end_lr) / 2 * (std::cos(std::numbers::pi * pct) + 1);
    }
    start_step = p.end_step;
  }
  return min_lr;  // not reached: the last phase always returns
}

}  // namespace tg::nn
