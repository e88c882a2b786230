#include "nn/module.h"

#include "autograd/tape.h"

namespace tg::nn {

void Module::check_new_name(const std::string& name) const {
  TG_CHECK(!name.empty(), "Module: a parameter or submodule needs a non-empty name");
  TG_CHECK(name.find('.') == std::string::npos, "Module: name '", name,
           "' contains '.', which separates the levels of a parameter's path");
  for (const auto& [n, slot] : params_)
    TG_CHECK(n != name, "Module: a parameter named '", name, "' is already registered");
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

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out) const {
  for (const auto& [name, slot] : params_)
    if (slot->defined()) out.emplace_back(prefix + name, slot);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameter_slots() {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", slots);
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(slots.size());
  for (auto& [name, slot] : slots) out.emplace_back(std::move(name), *slot);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", slots);
  std::vector<Tensor> out;
  out.reserve(slots.size());
  for (auto& [name, slot] : slots) out.push_back(*slot);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (const Tensor& p : parameters()) p.zero_grad();
}

namespace {
// A fresh leaf holding `moved`'s storage, with the requires_grad of `old`.
Tensor as_leaf_like(const Tensor& moved, const Tensor& old) {
  Tensor leaf = moved.detach();
  leaf.requires_grad_(old.requires_grad());
  return leaf;
}
}  // namespace

void Module::to(Device d) {
  NoGradGuard no_grad;  // moving a model is not part of any forward pass
  for (auto& [name, slot] : named_parameter_slots()) {
    if (slot->device() == d) continue;
    Tensor old = *slot;
    Tensor moved = as_leaf_like(old.to(d), old);
    if (old.grad().defined()) moved.set_grad(old.grad().to(d).detach());
    *slot = moved;
  }
}

void Module::to(DType t) {
  TG_CHECK(is_floating(t), "Module::to: parameters must stay floating point, not ", dtype_name(t));
  NoGradGuard no_grad;
  for (auto& [name, slot] : named_parameter_slots()) {
    if (slot->dtype() == t) continue;
    Tensor old = *slot;
    Tensor cast = as_leaf_like(old.to(t), old);
    if (old.grad().defined()) cast.set_grad(old.grad().to(t).detach());
    *slot = cast;
  }
}

}  // namespace tg::nn
