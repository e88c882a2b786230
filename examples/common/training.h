// Training helpers shared by the examples: the optimizer chosen on the command line, the
// norm of a gradient (how C shows that its conv learns only from step 2 on), and the
// training phase of the workload examples.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/example.h"
#include "core/tensor.h"
#include "nn/layers.h"
#include "nn/optim/optimizer.h"

namespace ex {

// "sgd" (plain, no momentum) or "adam" with the given learning rate.
std::unique_ptr<tg::nn::Optimizer> make_optimizer(const std::string& name, std::vector<tg::Tensor> params,
                                                  double lr);

// Number of rows of logits (N, classes) whose largest entry is at the label (N).
int64_t count_correct(const tg::Tensor& logits, const tg::Tensor& labels);

// sqrt(sum(g^2)) of a tensor's gradient; 0 when it has none.
double grad_norm(const tg::Tensor& param);

// The training phase of a workload example: MSE of model(x) against a fixed target, one
// tape per step, the optimizer of --optim over `params` at `lr`.
struct MseTraining {
  // Default member initializers keep -Wmissing-field-initializers quiet for designated
  // initializers that leave the optional fields out.
  std::function<tg::Tensor(const tg::Tensor&)> model{};
  tg::Tensor x{}, target{};
  std::vector<tg::Tensor> params{};
  double lr = 0;
  std::string note{};  // printed under the header line
  // Both run outside the timed phases: after_backward while the gradients are still there
  // (the optimizer's zero_grad drops them), after_report under the step's progress line.
  std::function<void(int64_t step)> after_backward{}, after_report{};
};

// Prints the header line, one line per step (forward, backward and optimizer times) and the
// summary (mean times, peak GPU memory).
void train_mse(const ExampleOptions& o, const MseTraining& t);

// The training phase of A and B: a bias-free Conv2d against a fixed random target of its
// output's shape. The loss is quadratic in the weight with Hessian ~ (2 / out_channels) * I
// for unit-variance inputs, so plain SGD takes a large step: lr = 16 removes about a quarter
// of the error per step.
void train_conv2d(const ExampleOptions& o, tg::nn::Conv2d& conv, const tg::Tensor& x, const tg::Shape& y_shape);

}  // namespace ex
