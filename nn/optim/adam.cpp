#include "nn/optim/adam.h"

#include <cmath>

#include "core/cuda_graph.h"
#include "nn/optim/cuda_updates.h"

namespace tg::nn {
namespace {

// The CPU form of the fused update (the CUDA kernel runs the same adam_step).
template <class T>
void adam_cpu(T* param, T* exp_avg, T* exp_avg_sq, const T* grad, int64_t n, const AdamUpdate& u) {  // all (n)
  const AdamCoefficients<T> c(u);
  for (int64_t i = 0; i < n; ++i) adam_step(param, exp_avg, exp_avg_sq, grad, i, c);
}

}  // namespace

namespace {

AdamOptions adam_options(const AdamWOptions& o) {
  return {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay};
}

}  // namespace

Adam::Adam(AdamOptions defaults, bool decoupled_weight_decay, const char* name)
    : defaults_(defaults), decoupled_(decoupled_weight_decay), name_(name) {}

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam(options, false, "Adam") {
  add_param_group(std::move(params));
}

Adam::Adam(std::vector<AdamParamGroup> groups, AdamOptions defaults) : Adam(defaults, false, "Adam") {
  TG_CHECK(!groups.empty(), name_, ": no parameter groups");
  for (AdamParamGroup& g : groups) add_param_group(std::move(g.params), g.options);
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o) : Adam(adam_options(o), true, "AdamW") {
  add_param_group(std::move(params));
}

AdamW::AdamW(std::vector<AdamParamGroup> groups, AdamWOptions defaults) : Adam(adam_options(defaults), true, "AdamW") {
  TG_CHECK(!groups.empty(), "AdamW: no parameter groups");
  for (AdamParamGroup& g : groups) add_param_group(std::move(g.params), g.options);
}

void Adam::add_param_group(std::vector<Tensor> params, const AdamGroupOptions& u) {
  const AdamOptions& d = defaults_;
  const AdamOptions o{.lr = u.lr.value_or(d.lr), .beta1 = u.beta1.value_or(d.beta1),
                      .beta2 = u.beta2.value_or(d.beta2), .eps = u.eps.value_or(d.eps),
                      .weight_decay = u.weight_decay.value_or(d.weight_decay)};
  const std::string who = group_name(groups_.size());
  check_lr(who.c_str(), o.lr);
  check_range(who.c_str(), "beta1", o.beta1, 0, 1, true);
  check_range(who.c_str(), "beta2", o.beta2, 0, 1, true);
  check_non_negative(who.c_str(), "eps", o.eps);
  check_non_negative(who.c_str(), "weight_decay", o.weight_decay);
  add_group_params(std::move(params));
  groups_.push_back(o);
}

const AdamOptions& Adam::options(size_t group) const {
  TG_CHECK(group < groups_.size(), name_, "::options: param group ", group, " out of range (", groups_.size(),
           " groups)");
  return groups_[group];
}

AdamUpdate Adam::make_update(size_t i, const ParamState& s) const {
  const double t = static_cast<double>(s.steps);
  const AdamOptions& o = groups_[param_group_of(i)];
  return {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
          .decoupled_weight_decay = decoupled_, .step_size = o.lr / (1.0 - std::pow(o.beta1, t)),
          .bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t))};
}

void Adam::refresh_replay_scalars(size_t i, const ParamState& s) {
  if (i < replay_scalars_.size() && replay_scalars_[i]) write_replay_scalars(replay_scalars_[i], make_update(i, s));
}

void Adam::update(size_t i, const Tensor& g, ParamState& s) {
  const Tensor& p = params_[i];
  for (Tensor& b : s.buffers)
    if (!b.defined()) b = zeros(p.shape(), {.dtype = p.dtype(), .device = p.device()});
  AdamUpdate u = make_update(i, s);
  const Tensor& m = s.buffers[0];
  const Tensor& v = s.buffers[1];
  if (p.device().is_cuda()) {
#if TG_CUDA
    // Under CUDA graph capture the kernel reads the step's scalars from the graph, which
    // refresh_replay_scalars rewrites before every replay.
    const cuda::StepScalars scalars = cuda::capture_step_scalars(p.device().index, kAdamReplayScalars);
    if (scalars.host) {
      write_replay_scalars(scalars.host, u);
      u.replay_scalars = scalars.device;
      if (replay_scalars_.size() < params_.size()) replay_scalars_.resize(params_.size(), nullptr);
      replay_scalars_[i] = scalars.host;
    }
    cuda::adam_update(p, m, v, g, u);
#else
    TG_FAIL(name_, ": tapegrad was built without CUDA");
#endif
    return;
  }
  if (p.dtype() == DType::f32)
    adam_cpu(p.data<float>(), m.data<float>(), v.data<float>(), g.data<float>(), p.numel(), u);
  else
    adam_cpu(p.data<double>(), m.data<double>(), v.data<double>(), g.data<double>(), p.numel(), u);
}

}  // namespace tg::nn
