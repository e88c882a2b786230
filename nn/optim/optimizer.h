// Optimizer: holds parameter handles and per-parameter state, updates the parameters in
// place (one fused kernel per parameter on the GPU) and bumps their version counters, so a
// tape that saved a parameter before the step refuses to run backward with stale values.
//
// Optimizers hold the parameters' handles. Module::to() moves the data inside those same
// tensors, so an optimizer may be built before or after it; state buffers made before a
// move follow their parameter's device and dtype at the next step().
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../core/tensor.h"

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

  // The optimizer's name in messages and checkpoints ("SGD", "Adam", "AdamW").
  virtual const char* name() const { return "Optimizer"; }

  virtual double lr() const = 0;
  // Throws tg::Error unless lr is positive and finite (as at construction).
  virtual void set_lr(double lr) = 0;
  // The rule of the constructors and set_lr, for callers that must check an lr before
  // changing anything (tg::load): throws tg::Error naming the optimizer, changes nothing.
  void validate_lr(double lr) const { check_lr(name(), lr); }

  // Per-parameter state for checkpoints, keyed by the parameter's index as in PyTorch's
  // optimizer state_dict: "3.momentum_buffer", "3.exp_avg", "3.exp_avg_sq", and for
  // optimizers that count steps "3.step" (a one-element f64 CPU tensor). Only parameters
  // that were updated have state. The tensors are the live buffers, not copies.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // Restores what state() returned (copies the values onto each parameter's device and
  // dtype). All or nothing: everything is checked before any state changes, and a bad
  // entry throws tg::Error naming it. Every name must be one this optimizer knows, once;
  // shapes must match; a step is a valid step count (check_step_count, any dtype); buffer
  // values must be finite after conversion to the parameter's dtype, and those that are
  // sums of squares (Adam's exp_avg_sq) >= 0; a parameter with state has all of it (step
  // and every buffer: a partial state would restart bias correction silently).
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state);
  // Sets step_count() (e.g. after loading a checkpoint); checked by check_step_count.
  void set_step_count(int64_t steps);

  // A step count must be an integer in [0, 2^53]: past 2^53 a double (bias correction,
  // checkpoints) no longer counts by ones, and a NaN, negative or fractional count would
  // turn every weight into NaN at the next step (and its cast to int64 is undefined).
  // Throws tg::Error naming `what` otherwise.
  static constexpr int64_t kMaxStepCount = int64_t{1} << 53;
  static void check_step_count(const std::string& what, double steps);
  static void check_step_count(const std::string& what, int64_t steps);

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
  // Whether buffer b holds values that cannot be negative (a running mean of squares).
  virtual bool buffer_non_negative(size_t /*b*/) const { return false; }
  // Updates params_[i] in place with its grad `g` (same shape, dtype, device; checked).
  // `s.steps` already counts this update.
  virtual void update(size_t i, const Tensor& g, ParamState& s) = 0;

  std::vector<Tensor> params_;
  std::vector<ParamState> state_;

 private:
  int64_t steps_ = 0;
};

}  // namespace tg::nn
