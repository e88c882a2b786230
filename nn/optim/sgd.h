// Stochastic gradient descent with PyTorch's semantics: L2 weight decay added to the grad,
// momentum whose buffer starts as the first grad itself (no dampening on that step),
// optional dampening and Nesterov momentum. Each parameter group has its own options.
#pragma once
#include <optional>

#include "optimizer.h"

namespace tg::nn {

struct SGDOptions {
  // Required, as in torch.optim.SGD: the 0 left by SGDOptions{} is rejected. Every option
  // is checked at construction (tg::Error naming SGD and the option): lr positive and
  // finite, momentum in [0, 1), dampening in [0, 1], weight_decay finite and >= 0.
  double lr = 0;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
};

// A group's options: each one left unset is the optimizer's default (the SGDOptions it was
// built with), as a key missing from a PyTorch param_groups dict. The resolved options are
// checked as SGDOptions are.
struct SGDGroupOptions {
  std::optional<double> lr = {};
  std::optional<double> momentum = {};
  std::optional<double> dampening = {};
  std::optional<double> weight_decay = {};
  std::optional<bool> nesterov = {};
};

struct SGDParamGroup {
  std::vector<Tensor> params;
  SGDGroupOptions options = {};
};

class SGD : public Optimizer {
 public:
  // One group with these options.
  SGD(std::vector<Tensor> params, SGDOptions options);
  // One group per entry, in order; `defaults` fills what a group leaves unset (its lr may
  // stay 0 when every group sets one).
  SGD(std::vector<SGDParamGroup> groups, SGDOptions defaults);

  // Appends a group; nothing changes if its options or parameters are refused.
  void add_param_group(std::vector<Tensor> params, const SGDGroupOptions& options = {});

  const SGDOptions& options(size_t group = 0) const;  // the group's resolved options
  const SGDOptions& defaults() const { return defaults_; }
  const char* name() const override { return "SGD"; }
  // The group's momentum is what a schedule cycles (Optimizer::set_momentum). Turning it on
  // in a group that had none starts the buffer at the next step, as PyTorch; setting it to 0
  // drops the buffers at the next step (PyTorch keeps them, unused).
  bool has_momentum() const override { return true; }

 protected:
  double group_lr(size_t group) const override { return options(group).lr; }
  void store_group_lr(size_t group, double lr) override { groups_.at(group).lr = lr; }
  double group_weight_decay(size_t group) const override { return options(group).weight_decay; }
  double group_momentum(size_t group) const override { return options(group).momentum; }
  void check_group_momentum(size_t group, double value) const override;
  void store_group_momentum(size_t group, double value) override { groups_.at(group).momentum = value; }
  std::vector<std::string> buffer_names(size_t param_index) const override;
  bool has_step_state() const override { return false; }
  void update(size_t i, const Tensor& g, ParamState& s) override;
  // p -= lr * d: 2; weight decay (g + wd * p): 2; momentum (buf = m * buf + (1 - damp) * g): 3;
  // nesterov (g + m * buf): 2.
  double update_flops_per_element(size_t i) const override {
    const SGDOptions& o = options(param_group_of(i));
    return 2.0 + (o.weight_decay != 0 ? 2 : 0) + (o.momentum != 0 ? 3 : 0) + (o.nesterov ? 2 : 0);
  }

 private:
  static void check(const std::string& who, const SGDOptions& o);
  SGDOptions defaults_;
  std::vector<SGDOptions> groups_;
};

}  // namespace tg::nn
