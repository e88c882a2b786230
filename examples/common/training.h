// Training helpers shared by the examples: the optimizer chosen on the command line, and
// the norm of a gradient (how C shows that its conv learns only from step 2 on).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/optim/optimizer.h"

namespace ex {

// "sgd" (plain, no momentum) or "adam" with the given learning rate.
std::unique_ptr<tg::nn::Optimizer> make_optimizer(const std::string& name, std::vector<tg::Tensor> params,
                                                  double lr);

// sqrt(sum(g^2)) of a tensor's gradient; 0 when it has none.
double grad_norm(const tg::Tensor& param);

}  // namespace ex
