#include "nn/optim/optimizer.h"

#include <charconv>
#include <cmath>

#include "autograd/tape.h"

namespace tg::nn {

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)), state_(params_.size()) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    TG_CHECK(p.defined(), "Optimizer: parameter ", i, " is an undefined tensor");
    TG_CHECK(is_floating(p.dtype()), "Optimizer: parameter ", i, " ", describe(p), " is not floating point");
    TG_CHECK(p.is_leaf(), "Optimizer: parameter ", i, " ", describe(p),
             " is not a leaf (it was computed by an op on a tape); optimize the leaf it came from");
    for (size_t j = 0; j < i; ++j)
      TG_CHECK(!params_[j].same(p), "Optimizer: parameter ", i, " is the same tensor as parameter ", j);
  }
}

void Optimizer::check_lr(const char* optimizer, double lr) {
  TG_CHECK(std::isfinite(lr) && lr > 0, optimizer, ": invalid learning rate ", lr,
           " (it must be positive and finite", lr == 0 ? "; an lr of 0 would leave every parameter unchanged" : "",
           ")");
}

void Optimizer::check_range(const char* optimizer, const char* option, double value, double lo, double hi,
                            bool hi_open) {
  TG_CHECK(std::isfinite(value) && value >= lo && (hi_open ? value < hi : value <= hi), optimizer, ": invalid ",
           option, " ", value, " (it must be finite and in [", lo, ", ", hi, hi_open ? "))" : "])");
}

void Optimizer::check_non_negative(const char* optimizer, const char* option, double value) {
  TG_CHECK(std::isfinite(value) && value >= 0, optimizer, ": invalid ", option, " ", value,
           " (it must be finite and >= 0)");
}

int64_t Optimizer::step_count(size_t param_index) const {
  TG_CHECK(param_index < state_.size(), "Optimizer::step_count: parameter index ", param_index,
           " out of range (", state_.size(), " parameters)");
  return state_[param_index].steps;
}

void Optimizer::step() {
  NoGradGuard no_grad;  // an update is never part of a forward pass
  // Validate every grad before touching any parameter: a bad one leaves the model unchanged.
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    TG_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(),
             "Optimizer::step: parameter ", i, " ", describe(p), " has a grad ", describe(g),
             " of another shape, dtype or device");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    ParamState& s = state_[i];
    ++s.steps;
    if (s.buffers.size() != buffer_names().size()) s.buffers.resize(buffer_names().size());
    update(i, g, s);
    p.bump_version();
  }
  ++steps_;
}

void Optimizer::zero_grad() {
  for (const Tensor& p : params_) p.zero_grad();
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<std::string> names = buffer_names();
  for (size_t i = 0; i < state_.size(); ++i) {
    const ParamState& s = state_[i];
    if (s.steps == 0) continue;
    std::string prefix = std::to_string(i) + ".";
    if (has_step_state())
      out.emplace_back(prefix + "step", full(Shape{}, static_cast<double>(s.steps), {.dtype = DType::f64}));
    for (size_t b = 0; b < s.buffers.size(); ++b)
      if (s.buffers[b].defined()) out.emplace_back(prefix + names[b], s.buffers[b]);
  }
  return out;
}

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state) {
  std::vector<std::string> names = buffer_names();
  struct Item { size_t param; int buffer; Tensor value; };  // buffer -1: the step count
  std::vector<Item> items;
  // Check everything first, so that a bad checkpoint leaves the optimizer unchanged.
  for (const auto& [key, value] : state) {
    size_t dot = key.find('.');
    size_t index = 0;
    auto [end, ec] = std::from_chars(key.data(), key.data() + (dot == std::string::npos ? 0 : dot), index);
    TG_CHECK(dot != std::string::npos && ec == std::errc() && end == key.data() + dot,
             "Optimizer::load_state: key '", key, "' is not '<parameter index>.<name>'");
    TG_CHECK(index < params_.size(), "Optimizer::load_state: key '", key, "' names parameter ", index,
             " but the optimizer has ", params_.size());
    TG_CHECK(value.defined(), "Optimizer::load_state: '", key, "' is an undefined tensor");
    std::string field = key.substr(dot + 1);
    if (field == "step" && has_step_state()) {
      TG_CHECK(value.numel() == 1, "Optimizer::load_state: '", key, "' should hold one value, got ", describe(value));
      items.push_back({index, -1, value});
      continue;
    }
    int buffer = -1;
    for (size_t b = 0; b < names.size(); ++b)
      if (names[b] == field) buffer = static_cast<int>(b);
    TG_CHECK(buffer >= 0, "Optimizer::load_state: unknown state '", key, "' for this optimizer");
    TG_CHECK(value.shape() == params_[index].shape(), "Optimizer::load_state: '", key, "' ", describe(value),
             " does not match parameter ", index, " ", describe(params_[index]));
    items.push_back({index, buffer, value});
  }
  NoGradGuard no_grad;
  for (Item& it : items) {
    ParamState& s = state_[it.param];
    if (it.buffer < 0) {
      s.steps = static_cast<int64_t>(it.value.item());
      continue;
    }
    const Tensor& p = params_[it.param];
    s.buffers.resize(names.size());
    Tensor v = it.value.detach();
    if (v.dtype() != p.dtype()) v = v.to(p.dtype());
    if (v.device() != p.device()) v = v.to(p.device());
    // Always a private copy: the optimizer updates its buffers in place.
    s.buffers[it.buffer] = v.impl()->storage == it.value.impl()->storage ? v.clone() : v;
    // A parameter with buffers but no step state has still been updated (SGD with momentum).
    if (!has_step_state() && s.steps == 0) s.steps = 1;
  }
}

}  // namespace tg::nn
