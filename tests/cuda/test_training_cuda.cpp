// Training on the GPU against the CPU: the same seed gives the same initial weights on both
// devices (the generator is counter-based), and five steps of the same model on the same
// data must follow the CPU's loss curve and end at the same parameters.
#include <cmath>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

std::shared_ptr<nn::Sequential> small_cnn(Device d) {
  TensorOptions t{.device = d};
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 3, .out_channels = 8, .kernel_size = {3, 3},
                                                     .padding = {1}}, t),
      std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 4, .num_channels = 8}, t),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MeanPool>(),
      std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 8, .out_features = 4}, t)});
}

struct Curve {
  std::vector<double> losses;
  std::vector<Tensor> params;  // after training, on the CPU
};

template <class MakeOptimizer>
Curve train(Device d, MakeOptimizer make_optimizer, int steps = 5) {
  manual_seed(2024);
  auto model = small_cnn(d);
  Tensor x = randn({6, 3, 9, 13}).to(d);
  Tensor target = randn({6, 4}).to(d);
  auto opt = make_optimizer(model->parameters());
  nn::MSELoss loss_fn;
  Curve c;
  for (int step = 0; step < steps; ++step) {
    Tape tape;
    Tensor loss = loss_fn(model->forward(x), target);
    c.losses.push_back(loss.item());
    tape.backward(loss);
    opt->step();
    opt->zero_grad();
  }
  for (const Tensor& p : model->parameters()) c.params.push_back(p.cpu());
  return c;
}

template <class MakeOptimizer>
void expect_same_curve(MakeOptimizer make) {
  Curve cpu = train(Device::cpu(), make);
  Curve gpu = train(Device::cuda(), make);
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * std::fabs(cpu.losses[i])) << "step " << i;
    if (i > 0) {
      EXPECT_LT(gpu.losses[i], gpu.losses[i - 1]) << "step " << i;
    }
  }
  for (size_t i = 0; i < cpu.params.size(); ++i) EXPECT_LE(rel_l2(gpu.params[i], cpu.params[i]), 1e-4) << i;
}

}  // namespace

TEST(TrainingCuda, InitIsDeviceIndependent) {
  TG_REQUIRE_GPU();
  manual_seed(11);
  auto cpu = small_cnn(Device::cpu());
  manual_seed(11);
  auto gpu = small_cnn(Device::cuda());
  auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_EQ(pg[i].first, pc[i].first);
    EXPECT_TRUE(pg[i].second.device().is_cuda());
    // Each value is computed in double from the same counter, then rounded: identical.
    EXPECT_EQ(pg[i].second.to_vector<float>(), pc[i].second.to_vector<float>()) << pc[i].first;
  }
}

TEST(TrainingCuda, ModuleToMovesLeaves) {
  TG_REQUIRE_GPU();
  manual_seed(12);
  auto model = small_cnn(Device::cpu());
  auto before = model->named_parameters();
  {
    Tape tape;
    tape.backward(sum(model->forward(randn({2, 3, 5, 7}))));
  }
  model->to(Device::cuda());
  auto after = model->named_parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    const Tensor& p = after[i].second;
    EXPECT_EQ(after[i].first, before[i].first);
    EXPECT_TRUE(p.device().is_cuda());
    EXPECT_TRUE(p.is_leaf() && p.requires_grad());
    EXPECT_EQ(p.to_vector<float>(), before[i].second.to_vector<float>());
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(p.grad().device().is_cuda());
  }
  // The moved model trains on the GPU: its parameters get GPU grads from a GPU tape.
  model->zero_grad();
  {
    Tape tape;
    tape.backward(sum(model->forward(randn({2, 3, 5, 7}).cuda())));
  }
  for (const Tensor& p : model->parameters()) EXPECT_TRUE(p.grad().defined() && p.grad().device().is_cuda());
}

TEST(TrainingCuda, SgdCurveMatchesCpu) {
  TG_REQUIRE_GPU();
  expect_same_curve([](std::vector<Tensor> p) {
    return std::make_unique<nn::SGD>(std::move(p), nn::SGDOptions{.lr = 0.05, .momentum = 0.9});
  });
}

TEST(TrainingCuda, AdamWCurveMatchesCpu) {
  TG_REQUIRE_GPU();
  expect_same_curve([](std::vector<Tensor> p) {
    return std::make_unique<nn::AdamW>(std::move(p), nn::AdamWOptions{.lr = 0.02});
  });
}
