// Adam (L2 weight decay added to the grad) and AdamW (decoupled decay p *= 1 - lr * wd before
// the Adam update), with bias correction, as PyTorch's single-tensor implementation. Each
// parameter group has its own lr, betas, eps and weight decay.
#pragma once
#include <optional>

#include "optimizer.h"

namespace tg::nn {
struct AdamUpdate;  // cuda_updates.h
}  // namespace tg::nn

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

// A group's options (Adam and AdamW): each one left unset is the optimizer's default (the
// options it was built with), as a key missing from a PyTorch param_groups dict.
struct AdamGroupOptions {
  std::optional<double> lr = {};
  std::optional<double> beta1 = {};
  std::optional<double> beta2 = {};
  std::optional<double> eps = {};
  std::optional<double> weight_decay = {};
};

struct AdamParamGroup {
  std::vector<Tensor> params;
  AdamGroupOptions options = {};
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  // One group per entry, in order; `defaults` fills what a group leaves unset.
  Adam(std::vector<AdamParamGroup> groups, AdamOptions defaults = {});

  // Appends a group; nothing changes if its options or parameters are refused.
  void add_param_group(std::vector<Tensor> params, const AdamGroupOptions& options = {});

  const AdamOptions& options(size_t group = 0) const;  // the group's resolved options
  const AdamOptions& defaults() const { return defaults_; }
  const char* name() const override { return name_; }
  bool has_momentum() const override { return true; }  // beta1: what a schedule cycles

 protected:
  Adam(AdamOptions defaults, bool decoupled_weight_decay, const char* name);
  double group_lr(size_t group) const override { return options(group).lr; }
  void store_group_lr(size_t group, double lr) override { groups_.at(group).lr = lr; }
  double group_weight_decay(size_t group) const override { return options(group).weight_decay; }
  double group_momentum(size_t group) const override { return options(group).beta1; }
  void check_group_momentum(size_t group, double value) const override {
    check_range(group_name(group).c_str(), "beta1", value, 0, 1, true);
  }
  void store_group_momentum(size_t group, double value) override { groups_.at(group).beta1 = value; }
  std::vector<std::string> buffer_names(size_t) const override { return {"exp_avg", "exp_avg_sq"}; }
  bool has_step_state() const override { return true; }
  bool buffer_non_negative(size_t b) const override { return b == 1; }  // exp_avg_sq
  void update(size_t i, const Tensor& g, ParamState& s) override;
  void refresh_replay_scalars(size_t i, const ParamState& s) override;
  // exp_avg (3) + exp_avg_sq (4) + sqrt(v) / bc2 + eps (3) + p -= step * m / denom (3) = 13,
  // plus 2 for weight decay.
  double update_flops_per_element(size_t i) const override {
    return 13.0 + (options(param_group_of(i)).weight_decay != 0 ? 2 : 0);
  }

 private:
  AdamOptions defaults_;
  std::vector<AdamOptions> groups_;
  bool decoupled_;
  const char* name_;
  // Parameter i's per-step scalars in the CUDA graph that captured its update (host side).
  std::vector<double*> replay_scalars_;
  AdamUpdate make_update(size_t i, const ParamState& s) const;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<AdamParamGroup> groups, AdamWOptions defaults = {});
};

}  // namespace tg::nn
