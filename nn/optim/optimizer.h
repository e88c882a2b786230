// Optimizer: holds parameter handles and per-parameter state, updates the parameters in
// place (one fused kernel per parameter on the GPU) and bumps their version counters, so a
// tape that saved a parameter before the step refuses to run backward with stale values.
//
// Optimizers hold the parameters' handles. Module::to() moves the data inside those same
// tensors, so an optimizer may be built before or after it; state buffers made before a
// move follow their parameter's device and dtype at the next step().
//
// Parameter groups, as PyTorch's param_groups: each group has its own options (lr, weight
// decay, and the optimizer's other settings). The constructors that take a plain parameter
// list make one group; add_param_group appends one. Groups are contiguous runs of params()
// in the order they were added, so a parameter's index (which names its state: "3.exp_avg")
// is the same as in PyTorch's packed state_dict. set_lr(lr) sets every group; lr() is group
// 0's (the only one unless groups were added).
//
// Gradient accumulation: backward adds into each leaf's grad(), so running forward and
// backward on several micro-batches, one tape each, without zero_grad in between leaves
// the sum of their grads: with a sum-reduced loss, exactly the grads of one backward over
// the concatenated batch (up to the order of floating-point additions). With a mean-reduced
// loss, weight each micro-batch's loss by its share of the batch (seed backward with
// n_micro / n_batch, or scale the loss) to get the batch mean's grads. Then step() and
// zero_grad() once (tests/cpu/test_grad_accumulation.cpp):
//
//   for (const auto& micro : batches) { tg::Tape tape; tape.backward(loss_fn(model(micro.x), micro.y)); }
//   opt.step();
//   opt.zero_grad();
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../core/tensor.h"

namespace tg::nn {

class Optimizer {
 public:
  // One group holding `params` (checked: defined, floating, leaves, no tensor twice).
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

  size_t num_param_groups() const { return group_begin_.size(); }
  // Group g's parameters: params()[param_group_begin(g), param_group_end(g)).
  size_t param_group_begin(size_t group) const;
  size_t param_group_end(size_t group) const;
  size_t param_group_of(size_t param_index) const;  // the group parameter i belongs to

  double lr() const { return lr(0); }  // group 0's
  double lr(size_t group) const;
  double weight_decay(size_t group = 0) const;
  // Sets every group's lr (all or none: checked first). Throws tg::Error unless lr is
  // positive and finite (as at construction).
  void set_lr(double lr);
  void set_lr(size_t group, double lr);
  // The rule of the constructors and set_lr, for callers that must check an lr before
  // changing anything (tg::load): throws tg::Error naming the optimizer, changes nothing.
  void validate_lr(double lr) const { check_lr(name(), lr); }
  // For learning-rate schedules (nn/optim/scheduler.h) and checkpoints that restore one:
  // a schedule may legitimately reach 0 (cosine annealing to eta_min = 0, warmup from 0),
  // which set_lr refuses as a likely mistake. Throws tg::Error unless finite and >= 0.
  // validate_scheduled_lr only checks (for a schedule that must check every group's lr
  // before setting any).
  void set_scheduled_lr(size_t group, double lr);
  void validate_scheduled_lr(size_t group, double lr) const;

  // Each group's initial lr, as the "initial_lr" of PyTorch's param groups: the lr the group
  // had when the first learning-rate scheduler was built over the optimizer (nn/optim/
  // scheduler.h), recorded by that scheduler and the base of every later one, so that a
  // scheduler built after the optimizer was restored from a checkpoint (whose lr is then a
  // scheduled one) schedules from the same base. Unset (nullopt) until then; checkpoints
  // save and restore it. set_initial_lr is for restoring it by hand (e.g. after loading a
  // file written before checkpoints held it): checked finite and >= 0; nullopt unsets it.
  std::optional<double> initial_lr(size_t group) const;
  void set_initial_lr(size_t group, std::optional<double> lr);

