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
  TG_CHECK(std::isfinite(options.init_scale) && options.init_scale > 0, op, ": init_scale ", options.init_scale,
           " must be finite and > 0");
  TG_CHECK(std::isfinite(options.growth_factor) && options.growth_factor > 1, op, ": growth_factor ",
           options.growth_factor, " must be finite and > 1");
  TG_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1, op, ": backoff_factor ", options.backoff_factor,
           " must be in (0, 1)");
  TG_CHECK(options.growth_interval > 0, op, ": growth_interval ", options.growth_interval, " must be > 0");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  TG_CHECK(loss.defined(), "GradScaler::scale: the loss is an undefined tensor");
  if (!options_.enabled) return loss;
  return mul(loss, scale_);
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!options_.enabled) return;
  TG_CHECK(!unscaled_, "GradScaler::unscale_: already called since the last update()");
  TG_CHECK(!stepped_, "GradScaler::unscale_: step() already ran since the last update()");
  NoGradGuard no_grad;
  const double inv = 1.0 / scale_;  // exact: the scale is a power of two unless set otherwise
  // g * 0 is 0 for every finite g and NaN for an infinity or a NaN, and a sum of those never
  // overflows: the sum over a grad is 0 exactly when all its elements are finite. One such
  // scalar per grad, concatenated per (device, dtype), then read back once per group.
  std::map<std::pair<std::string, DType>, std::vector<Tensor>> probes;
  for (const Tensor& p : opt.params()) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    probes[{g.device().str(), g.dtype()}].push_back(sum(mul(g, 0.0)).reshape({1}));
    p.set_grad(mul(g, inv));
  }
  found_inf_ = false;
  for (const auto& [key, scalars] : probes) {
    const double total = sum(cat(scalars, 0)).to(DType::f64).to(Device::cpu()).to_vector<double>()[0];
    if (!std::isfinite(total)) found_inf_ = true;
  }
  unscaled_ = true;
}

bool GradScaler::step(Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  TG_CHECK(!stepped_, "GradScaler::step: already called since the last update()");
  if (!unscaled_) unscale_(opt);
  stepped_ = true;
  if (found_inf_) return false;
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  TG_CHECK(stepped_, "GradScaler::update: call step() first");
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;  // past the largest double the scale stays
    growth_tracker_ = 0;
  }
  unscaled_ = stepped_ = found_inf_ = false;
}

void GradScaler::load_state(double scale, int64_t growth_tracker) {
  TG_CHECK(std::isfinite(scale) && scale > 0, "GradScaler::load_state: scale ", scale, " must be finite and > 0");
  TG_CHECK(growth_tracker >= 0 && growth_tracker < options_.growth_interval, "GradScaler::load_state: growth tracker ",
           growth_tracker, " must be in [0, growth_interval ", options_.growth_interval, ")");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  unscaled_ = stepped_ = found_inf_ = false;
}

}  // namespace tg::nn
