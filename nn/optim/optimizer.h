// Optimizer: holds parameter handles and per-parameter state, updates the parameters in
// place (one fused kernel per parameter on the GPU) and bumps their version counters, so a
// tape that saved a parameter before the step refuses to run backward with stale values.
//
// Optimizers hold the parameters' handles: build them after Module::to(), which replaces
// each parameter with a moved copy.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tg::nn {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a grad (the others are skipped, their state
  // untouched, as in PyTorch). Runs without recording on any tape.
  void step();
  void zero_grad();  // drops every parameter's grad

  const std::vector<Tensor>& params() const { return params_; }
  int64_t step_count() const { return steps_; }  // calls of step()
  // Number of updates parameter i received (it only counts steps where it had a grad).
  int64_t step_count(size_t param_index) const;

  virtual double lr() const = 0;
  // Throws tg::Error unless lr is positive and finite (as at construction).
  virtual void set_lr(double lr) = 0;

  // Per-parameter state for checkpoints, keyed by the parameter's index as in PyTorch's
  // optimizer state_dict: "3.momentum_buffer", "3.exp_avg", "3.exp_avg_sq", and for
  // optimizers that count steps "3.step" (a one-element f64 CPU tensor). Only parameters
  // that were updated have state. The tensors are the live buffers, not copies.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // Restores what state() returned (copies the values onto each parameter's device and
  // dtype). Every name must be one this optimizer knows; shapes must match.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state);
  // Sets step_count() (e.g. after loading a checkpoint).
  void set_step_count(int64_t steps) { steps_ = steps; }

 protected:
  // Option checks shared by the optimizers: each throws tg::Error naming the optimizer and
  // the option. The learning rate must be positive and finite (an lr of 0 would train
  // nothing, silently); `value` must be finite and in [lo, hi] or, with hi_open, [lo, hi).
  static void check_lr(const char* optimizer, double lr);
  static void check_range(const char* optimizer, const char* option, double value, double lo, double hi,
                          bool hi_open);
  static void check_non_negative(const char* optimizer, const char* option, double value);

  struct ParamState {
    int64_t steps = 0;            // updates this parameter received
    std::vector<Tensor> buffers;  // one per buffer_names() entry; undefined until first use
  };
  // The names of the per-parameter buffers, in ParamState::buffers order.
  virtual std::vector<std::string> buffer_names() const = 0;
  // Whether "i.step" is part of the state (Adam's bias correction needs it; SGD's doesn't).
  virtual bool has_step_state() const = 0;
  // Updates params_[i] in place with its grad `g` (same shape, dtype, device; checked).
  // `s.steps` already counts this update.
  virtual void update(size_t i, const Tensor& g, ParamState& s) = 0;

  std::vector<Tensor> params_;
  std::vector<ParamState> state_;

 private:
  int64_t steps_ = 0;
};

}  // namespace tg::nn