  // The momentum a schedule may cycle (PyTorch's OneCycleLR with cycle_momentum): SGD's
  // momentum, Adam's and AdamW's beta1 (a PyTorch group's "momentum" or betas[0]).
  // has_momentum() says whether the optimizer has one; the others throw tg::Error if not.
  // set_momentum checks the value as the optimizer's constructor checks that option (SGD:
  // in [0, 1), and > 0 in a nesterov group; beta1: in [0, 1)) and changes nothing if it
  // throws; validate_momentum only checks.
  virtual bool has_momentum() const { return false; }
  double momentum(size_t group) const;
  void set_momentum(size_t group, double value);
  void validate_momentum(size_t group, double value) const;

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
  // `step_counts`, when given, holds every parameter's step_count(i) (one per parameter,
  // each checked as a step count): it restores the counts of optimizers whose state has no
  // "i.step" (SGD, as PyTorch's), which otherwise become 1 for a parameter with a buffer and
  // stay as they were for the others. With it, every parameter's state is replaced: one
  // not named in `state` gets its count and no buffers. It must agree with the state: a
  // parameter with state entries was updated (count > 0), and where "i.step" is part of
  // the state (Adam) each count equals it (0 for a parameter without state).
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                  const std::optional<std::vector<int64_t>>& step_counts = std::nullopt);
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
  Optimizer() = default;  // no group yet: the derived constructor adds them
  // Option checks shared by the optimizers: each throws tg::Error naming the optimizer and
  // the option. The learning rate must be positive and finite (an lr of 0 would train
  // nothing, silently); `value` must be finite and in [lo, hi] or, with hi_open, [lo, hi).
  static void check_lr(const char* optimizer, double lr);
  static void check_range(const char* optimizer, const char* option, double value, double lo, double hi,
                          bool hi_open);
  static void check_non_negative(const char* optimizer, const char* option, double value);

  // Appends `params` as a new group after checking them (as the constructor does, and
  // against every parameter already held). The caller has checked the group's options and
  // appends them after this returns; nothing changes if it throws.
  void add_group_params(std::vector<Tensor> params);
  // The optimizer's name for messages about group g: "SGD" for group 0, "SGD param group 2".
  std::string group_name(size_t group) const;
  // Group g's lr and weight decay, stored by the derived optimizer with its other options.
  virtual double group_lr(size_t group) const = 0;
  virtual void store_group_lr(size_t group, double lr) = 0;
  virtual double group_weight_decay(size_t group) const = 0;
  // Group g's momentum (see has_momentum), for optimizers that have one; the defaults throw.
  virtual double group_momentum(size_t group) const;
  virtual void check_group_momentum(size_t group, double value) const;  // throws tg::Error if invalid
  virtual void store_group_momentum(size_t group, double value);

  struct ParamState {
    int64_t steps = 0;            // updates this parameter received
    std::vector<Tensor> buffers;  // one per buffer_names() entry; undefined until first use
  };
  // The names of parameter i's buffers, in ParamState::buffers order (they may depend on
  // its group's options: SGD keeps a momentum buffer only where momentum != 0).
  virtual std::vector<std::string> buffer_names(size_t param_index) const = 0;
  // Whether "i.step" is part of the state (Adam's bias correction needs it; SGD's doesn't).
  virtual bool has_step_state() const = 0;
  // Whether buffer b holds values that cannot be negative (a running mean of squares).
  virtual bool buffer_non_negative(size_t /*b*/) const { return false; }
  // Updates params_[i] in place with its grad `g` (same shape, dtype, device; checked).
  // `s.steps` already counts this update.
  virtual void update(size_t i, const Tensor& g, ParamState& s) = 0;
  // FLOPs per element of parameter i's update, counted from the update formula, for the
  // profiler (core/profiler.h); 0 for an optimizer that does not say.
  virtual double update_flops_per_element(size_t /*param_index*/) const { return 0; }
  // A step captured into a CUDA graph (core/cuda_graph.h) is replayed without step() being
  // called: before each replay after the first, the step counts advance as step() would
  // advance them, and then this is called for each parameter the step updates, so that an
  // optimizer whose captured kernel reads per-step scalars from the graph (Adam's bias
  // corrections) writes the new ones. The other settings are read at capture.
  virtual void refresh_replay_scalars(size_t /*param_index*/, const ParamState& /*s*/) {}

  std::vector<Tensor> params_;
  std::vector<ParamState> state_;

 private:
  void check_group(const char* op, size_t group) const;
  // load_state's step_counts: checks them against the state being loaded (`next`, by
  // parameter index) and sets every parameter's count there; throws, changing nothing.
  void merge_step_counts(const std::vector<int64_t>& counts, std::map<size_t, ParamState>& next) const;
  int64_t steps_ = 0;
  std::vector<size_t> group_begin_;  // first parameter index of each group
  std::vector<size_t> group_of_;     // each parameter's group
  std::vector<std::optional<double>> initial_lrs_;  // per group, see initial_lr()
};

}  // namespace tg::nn
