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

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : Optimizer(std::move(params)), options_(o) {
  // SGDOptions{} leaves lr at 0: say that there is no default rather than only "invalid".
  TG_CHECK(o.lr != 0, "SGD: invalid learning rate 0: SGD has no default learning rate (as torch.optim.SGD);",
           " pass one, e.g. nn::SGD opt(params, {.lr = 0.01})");
  check_lr("SGD", o.lr);
  check_range("SGD", "momentum", o.momentum, 0, 1, true);
  check_range("SGD", "dampening", o.dampening, 0, 1, false);
  check_non_negative("SGD", "weight_decay", o.weight_decay);
  TG_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
           "SGD: nesterov momentum requires a momentum > 0 and zero dampening (got momentum ", o.momentum,
           ", dampening ", o.dampening, ")");
}

void SGD::set_lr(double lr) {
  validate_lr(lr);
  options_.lr = lr;
}

std::vector<std::string> SGD::buffer_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update(size_t i, const Tensor& g, ParamState& s) {
  const Tensor& p = params_[i];
  SGDUpdate u{.lr = options_.lr, .momentum = options_.momentum, .dampening = options_.dampening,
              .weight_decay = options_.weight_decay, .nesterov = options_.nesterov, .first_step = false};
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
