// Learning-rate schedules, as torch.optim.lr_scheduler: each sets the lr of every param
// group of an optimizer from that group's base lr and the step count, by a closed-form
// formula of the step (so resuming at step t is exact: set_last_step(t)). The base lr is the
// group's initial lr (Optimizer::initial_lr, PyTorch's "initial_lr"): the first scheduler
// built over an optimizer records each group's lr at that time as its initial lr, and every
// later scheduler over that optimizer starts from it, not from the (scheduled) current lr.
// Like PyTorch, construction applies step 0 and each step() advances one:
//
//   nn::AdamW opt(model.parameters(), {.lr = 1e-3});
//   nn::WarmupCosineLR sched(opt, {.warmup_steps = 100, .cosine_steps = 900});
//   for (...) { ...; opt.step(); sched.step(); }
//
// A schedule may reach an lr of 0 (warmup from 0, cosine to eta_min = 0): it sets lrs
// through Optimizer::set_scheduled_lr, which accepts 0 where set_lr refuses it. OneCycleLR
// also sets each group's momentum (SGD) or beta1 (Adam, AdamW) by Optimizer::set_momentum.
// Scheduler state is the step count alone: save last_step() beside a checkpoint and call
// set_last_step on a scheduler built with the same options over the restored optimizer
// (which sets the lrs and any cycled momentum of that step). tg::load restores the initial
// lrs, so the new scheduler has the saved run's base lrs. A file written before checkpoints
// held them restores none: the scheduler then takes the loaded (scheduled) lr as its base,
// unless Optimizer::set_initial_lr gives the right one first.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "optimizer.h"

namespace tg::nn {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  virtual const char* name() const = 0;
  // Advances one step and sets every group's lr (and momentum, for a schedule that cycles
  // it). Throws tg::Error, changing nothing, if the optimizer's number of groups changed
  // since construction, or past a schedule's last step (OneCycleLR).
  void step();
  int64_t last_step() const { return step_; }  // PyTorch's last_epoch: 0 after construction
  void set_last_step(int64_t step);            // sets the lrs of that step (resuming)
  const std::vector<double>& base_lrs() const { return base_lrs_; }  // the initial lrs
  std::vector<double> last_lr() const;  // the lrs the latest step set (get_last_lr)
  // The schedule's lr for group g at `step`, without changing anything.
  double lr_at(size_t group, int64_t step) const;
  Optimizer& optimizer() const { return opt_; }

 protected:
  explicit LRScheduler(Optimizer& opt);
  void start();  // the last line of every derived constructor: applies step 0
  // The formula: the lr of a group whose base lr is `base_lr` at `step` (>= 0, checked).
  virtual double compute(double base_lr, int64_t step) const = 0;
  // The momentum (or beta1) of group g at `step` for a schedule that cycles it; nullopt
  // leaves the optimizer's as it is.
  virtual std::optional<double> compute_momentum(size_t /*group*/, int64_t /*step*/) const { return std::nullopt; }
  virtual void check_step(int64_t /*step*/) const {}

 private:
  void apply(int64_t step);
  Optimizer& opt_;
  std::vector<double> base_lrs_;
  int64_t step_ = 0;
};

// base * gamma^floor(step / step_size)
struct StepLROptions {
  int64_t step_size = 0;  // >= 1, required
  double gamma = 0.1;     // finite, > 0
};
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, StepLROptions options);
  const char* name() const override { return "StepLR"; }

 protected:
  double compute(double base_lr, int64_t step) const override;

 private:
  StepLROptions o_;
};

// base * gamma^(number of milestones <= step)
struct MultiStepLROptions {
  std::vector<int64_t> milestones;  // each >= 0 (any order; a repeated one counts twice, as in PyTorch)
  double gamma = 0.1;
};
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& opt, MultiStepLROptions options);
  const char* name() const override { return "MultiStepLR"; }

 protected:
  double compute(double base_lr, int64_t step) const override;

 private:
  MultiStepLROptions o_;  // milestones sorted
};

