#include "nn/optim/sgd.h"

#include "nn/optim/cuda_updates.h"

namespace tg::nn {
namespace {

// The CPU form of the fused update (the CUDA kernel runs the same sgd_step).
template <class T>
void sgd_cpu(T* param, T* buf, const T* grad, int64_t n, const SGDUpdate& u) {  // all (n)
  const SGDCoefficients<T> c(u);
  for (int64_t i = 0; i < n; ++i) sgd_step(param, buf, grad, i, c);
}

}  // namespace

void SGD::check(const std::string& who, const SGDOptions& o) {
  const char* n = who.c_str();
  check_lr(n, o.lr);
  check_range(n, "momentum", o.momentum, 0, 1, true);
  check_range(n, "dampening", o.dampening, 0, 1, false);
  check_non_negative(n, "weight_decay", o.weight_decay);
  TG_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), who,
           ": nesterov momentum requires a momentum > 0 and zero dampening (got momentum ", o.momentum,
           ", dampening ", o.dampening, ")");
}

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer(), defaults_(o) {
  // SGDOptions{} leaves lr at 0: say that there is no default rather than only "invalid".
  TG_CHECK(o.lr != 0, "SGD: invalid learning rate 0: SGD has no default learning rate (as torch.optim.SGD);",
           " pass one, e.g. nn::SGD opt(params, {.lr = 0.01})");
  check("SGD", o);
  add_group_params(std::move(params));
  groups_.push_back(o);
}

SGD::SGD(std::vector<SGDParamGroup> groups, SGDOptions defaults) : Optimizer(), defaults_(defaults) {
  TG_CHECK(!groups.empty(), "SGD: no parameter groups");
  for (SGDParamGroup& g : groups) add_param_group(std::move(g.params), g.options);
}

void SGD::add_param_group(std::vector<Tensor> params, const SGDGroupOptions& u) {
  const SGDOptions& d = defaults_;
  const SGDOptions o{.lr = u.lr.value_or(d.lr), .momentum = u.momentum.value_or(d.momentum),
                     .dampening = u.dampening.value_or(d.dampening),
                     .weight_decay = u.weight_decay.value_or(d.weight_decay),
                     .nesterov = u.nesterov.value_or(d.nesterov)};
  check(group_name(groups_.size()), o);
  add_group_params(std::move(params));
  groups_.push_back(o);
}

const SGDOptions& SGD::options(size_t group) const {
  TG_CHECK(group < groups_.size(), "SGD::options: param group ", group, " out of range (", groups_.size(),
           " groups)");
  return groups_[group];
}

void SGD::check_group_momentum(size_t group, double value) const {
  SGDOptions o = options(group);
  o.momentum = value;
  check(group_name(group), o);
}

std::vector<std::string> SGD::buffer_names(size_t param_index) const {
  if (groups_[param_group_of(param_index)].momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update(size_t i, const Tensor& g, ParamState& s) {
  const Tensor& p = params_[i];
  const SGDOptions& o = groups_[param_group_of(i)];
  SGDUpdate u{.lr = o.lr, .momentum = o.momentum, .dampening = o.dampening, .weight_decay = o.weight_decay,
              .nesterov = o.nesterov, .first_step = false};
  Tensor buf;
  if (u.momentum != 0) {
    if (!s.buffers[0].defined()) {
      // PyTorch starts the buffer as a copy of the first (decayed) grad: the kernel writes it.
      s.buffers[0] = Tensor::empty(p.shape(), {.dtype = p.dtype(), .device = p.device()});
      u.first_step = true;
    }
    buf = s.buffers[0];
  }
  if (p.device().is_cuda()) {
#if TG_CUDA
    cuda::sgd_update(p, buf, g, u);
#else
    TG_FAIL("SGD: tapegrad was built without CUDA");
#endif
    return;
  }
  if (p.dtype() == DType::f32)
    sgd_cpu(p.data<float>(), buf.defined() ? buf.data<float>() : nullptr, g.data<float>(), p.numel(), u);
  else
    sgd_cpu(p.data<double>(), buf.defined() ? buf.data<double>() : nullptr, g.data<double>(), p.numel(), u);
}

}  // namespace tg::nn
