#include "common/training.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "autograd/tape.h"
#include "core/storage.h"
#include "nn/optim/adam.h"
#include "nn/optim/sgd.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/reduce.h"

namespace ex {

std::unique_ptr<tg::nn::Optimizer> make_optimizer(const std::string& name, std::vector<tg::Tensor> params,
                                                  double lr) {
  if (name == "adam") return std::make_unique<tg::nn::Adam>(std::move(params), tg::nn::AdamOptions{.lr = lr});
  TG_CHECK(name == "sgd", "make_optimizer: unknown optimizer '", name, "' (sgd or adam)");
  return std::make_unique<tg::nn::SGD>(std::move(params), tg::nn::SGDOptions{.lr = lr});
}

int64_t count_correct(const tg::Tensor& logits, const tg::Tensor& labels) {
  const std::vector<float> l = logits.to_vector<float>();
  const std::vector<int64_t> y = labels.to_vector<int64_t>();
  const int64_t classes = logits.size(1);
  int64_t hits = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    auto row = l.begin() + static_cast<int64_t>(i) * classes;
    hits += std::max_element(row, row + classes) - row == y[i];
  }
  return hits;
}

double grad_norm(const tg::Tensor& param) {
  tg::Tensor g = param.grad();
  if (!g.defined()) return 0;
  tg::NoGradGuard no_record;
  return std::sqrt(tg::sum(g * g).item());
}

void train_mse(const ExampleOptions& o, const MseTraining& t) {
  auto optimizer = make_optimizer(o.optim, t.params, t.lr);
  std::printf("training %lld steps: %s lr %g, MSE against a fixed random target %s\n",
              static_cast<long long>(o.steps), o.optim.c_str(), t.lr, t.target.shape().str().c_str());
  if (!t.note.empty()) std::printf("%s\n", t.note.c_str());

  tg::reset_peak_memory(o.device);
  TrainingLog log;
  PhaseTimer timer(o.device);
  for (int64_t step = 1; step <= o.steps; ++step) {
    StepTimes times;
    timer.start();
    tg::Tape tape;  // records this step's ops; freed (with what it saved) at the end of the step
    tg::Tensor loss = tg::mse_loss(t.model(t.x), t.target);
    times.forward = timer.lap();
    tape.backward(loss);  // fills every parameter's grad()
    times.backward = timer.lap();
    if (t.after_backward) {
      t.after_backward(step);
      timer.start();
    }
    optimizer->step();
    optimizer->zero_grad();
    times.optimizer = timer.lap();
    log.step(step, loss.item(), times);
    if (t.after_report) t.after_report(step);
  }
  log.summary(o.device);
}

void train_conv2d(const ExampleOptions& o, tg::nn::Conv2d& conv, const tg::Tensor& x, const tg::Shape& y_shape) {
  train_mse(o, {.model = [&conv](const tg::Tensor& in) { return conv(in); },
                .x = x,
                .target = tg::randn(y_shape, {.device = o.device}),
                .params = conv.parameters(),
                .lr = learning_rate(o, 16.0, 2e-3)});
}

}  // namespace ex
