// One classification training step for the examples (forward, cross-entropy, backward,
// optimizer step), eager or, with --graph, through a tg::cuda::GraphedStep: the batch is
// copied into static input and label tensors, which the captured step reads at every
// replay, and the logits are copied out into a static tensor for the accuracy count.
//
//   ex::TrainStep train_step([&](const tg::Tensor& x) { return model(x); }, *optimizer, graph);
//   for (batch : loader) {
//     auto [loss, logits] = train_step(batch.input, batch.target);  // valid until the next call
//   }
#pragma once
#include <functional>
#include <memory>
#include <utility>

#include "tapegrad/tapegrad.h"

namespace ex {

class TrainStep {
 public:
  using Forward = std::function<tg::Tensor(const tg::Tensor&)>;
  TrainStep(Forward forward, tg::nn::Optimizer& optimizer, bool graph)
      : forward_(std::move(forward)), optimizer_(optimizer), graph_(graph) {}

  // Every batch must have the first batch's shapes when graphed (drop the last partial batch).
  std::pair<tg::Tensor, tg::Tensor> operator()(const tg::Tensor& input, const tg::Tensor& labels) {
    if (!graph_) return step(input, labels);
    if (!graphed_) {
      TG_CHECK(input.device().is_cuda(), "--graph: CUDA graphs need --device cuda");
      input_ = tg::Tensor::empty(input.shape(), {.dtype = input.dtype(), .device = input.device()});
      labels_ = tg::Tensor::empty(labels.shape(), {.dtype = labels.dtype(), .device = labels.device()});
      graphed_ = std::make_unique<tg::cuda::GraphedStep>(
          [this] {
            auto [loss, logits] = step(input_, labels_);
            if (!logits_.defined())
              logits_ = tg::Tensor::empty(logits.shape(), {.dtype = logits.dtype(), .device = logits.device()});
            logits_.copy_(logits);
            return loss;
          },
          tg::cuda::GraphedStepOptions{.warmup = 2, .device = input.device()});
    }
    TG_CHECK(input.shape() == input_.shape() && labels.shape() == labels_.shape(),
             "--graph: every batch must have the shape of the first one, ", input_.shape(), " and ", labels_.shape(),
             "; got ", input.shape(), " and ", labels.shape());
    input_.copy_(input);
    labels_.copy_(labels);
    tg::Tensor loss = (*graphed_)();
    return {loss, logits_};
  }

 private:
  std::pair<tg::Tensor, tg::Tensor> step(const tg::Tensor& input, const tg::Tensor& labels) {
    tg::Tape tape;
    tg::Tensor logits = forward_(input);
    tg::Tensor loss = tg::cross_entropy(logits, labels);
    tape.backward(loss);
    optimizer_.step();
    optimizer_.zero_grad();
    return {loss, logits};
  }

  Forward forward_;
  tg::nn::Optimizer& optimizer_;
  bool graph_;
  tg::Tensor input_, labels_, logits_;  // the graphed step's static buffers
  std::unique_ptr<tg::cuda::GraphedStep> graphed_;
};

}  // namespace ex
