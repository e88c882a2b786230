// Loss functors, PyTorch-style (nn::MSELoss()(pred, target)); both reduce by the mean.
#pragma once
#include "../core/tensor.h"
#include "../ops/loss.h"

namespace tg::nn {

// mean((pred - target)^2), shape [].
struct MSELoss {
  Tensor operator()(const Tensor& pred, const Tensor& target) const { return mse_loss(pred, target); }
};

// logits (N, classes), targets i64 (N) -> mean cross entropy, shape [].
struct CrossEntropyLoss {
  Tensor operator()(const Tensor& logits, const Tensor& targets) const { return cross_entropy(logits, targets); }
};

}  // namespace tg::nn