// base * gamma^step
struct ExponentialLROptions {
  double gamma = 0;  // finite, > 0, required
};
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& opt, ExponentialLROptions options);
  const char* name() const override { return "ExponentialLR"; }

 protected:
  double compute(double base_lr, int64_t step) const override;

 private:
  ExponentialLROptions o_;
};

// Linear warmup, then cosine annealing (PyTorch's LinearLR followed by CosineAnnealingLR):
//   step < W:        base * (f + (1 - f) * step / W)                    f = warmup_start_factor
//   W <= step:       eta_min + (base - eta_min) * (1 + cos(pi * u / T)) / 2,  u = min(step - W, T)
// i.e. the lr rises from f * base to base over W steps, then falls from base to eta_min over
// T = cosine_steps steps and stays there (CosineAnnealingLR would rise again past T).
struct WarmupCosineLROptions {
  int64_t warmup_steps = 0;         // W >= 0
  int64_t cosine_steps = 0;         // T >= 1, required
  double eta_min = 0;               // finite, >= 0
  double warmup_start_factor = 0;   // in [0, 1]
};
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& opt, WarmupCosineLROptions options);
  const char* name() const override { return "WarmupCosineLR"; }

 protected:
  double compute(double base_lr, int64_t step) const override;

 private:
  WarmupCosineLROptions o_;
};

// PyTorch's OneCycleLR. Each group's base lr (its initial lr, as above) is its max_lr. With initial =
// max_lr / div_factor and min = initial / final_div_factor, the phases end at step (floats,
// as PyTorch):
//   two-phase:   pct_start * total - 1 (initial -> max_lr), total - 1 (max_lr -> min)
//   three_phase: pct_start * total - 1 (initial -> max_lr), 2 * pct_start * total - 2
//                (max_lr -> initial), total - 1 (initial -> min)
// and within a phase from step s0 to s1, with pct = (step - s0) / (s1 - s0), from a to b:
//   cos:    b + (a - b) / 2 * (1 + cos(pi * pct))
//   linear: a + (b - a) * min(pct, 1)
// (pct passes 1 only at step total_steps, one past the last phase: PyTorch's line goes on
// there, below min_lr and to a negative lr; the cosine is PyTorch's everywhere.)
// With cycle_momentum (the default, as PyTorch) the momentum (SGD) or beta1 (Adam, AdamW)
// of every group moves the other way in the same phases by the same anneal: max_momentum ->
// base_momentum while the lr rises, back to max_momentum while it falls (three_phase: and
// stays at max_momentum in the last phase). It is set to max_momentum at construction.
// Both must pass the optimizer's check for that option (in [0, 1); SGD's nesterov needs > 0).
// An optimizer without momentum needs cycle_momentum = false (PyTorch's ValueError).
// Stepping past total_steps throws tg::Error, as PyTorch's ValueError.
enum class AnnealStrategy { cos, linear };
struct OneCycleLROptions {
  int64_t total_steps = 0;  // >= 2, required
  double pct_start = 0.3;   // in (0, 1); every phase must span more than one step
  AnnealStrategy anneal_strategy = AnnealStrategy::cos;
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25;
  double final_div_factor = 1e4;
  bool three_phase = false;
};
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& opt, OneCycleLROptions options);
  const char* name() const override { return "OneCycleLR"; }

 protected:
  double compute(double base_lr, int64_t step) const override;
  std::optional<double> compute_momentum(size_t group, int64_t step) const override;
  void check_step(int64_t step) const override;

 private:
  // The phase holding `step` and the fraction of it done.
  void locate(int64_t step, size_t& phase, double& pct) const;
  double anneal(double from, double to, double pct) const;
  OneCycleLROptions o_;
  std::vector<double> phase_ends_;
};

}  // namespace tg::nn
