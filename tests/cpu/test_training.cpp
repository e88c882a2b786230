// End to end on the CPU: a small CNN trained for a few steps (the loss must fall at every
// step), and the tape's contract as a training loop relies on it: reuse of a tensor,
// accumulation across tapes, nothing recorded outside a tape, and its clear errors.
#include <cmath>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

// conv -> group norm -> relu -> mean over space -> linear.
std::shared_ptr<nn::Sequential> small_cnn() {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 3, .out_channels = 8, .kernel_size = {3, 3},
                                                     .padding = {1}}),
      std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 4, .num_channels = 8}),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MeanPool>(),
      std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 8, .out_features = 4})});
}

// Trains for `steps` steps on fixed data; returns the loss before each step.
std::vector<double> train(nn::Module& model, nn::Optimizer& opt, const Tensor& x, const Tensor& target, int steps) {
  nn::MSELoss loss_fn;
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    Tape tape;
    Tensor loss = loss_fn(model(x), target);
    losses.push_back(loss.item());
    tape.backward(loss);
    opt.step();
    opt.zero_grad();
  }
  return losses;
}

void expect_strictly_falling(const std::vector<double>& losses) {
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 1]) << "step " << i;
  EXPECT_LT(losses.back(), 0.9 * losses.front());
}

}  // namespace

TEST(Training, SmallCnnSgdLossFalls) {
  manual_seed(2024);
  auto model = small_cnn();
  Tensor x = randn({6, 3, 9, 13});
  Tensor target = randn({6, 4});
  nn::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  auto losses = train(*model, opt, x, target, 6);
  expect_strictly_falling(losses);
  // Every parameter was updated (each got a grad through the whole chain).
  EXPECT_EQ(opt.step_count(), 6);
  for (size_t i = 0; i < opt.params().size(); ++i) EXPECT_EQ(opt.step_count(i), 6) << i;
}

TEST(Training, SmallCnnAdamLossFalls) {
  manual_seed(7);
  auto model = small_cnn();
  Tensor x = randn({5, 3, 7, 9});
  Tensor target = randn({5, 4});
  nn::AdamW opt(model->parameters(), {.lr = 0.02});
  expect_strictly_falling(train(*model, opt, x, target, 5));
}

TEST(Training, CrossEntropyLossFalls) {
  manual_seed(8);
  auto model = small_cnn();
  Tensor x = randn({6, 3, 7, 9});
  Tensor labels = from_vector(std::vector<int64_t>{0, 3, 1, 2, 3, 0}, {6});
  nn::Adam opt(model->parameters(), {.lr = 0.02});
  nn::CrossEntropyLoss loss_fn;
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    Tape tape;
    Tensor loss = loss_fn(model->forward(x), labels);
    losses.push_back(loss.item());
    tape.backward(loss);
    opt.step();
    opt.zero_grad();
  }
  expect_strictly_falling(losses);
}

TEST(Tape, ReusedTensorAccumulates) {
  // y = x * x + x uses x three times: dy/dx = 2x + 1.
  Tensor x = param({7});
  Tape tape;
  Tensor y = x * x + x;
  tape.backward(sum(y));
  auto vx = x.to_vector<double>(), g = x.grad().to_vector<double>();
  for (size_t i = 0; i < vx.size(); ++i) EXPECT_NEAR(g[i], 2 * vx[i] + 1, 1e-14);
}

TEST(Tape, LeafGradsAccumulateAcrossTapes) {
  Tensor x = param({9});
  {
    Tape tape;
    tape.backward(sum(x * 3.0));
  }
  {
    Tape tape;
    tape.backward(sum(x * x));
  }
  auto vx = x.to_vector<double>(), g = x.grad().to_vector<double>();
  for (size_t i = 0; i < vx.size(); ++i) EXPECT_NEAR(g[i], 3 + 2 * vx[i], 1e-14);
}

TEST(Tape, NothingRecordedOutsideATape) {
  Tensor x = param({5});
  Tensor y = x * x;  // no tape: plain inference
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  Tape tape;
  {
    NoGradGuard no_grad;  // paused inside a tape as well
    Tensor z = x * x;
    EXPECT_FALSE(z.requires_grad());
  }
  EXPECT_TRUE(tape.entries().empty());
  // ... so its loss cannot be differentiated on a tape opened afterwards.
  TG_EXPECT_ERROR(tape.backward(sum(y)), "not recorded on this tape");
}

TEST(Tape, LossFromAnotherTapeIsRejected) {
  Tensor x = param({5});
  Tape outer;
  Tensor loss = sum(x * x);  // recorded on `outer`
  Tape inner;
  TG_EXPECT_ERROR(inner.backward(loss), "Tape::backward", "not recorded on this tape");
}

TEST(Tape, NonScalarLossNeedsSeed) {
  Tensor x = param({3, 4});
  Tape tape;
  Tensor y = x * 2.0;
  TG_EXPECT_ERROR(tape.backward(y), "not a scalar", "[3, 4]");
  tape.backward(y, full({3, 4}, 0.5, {.dtype = f64}));  // with a seed it works: 2 * 0.5
  for (double g : x.grad().to_vector<double>()) EXPECT_EQ(g, 1.0);
}

TEST(Tape, ParameterUpdatedAfterSaveIsRejected) {
  // mul saves both operands; an optimizer step between forward and backward changes w
  // in place, so the saved value is stale and backward must refuse.
  Tensor w = param({4});
  Tensor x = random({4});
  nn::SGD opt({w}, {.lr = 0.1});
  w.set_grad(random({4}));
  Tape tape;
  Tensor loss = sum(x * w);
  opt.step();
  TG_EXPECT_ERROR(tape.backward(loss), "modified in place", "mul");
}

TEST(Tape, FillOfSavedTensorIsRejected) {
  Tensor a = param({5});
  Tape tape;
  Tensor h = a * 2.0;  // affine saves nothing...
  Tensor loss = sum(h * h);  // ... but mul saves h
  h.fill_(1.0);
  TG_EXPECT_ERROR(tape.backward(loss), "modified in place");
}
