// Module: the base of every layer. A module owns parameter tensors (members registered by
// pointer, so that to() and checkpoint loading can replace them in place) and submodules,
// and names them the way PyTorch does ("0.weight", "features.0.bias"), so that state dicts
// map one to one onto PyTorch's.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tg::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Parameters are registered by the address of a member: a copied or moved module
  // would point into its source.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Recursive, in registration order (own parameters first, then each child's).
  // Undefined slots (a layer built with bias = false) are left out, as PyTorch leaves out None.
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<std::pair<std::string, Tensor*>> named_parameter_slots();
  // Direct children, in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Drops every parameter's grad (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();

  // Moves (or casts) every parameter: each slot gets a new leaf tensor with the same
  // requires_grad, its grad moved along. Optimizers hold parameter handles, so build them
  // after moving the model.
  void to(Device d);
  void to(DType t);

 protected:
  // `slot` must outlive the module (a member). An undefined slot is allowed (bias = false).
  // Defined parameters become leaves that require grad.
  void register_parameter(std::string name, Tensor* slot);
  void register_module(std::string name, std::shared_ptr<Module> m);

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out) const;
  void check_new_name(const std::string& name) const;

  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace tg::nn
