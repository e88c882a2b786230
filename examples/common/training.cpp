#include "common/training.h"

#include <cmath>

#include "autograd/tape.h"
#include "nn/optim/adam.h"
#include "nn/optim/sgd.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace ex {

std::unique_ptr<tg::nn::Optimizer> make_optimizer(const std::string& name, std::vector<tg::Tensor> params,
                                                  double lr) {
  if (name == "adam") return std::make_unique<tg::nn::Adam>(std::move(params), tg::nn::AdamOptions{.lr = lr});
  TG_CHECK(name == "sgd", "make_optimizer: unknown optimizer '", name, "' (sgd or adam)");
  return std::make_unique<tg::nn::SGD>(std::move(params), tg::nn::SGDOptions{.lr = lr});
}

double grad_norm(const tg::Tensor& param) {
  tg::Tensor g = param.grad();
  if (!g.defined()) return 0;
  tg::NoGradGuard no_record;
  return std::sqrt(tg::sum(g * g).item());
}

}  // namespace ex
