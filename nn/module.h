// Module: the base of every layer. A module owns parameter tensors (members registered by
// pointer, so that checkpoint loading can fill them in place), buffers (state that is saved
// and moved but not trained, such as running statistics) and submodules, and names them the
// way PyTorch does ("0.weight", "features.0.bias"), so that state dicts map one to one onto
// PyTorch's.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../core/tensor.h"

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
  // Undefined slots (a layer built with bias = false) are left out, as PyTorch leaves out None;
  // a tensor held by several slots (tied weights) is listed once, under its first name.
  // named_parameter_slots() lists every slot (for loading into each).
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<std::pair<std::string, Tensor*>> named_parameter_slots();
  // Direct children, in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  // This module and every submodule below it, depth first, this one first; a submodule
  // registered twice appears once. Names as PyTorch's named_modules(): "" for this module,
  // then "0", "0.conv", ... The pointers are valid while this module lives.
  std::vector<std::pair<std::string, Module*>> named_modules();
  std::vector<Module*> modules();
  // Calls fn on every submodule (recursively, each child's subtree first) and then on this
  // module, as PyTorch's Module.apply. Returns *this.
  Module& apply(const std::function<void(Module&)>& fn);

  // Buffers: tensors saved in checkpoints and moved by to() but not returned by
  // parameters() (so no optimizer trains them). Recursive, in registration order.
  std::vector<Tensor> buffers() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // What a checkpoint holds, in PyTorch's state_dict order: per module its parameters, then
  // its buffers, then each child's. The handles are the live tensors, not copies.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  std::vector<std::pair<std::string, Tensor*>> named_state_slots();

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Drops every parameter's grad (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();

  // Moves (or casts) every parameter and buffer in place: each keeps its tensor (the same
  // TensorImpl, via Tensor::set_data_), so handles held elsewhere (an optimizer built
  // before the move, tied weights) see the new data; grads move along. to(DType) casts the
  // parameters and the floating-point buffers only (integer buffers such as counters stay).
  void to(Device d);
  void to(DType t);

 protected:
  // `slot` must outlive the module (a member). An undefined slot is allowed (bias = false).
  // Defined parameters become leaves that require grad.
  void register_parameter(std::string name, Tensor* slot);
  void register_module(std::string name, std::shared_ptr<Module> m);
  // A buffer held by a member (`slot` must outlive the module), or, in libtorch's form, a
  // tensor the module keeps itself; that form returns the handle, which stays valid after
  // to() (the data moves inside the same tensor). Any dtype; not made to require grad.
  void register_buffer(std::string name, Tensor* slot);
  Tensor register_buffer(std::string name, Tensor value);

 private:
  // What collect() gathers: parameters, buffers or both (the state dict's order).
  enum class Slots { parameters, buffers, state };
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out,
               Slots which = Slots::parameters) const;
  void check_new_name(const std::string& name) const;

  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::deque<Tensor> owned_buffers_;  // register_buffer(name, value); a deque keeps addresses
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace tg::nn
