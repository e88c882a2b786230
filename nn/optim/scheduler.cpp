#include "nn/optim/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tg::nn {

LRScheduler::LRScheduler(Optimizer& opt) : opt_(opt) {
  // The initial lr, not the current one: after a checkpoint is loaded the current lr is the
  // scheduled lr of the saved step, and a base taken from it would schedule from there.
  for (size_t g = 0; g < opt.num_param_groups(); ++g) base_lrs_.push_back(opt.initial_lr(g).value_or(opt.lr(g)));
}

void LRScheduler::start() {
  apply(0);
  // Recorded only once construction has succeeded: a refused scheduler leaves no trace.
  for (size_t g = 0; g < base_lrs_.size(); ++g)
    if (!opt_.initial_lr(g)) opt_.set_initial_lr(g, base_lrs_[g]);
}

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
  std::vector<std::optional<double>> momenta;
  // Every group's values are computed and checked before any is set: a schedule that
  // throws (an lr overflowing to inf in one group) leaves the optimizer and step as they were.
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    lrs.push_back(lr_at(g, step));
    opt_.validate_scheduled_lr(g, lrs.back());
    momenta.push_back(compute_momentum(g, step));
    if (momenta.back()) opt_.validate_momentum(g, *momenta.back());
  }
  // All computed and checked: set them.
  for (size_t g = 0; g < lrs.size(); ++g) {
    opt_.set_scheduled_lr(g, lrs[g]);
    if (momenta[g]) opt_.set_momentum(g, *momenta[g]);
  }
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
  TG_CHECK(o.anneal_strategy == AnnealStrategy::cos || o.anneal_strategy == AnnealStrategy::linear,
           "OneCycleLR: unknown anneal_strategy ", static_cast<int>(o.anneal_strategy));
  const double total = static_cast<double>(o.total_steps), up = o.pct_start * total - 1;
  const double last = total - 1, mid = o.three_phase ? 2 * o.pct_start * total - 2 : up;
  TG_CHECK(up > 0 && mid >= up && last > mid, "OneCycleLR: pct_start ", o.pct_start, " with total_steps ",
           o.total_steps, " leaves a phase of no steps (phases end at steps ", up,
           o.three_phase ? ", " + std::to_string(mid) : std::string(), " and ", last, ")");
  phase_ends_ = o.three_phase ? std::vector<double>{up, mid, last} : std::vector<double>{up, last};
  if (o.cycle_momentum) {
    TG_CHECK(opt.has_momentum(), "OneCycleLR: cycle_momentum needs an optimizer with a momentum or beta1; ",
             opt.name(), " has neither (set cycle_momentum = false)");
    // Both ends pass the optimizer's own check (the values between them then do too).
    for (size_t g = 0; g < opt.num_param_groups(); ++g) {
      opt.validate_momentum(g, o.base_momentum);
      opt.validate_momentum(g, o.max_momentum);
    }
  }
  start();
}

void OneCycleLR::check_step(int64_t step) const {
  TG_CHECK(step <= o_.total_steps, "OneCycleLR: tried to step ", step, " times; the schedule has total_steps ",
           o_.total_steps);
}

void OneCycleLR::locate(int64_t step, size_t& phase, double& pct) const {
  const double t = static_cast<double>(step);
  double start_step = 0;
  for (phase = 0; phase + 1 < phase_ends_.size() && t > phase_ends_[phase]; ++phase) start_step = phase_ends_[phase];
  pct = (t - start_step) / (phase_ends_[phase] - start_step);
}

double OneCycleLR::anneal(double from, double to, double pct) const {
  // Step total_steps lies past the last phase's end (total - 1): pct > 1. The cosine stays
  // between the phase's ends there; a line would leave them (a negative lr), so it stops.
  if (o_.anneal_strategy == AnnealStrategy::linear) return (to - from) * std::min(pct, 1.0) + from;
  return to + (from - to) / 2 * (std::cos(std::numbers::pi * pct) + 1);
}

double OneCycleLR::compute(double max_lr, int64_t step) const {
  const double initial = max_lr / o_.div_factor, min_lr = initial / o_.final_div_factor;
  size_t phase = 0;
  double pct = 0;
  locate(step, phase, pct);
  if (o_.three_phase) {
    const double from[3] = {initial, max_lr, initial}, to[3] = {max_lr, initial, min_lr};
    return anneal(from[phase], to[phase], pct);
  }
  const double from[2] = {initial, max_lr}, to[2] = {max_lr, min_lr};
  return anneal(from[phase], to[phase], pct);
}

std::optional<double> OneCycleLR::compute_momentum(size_t /*group*/, int64_t step) const {
  if (!o_.cycle_momentum) return std::nullopt;
  const double base = o_.base_momentum, max = o_.max_momentum;
  size_t phase = 0;
  double pct = 0;
  locate(step, phase, pct);
  // Against the lr: down while it rises, up while it falls (three_phase: flat at the end).
  const double from[3] = {max, base, max}, to[3] = {base, max, max};
  return anneal(from[phase], to[phase], pct);
}

}  // namespace tg::nn
