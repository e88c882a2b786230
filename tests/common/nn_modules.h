// Modules shared by the nn test programs (test_nn, test_nn_layers, test_nn_module_to): parameter
// names, the small CNN of the training tests, a nested module and one that reaches the
// protected registration calls.
#pragma once
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"

namespace tg::test {

inline std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

// conv -> group norm -> relu -> global mean -> linear: the shape of the training tests.
inline std::shared_ptr<nn::Sequential> small_cnn(TensorOptions t = {}) {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 3, .out_channels = 6, .kernel_size = {3, 3},
                                                     .padding = {1}}, t),
      std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 2, .num_channels = 6}, t),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MeanPool>(),
      std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 6, .out_features = 5}, t)});
}

// A module with its own parameter and two named children, to check nested names.
class Net : public nn::Module {
 public:
  Net() {
    scale = ones({5}).requires_grad_();
    register_parameter("scale", &scale);
    register_module("features", features);
    register_module("head", head);
  }
  Tensor forward(const Tensor& x) override { return head->forward(features->forward(x)) * scale; }

  Tensor scale;
  std::shared_ptr<nn::Sequential> features = std::make_shared<nn::Sequential>(
      std::initializer_list<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 3, .out_channels = 4, .kernel_size = 3, .bias = false}),
          std::make_shared<nn::ReLU>(), std::make_shared<nn::MeanPool>()});
  std::shared_ptr<nn::Linear> head = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 5});
};

// Registers whatever the test asks for, to reach the protected registration errors.
class Registrar : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  void param(const std::string& name, Tensor* slot) { register_parameter(name, slot); }
  void module(const std::string& name, std::shared_ptr<nn::Module> m) { register_module(name, std::move(m)); }
  Tensor a = random({2}), b = random({2});
};

}  // namespace tg::test
