// Adam (L2 weight decay added to the grad) and AdamW (decoupled decay p *= 1 - lr * wd before
// the Adam update), with bias correction, as PyTorch's single-tensor implementation.
#pragma once
#include "optimizer.h"

namespace tg::nn {

// Checked at construction (tg::Error naming Adam or AdamW and the option): lr positive and
// finite, beta1 and beta2 in [0, 1), eps and weight_decay finite and >= 0.
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});

  const AdamOptions& options() const { return options_; }
  const char* name() const override { return name_; }
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override;

 protected:
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay, const char* name);
  std::vector<std::string> buffer_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool has_step_state() const override { return true; }
  bool buffer_non_negative(size_t b) const override { return b == 1; }  // exp_avg_sq
  void update(size_t i, const Tensor& g, ParamState& s) override;

 private:
  AdamOptions options_;
  bool decoupled_;
  const char* name_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
};

}  // namespace tg::nn
