// Loss functors, PyTorch-style (nn::MSELoss()(pred, target)). MSE and cross entropy reduce by
// the mean; the others take a reduction (mean, sum or none) as PyTorch's modules do.
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

// logits and target of one shape: nn::BCEWithLogitsLoss{.reduction = Reduction::sum}(x, y).
struct BCEWithLogitsLoss {
  Reduction reduction = Reduction::mean;
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return binary_cross_entropy_with_logits(logits, target, reduction);
  }
};

struct L1Loss {
  Reduction reduction = Reduction::mean;
  Tensor operator()(const Tensor& pred, const Tensor& target) const { return l1_loss(pred, target, reduction); }
};

struct SmoothL1Loss {
  Reduction reduction = Reduction::mean;
  double beta = 1.0;
  Tensor operator()(const Tensor& pred, const Tensor& target) const {
    return smooth_l1_loss(pred, target, {.beta = beta, .reduction = reduction});
  }
};

struct HuberLoss {
  Reduction reduction = Reduction::mean;
  double delta = 1.0;
  Tensor operator()(const Tensor& pred, const Tensor& target) const {
    return huber_loss(pred, target, {.delta = delta, .reduction = reduction});
  }
};

}  // namespace tg::nn
