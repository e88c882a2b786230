#include "nn/optim/adam.h"

#include <cmath>

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

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options, false, "Adam") {}

Adam::Adam(std::vector<Tensor> params, AdamOptions o, bool decoupled_weight_decay, const char* name)
    : Optimizer(std::move(params)), options_(o), decoupled_(decoupled_weight_decay), name_(name) {
  check_lr(name_, o.lr);
  check_range(name_, "beta1", o.beta1, 0, 1, true);
  check_range(name_, "beta2", o.beta2, 0, 1, true);
  check_non_negative(name_, "eps", o.eps);
  check_non_negative(name_, "weight_decay", o.weight_decay);
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o)
    : Adam(std::move(params),
           AdamOptions{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay},
           true, "AdamW") {}

void Adam::set_lr(double lr) {
  validate_lr(lr);
  options_.lr = lr;
}

void Adam::update(size_t i, const Tensor& g, ParamState& s) {
  const Tensor& p = params_[i];
  for (Tensor& b : s.buffers)
    if (!b.defined()) b = zeros(p.shape(), {.dtype = p.dtype(), .device = p.device()});
  const double t = static_cast<double>(s.steps);
  AdamUpdate u{.lr = options_.lr, .beta1 = options_.beta1, .beta2 = options_.beta2, .eps = options_.eps,
               .weight_decay = options_.weight_decay, .decoupled_weight_decay = decoupled_,
               .step_size = options_.lr / (1.0 - std::pow(options_.beta1, t)),
               .bias_correction2_sqrt = std::sqrt(1.0 - std::pow(options_.beta2, t))};
  const Tensor& m = s.buffers[0];
  const Tensor& v = s.buffers[1];
  if (p.device().is_cuda()) {
#if TG_CUDA
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
