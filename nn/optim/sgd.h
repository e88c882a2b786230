// Stochastic gradient descent with PyTorch's semantics: L2 weight decay added to the grad,
// momentum whose buffer starts as the first grad itself (no dampening on that step),
// optional dampening and Nesterov momentum.
#pragma once
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

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);

  const SGDOptions& options() const { return options_; }
  const char* name() const override { return "SGD"; }
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override;

 protected:
  std::vector<std::string> buffer_names() const override;
  bool has_step_state() const override { return false; }
  void update(size_t i, const Tensor& g, ParamState& s) override;

 private:
  SGDOptions options_;
};

}  // namespace tg::nn
