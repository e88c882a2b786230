#include "nn/module.h"

#include <unordered_set>

#include "autograd/tape.h"
#include "core/dtype_dispatch.h"

namespace tg::nn {

void Module::check_new_name(const std::string& name) const {
  TG_CHECK(!name.empty(), "Module: a parameter or submodule needs a non-empty name");
  TG_CHECK(name.find('.') == std::string::npos, "Module: name '", name,
           "' contains '.', which separates the levels of a parameter's path");
  for (const auto& [n, slot] : params_)
    TG_CHECK(n != name, "Module: a parameter named '", name, "' is already registered");
  for (const auto& [n, slot] : buffers_)
    TG_CHECK(n != name, "Module: a buffer named '", name, "' is already registered");
  for (const auto& [n, child] : children_)
    TG_CHECK(n != name, "Module: a submodule named '", name, "' is already registered");
}

void Module::register_parameter(std::string name, Tensor* slot) {
  TG_CHECK(slot != nullptr, "Module::register_parameter('", name, "'): null slot");
  check_new_name(name);
  if (slot->defined()) {
    TG_CHECK(is_floating(slot->dtype()), "Module::register_parameter('", name, "'): ", describe(*slot),
             " is not floating point");
    // A parameter is a leaf even if it was computed (e.g. scaled after init under a tape).
    if (!slot->is_leaf()) *slot = slot->detach();
    slot->requires_grad_(true);
  }
  params_.emplace_back(std::move(name), slot);
}

void Module::register_module(std::string name, std::shared_ptr<Module> m) {
  TG_CHECK(m != nullptr, "Module::register_module('", name, "'): null module");
  check_new_name(name);
  children_.emplace_back(std::move(name), std::move(m));
}

void Module::register_buffer(std::string name, Tensor* slot) {
  TG_CHECK(slot != nullptr, "Module::register_buffer('", name, "'): null slot");
  check_new_name(name);
  buffers_.emplace_back(std::move(name), slot);
}

Tensor Module::register_buffer(std::string name, Tensor value) {
  TG_CHECK(value.defined(), "Module::register_buffer('", name, "'): undefined tensor");
  check_new_name(name);  // before the deque grows: a refused name leaves nothing behind
  owned_buffers_.push_back(std::move(value));
  buffers_.emplace_back(std::move(name), &owned_buffers_.back());
  return owned_buffers_.back();
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out,
                     Slots which) const {
  if (which != Slots::buffers)
    for (const auto& [name, slot] : params_)
      if (slot->defined()) out.emplace_back(prefix + name, slot);
  if (which != Slots::parameters)
    for (const auto& [name, slot] : buffers_)
      if (slot->defined()) out.emplace_back(prefix + name, slot);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, which);
}

namespace {
std::vector<std::pair<std::string, Tensor>> values_of(std::vector<std::pair<std::string, Tensor*>> slots) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(slots.size());
  for (auto& [name, slot] : slots) out.emplace_back(std::move(name), *slot);
  return out;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", slots, Slots::buffers);
  return values_of(std::move(slots));
}

std::vector<Tensor> Module::buffers() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", slots, Slots::state);
  return values_of(std::move(slots));
}

std::vector<std::pair<std::string, Tensor*>> Module::named_state_slots() {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", out, Slots::state);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  std::unordered_set<const Module*> seen;  // PyTorch lists a shared submodule once
  std::function<void(const std::string&, Module*)> visit = [&](const std::string& prefix, Module* m) {
    if (!seen.insert(m).second) return;
    out.emplace_back(prefix, m);
    for (const auto& [name, child] : m->children_) visit(prefix.empty() ? name : prefix + "." + name, child.get());
  };
  visit("", this);
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  for (const auto& [name, m] : named_modules()) out.push_back(m);
  return out;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (const auto& [name, child] : children_) child->apply(fn);
  fn(*this);
  return *this;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameter_slots() {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", out);
  return out;
}

// A tensor registered under several names (tied weights, a shared submodule) is listed once,
// under its first name, as in PyTorch: an optimizer must update it once, a gradient norm
// must count it once.
std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", slots);
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(slots.size());
  std::unordered_set<const TensorImpl*> seen;
  for (auto& [name, slot] : slots)
    if (seen.insert(slot->impl()).second) out.emplace_back(std::move(name), *slot);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(std::move(t));
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (const Tensor& p : parameters()) p.zero_grad();
}

// Both move the data inside each tensor (set_data_), never replace a slot's tensor: an
// optimizer built before the move holds the same handles and keeps training them, and a
// tensor registered twice (tied weights) is moved once and stays shared.
void Module::to(Device d) {
  NoGradGuard no_grad;  // moving a model is not part of any forward pass
  for (auto& [name, slot] : named_state_slots()) {
    if (slot->device() == d) continue;
    slot->set_data_(slot->detach().to(d));
    const Tensor g = slot->grad();
    if (g.defined()) slot->set_grad(g.detach().to(d));
  }
}

void Module::to(DType t) {
  // Parameters carry gradients, which the half types do not: they stay f32 / f64.
  TG_CHECK_AS(DTypeError, !is_half(t), "Module::to: parameters stay f32 or f64 (", dtype_name(t),
              " tensors carry no gradients); convert inputs or a detached state dict with .to(DType::",
              dtype_name(t), ") instead");
  TG_CHECK(is_floating(t), "Module::to: parameters must stay floating point, not ", dtype_name(t));
  NoGradGuard no_grad;
  for (auto& [name, slot] : named_state_slots()) {
    if (slot->dtype() == t || !is_floating(slot->dtype())) continue;  // integer buffers stay
    slot->set_data_(slot->detach().to(t));
    const Tensor g = slot->grad();
    if (g.defined()) slot->set_grad(g.detach().to(t));
  }
}

}  // namespace tg::nn
