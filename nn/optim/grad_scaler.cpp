#include "nn/optim/grad_scaler.h"

#include <cmath>
#include <map>

#include "autograd/tape.h"
#include "core/error.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace tg::nn {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  const char* op = "GradScaler";
  check_scale(op, "init_scale", options.init_scale);
  TG_CHECK(std::isfinite(options.growth_factor) && options.growth_factor > 1, op, ": growth_factor ",
           options.growth_factor, " must be finite and > 1");
  TG_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1, op, ": backoff_factor ", options.backoff_factor,
           " must be in (0, 1)");
  TG_CHECK(options.growth_interval > 0, op, ": growth_interval ", options.growth_interval, " must be > 0");
}

void GradScaler::check_scale(const char* op, const char* what, double scale) {
  // Unscaling multiplies by 1 / scale: an infinite inverse would turn every grad into an
  // infinity or a NaN (a denormal scale such as 1e-310 has one).
  TG_CHECK(std::isfinite(scale) && scale > 0 && std::isfinite(1.0 / scale), op, ": ", what, " ", scale,
           " must be finite and > 0, with a finite inverse (1 / ", what, " = ", 1.0 / scale, ")");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  TG_CHECK(loss.defined(), "GradScaler::scale: the loss is an undefined tensor");
  if (!options_.enabled) return loss;
  return mul(loss, scale_);
}

void GradScaler::check_grads(const Optimizer& opt) {
  const char* op = "GradScaler::unscale_";
  const std::vector<Tensor>& params = opt.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    TG_CHECK_AS(DTypeError, g.dtype() == p.dtype(), op, ": parameter ", i, " ", describe(p), " of ", opt.name(),
                " has a grad ", describe(g), " of another dtype");
    TG_CHECK_AS(ShapeError, g.shape() == p.shape(), op, ": parameter ", i, " ", describe(p), " of ", opt.name(),
                " has a grad ", describe(g), " of another shape");
    TG_CHECK_AS(DeviceError, g.device() == p.device(), op, ": parameter ", i, " ", describe(p), " of ", opt.name(),
                " has a grad ", describe(g), " on another device");
  }
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!options_.enabled) return;
  const auto found = per_optimizer_.find(&opt);
  if (found != per_optimizer_.end()) {
    TG_CHECK(!found->second.unscaled, "GradScaler::unscale_: already called for this ", opt.name(),
             " since the last update()");
    TG_CHECK(!found->second.stepped, "GradScaler::unscale_: step() already ran for this ", opt.name(),
             " since the last update()");
  }
  check_grads(opt);
  NoGradGuard no_grad;
  const double inv = 1.0 / scale_;  // finite (check_scale); exact when the scale is a power of two
  // Every quotient is computed (and probed) before any grad is replaced: whatever throws
  // on the way leaves the grads as they were, so a retry does not divide twice.
  std::vector<std::pair<size_t, Tensor>> quotients;
  // The quotients are probed, not the scaled grads: a finite grad divided by a tiny scale
  // may overflow. q * 0 is 0 for every finite q and NaN for an infinity or a NaN, and a sum
  // of those never overflows: the sum is 0 exactly when every element is finite. One such
  // scalar per grad, concatenated per (device, dtype), then read back once per group.
  std::map<std::pair<std::string, DType>, std::vector<Tensor>> probes;
  const std::vector<Tensor>& params = opt.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    if (!g.defined()) continue;
    Tensor q = mul(g, inv);
    probes[{q.device().str(), q.dtype()}].push_back(sum(mul(q, 0.0)).reshape({1}));
    quotients.emplace_back(i, std::move(q));
  }
  bool found_inf = false;
  for (const auto& [key, scalars] : probes) {
    const double total = sum(cat(scalars, 0)).to(DType::f64).to(Device::cpu()).to_vector<double>()[0];
    if (!std::isfinite(total)) found_inf = true;
  }
  OptimizerState& state = per_optimizer_[&opt];
  for (auto& [i, q] : quotients) params[i].set_grad(std::move(q));
  state.unscaled = true;
  state.found_inf = found_inf;
}

bool GradScaler::step(Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  const auto found = per_optimizer_.find(&opt);
  TG_CHECK(found == per_optimizer_.end() || !found->second.stepped, "GradScaler::step: already called for this ",
           opt.name(), " since the last update()");
  if (found == per_optimizer_.end() || !found->second.unscaled) unscale_(opt);
  OptimizerState& state = per_optimizer_.at(&opt);
  if (state.found_inf) {
    state.stepped = true;
    return false;
  }
  opt.step();  // a step that throws leaves the optimizer unstepped: it may be retried
  state.stepped = true;
  return true;
}

double GradScaler::backed_off_scale() const {
  const double backed = scale_ * options_.backoff_factor;
  return backed > 0 && std::isfinite(1.0 / backed) ? backed : scale_;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool stepped = false, found_inf = false;
  for (const auto& [opt, state] : per_optimizer_) {
    stepped = stepped || state.stepped;
    found_inf = found_inf || state.found_inf;
  }
  TG_CHECK(stepped, "GradScaler::update: call step() first");
  if (found_inf) {
    scale_ = backed_off_scale();
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;  // past the largest double the scale stays
    growth_tracker_ = 0;
  }
  per_optimizer_.clear();
}

void GradScaler::load_state(double scale, int64_t growth_tracker) {
  check_scale("GradScaler::load_state", "scale", scale);
  TG_CHECK(growth_tracker >= 0 && growth_tracker < options_.growth_interval, "GradScaler::load_state: growth tracker ",
           growth_tracker, " must be in [0, growth_interval ", options_.growth_interval, ")");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  per_optimizer_.clear();
}

}  // namespace tg::nn
