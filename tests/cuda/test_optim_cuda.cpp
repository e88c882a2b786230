// The fused CUDA optimizer updates against the CPU loops: same parameters, same grads,
// several steps; parameters and every state buffer must agree (f32 and f64).
#include <functional>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

using MakeOptimizer = std::function<std::unique_ptr<nn::Optimizer>(std::vector<Tensor>)>;

constexpr int kSteps = 5;

// Two parameters of odd sizes (the second larger than one block of threads) on `device`,
// updated kSteps times with grads drawn on the CPU; the third parameter never gets a grad.
struct Run {
  std::vector<Tensor> params;
  std::vector<std::pair<std::string, Tensor>> state;
};

Run run(Device device, DType dt, const MakeOptimizer& make) {
  manual_seed(77);
  std::vector<Tensor> params = {uniform({7, 13}, -1, 1, {.dtype = dt, .device = device}).requires_grad_(),
                                uniform({1031}, -1, 1, {.dtype = dt, .device = device}).requires_grad_(),
                                uniform({9}, -1, 1, {.dtype = dt, .device = device}).requires_grad_()};
  auto opt = make(params);
  for (int t = 0; t < kSteps; ++t) {
    for (size_t i = 0; i < 2; ++i)
      params[i].set_grad(uniform(params[i].shape(), -2, 2, {.dtype = dt}).to(device));
    opt->step();
    opt->zero_grad();
  }
  return {params, opt->state()};
}

void compare(const MakeOptimizer& make, DType dt, double tol) {
  Run cpu = run(Device::cpu(), dt, make);
  Run gpu = run(Device::cuda(), dt, make);
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    EXPECT_TRUE(gpu.params[i].device().is_cuda());
    EXPECT_LE(rel_l2(gpu.params[i].cpu(), cpu.params[i]), tol) << "parameter " << i;
  }
  ASSERT_EQ(gpu.state.size(), cpu.state.size());
  for (size_t k = 0; k < cpu.state.size(); ++k) {
    EXPECT_EQ(gpu.state[k].first, cpu.state[k].first);
    EXPECT_LE(rel_l2(gpu.state[k].second.cpu(), cpu.state[k].second), tol) << cpu.state[k].first;
  }
}

void compare_all(const MakeOptimizer& make) {
  compare(make, f32, 1e-6);
  compare(make, f64, 1e-13);
}

MakeOptimizer sgd(nn::SGDOptions o) {
  return [o](std::vector<Tensor> p) { return std::make_unique<nn::SGD>(std::move(p), o); };
}

}  // namespace

TEST(OptimCuda, SGDMatchesCpu) {
  TG_REQUIRE_GPU();
  compare_all(sgd({.lr = 0.1}));
  compare_all(sgd({.lr = 0.05, .momentum = 0.9}));
  compare_all(sgd({.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01}));
  compare_all(sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true}));
}

TEST(OptimCuda, AdamMatchesCpu) {
  TG_REQUIRE_GPU();
  compare_all([](std::vector<Tensor> p) { return std::make_unique<nn::Adam>(std::move(p), nn::AdamOptions{.lr = 0.01}); });
  compare_all([](std::vector<Tensor> p) {
    return std::make_unique<nn::Adam>(std::move(p), nn::AdamOptions{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99,
                                                                     .eps = 1e-6, .weight_decay = 0.1});
  });
}

TEST(OptimCuda, AdamWMatchesCpu) {
  TG_REQUIRE_GPU();
  compare_all([](std::vector<Tensor> p) { return std::make_unique<nn::AdamW>(std::move(p), nn::AdamWOptions{.lr = 0.01}); });
  compare_all([](std::vector<Tensor> p) {
    return std::make_unique<nn::AdamW>(std::move(p), nn::AdamWOptions{.lr = 0.05, .beta1 = 0.5, .weight_decay = 0.5});
  });
}

TEST(OptimCuda, StateLoadsAcrossDevices) {
  TG_REQUIRE_GPU();
  // A CPU optimizer's state continues on the GPU (a checkpoint moved between machines).
  manual_seed(5);
  Tensor a = uniform({37}, -1, 1).requires_grad_();
  Tensor b = a.clone().cuda().requires_grad_();
  nn::Adam cpu_opt({a}, {.lr = 0.01});
  nn::Adam gpu_opt({b}, {.lr = 0.01});
  Tensor g0 = uniform({37}, -1, 1);
  a.set_grad(g0);
  cpu_opt.step();
  b.copy_(a.cuda());
  gpu_opt.load_state(cpu_opt.state());
  for (const auto& [name, t] : gpu_opt.state())
    if (name != "0.step") {
      EXPECT_TRUE(t.device().is_cuda()) << name;
    }
  Tensor g1 = uniform({37}, -1, 1);
  a.set_grad(g1);
  b.set_grad(g1.cuda());
  cpu_opt.step();
  gpu_opt.step();
  EXPECT_LE(rel_l2(b.cpu(), a), 1e-6);
}

TEST(OptimCuda, ParamsOnGpuWithMismatchedGradAreRejected) {
  TG_REQUIRE_GPU();
  Tensor p = uniform({5}, -1, 1, {.device = Device::cuda()}).requires_grad_();
  nn::SGD opt({p}, {.lr = 0.1});
  p.set_grad(uniform({5}, -1, 1));  // on the CPU
  TG_EXPECT_ERROR(opt.step(), "parameter 0", "cuda:0", "cpu");
}

// ---- an optimizer built before or after model.to(cuda) trains the model (issue 24) ------

namespace {

// A small conv net on the CPU, moved to the GPU with the optimizer built `before` or after
// the move; the optimizer has momentum state from one CPU step when built before.
void trains_after_move(bool optimizer_before_move, bool adam) {
  manual_seed(21);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions::make(3, 6, 3).padding(1)),
      std::make_shared<nn::GroupNorm>(nn::GroupNormOptions::make(2, 6)), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MeanPool>(), std::make_shared<nn::Linear>(nn::LinearOptions::make(6, 4))});
  const Tensor x_cpu = uniform({4, 3, 6, 6}, -1, 1);
  auto make = [&]() -> std::unique_ptr<nn::Optimizer> {
    if (adam) return std::make_unique<nn::Adam>(model->parameters(), nn::AdamOptions{.lr = 0.01});
    return std::make_unique<nn::SGD>(model->parameters(), nn::SGDOptions{.lr = 0.05, .momentum = 0.9});
  };
  auto loss_on = [&](const Tensor& x) {
    Tape tape;
    const Tensor y = model->forward(x);
    Tensor loss = mean(y * y);
    tape.backward(loss);
    return loss.item();
  };
  std::unique_ptr<nn::Optimizer> opt;
  if (optimizer_before_move) {
    opt = make();
    loss_on(x_cpu);
    opt->step();  // state (momentum, exp_avg) now lives on the CPU
    opt->zero_grad();
  }
  const std::vector<Tensor> handles = model->parameters();
  model->to(Device::cuda());
  if (!optimizer_before_move) opt = make();
  const std::vector<Tensor> params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i].same(handles[i])) << i;
    EXPECT_TRUE(params[i].device().is_cuda()) << i;
    EXPECT_TRUE(opt->params()[i].same(params[i])) << i;
  }
  const Tensor x = x_cpu.cuda();
  const std::vector<float> w0 = params[0].to_vector<float>();
  const double first = loss_on(x);
  for (int t = 0; t < 10; ++t) {
    opt->step();
    opt->zero_grad();
    loss_on(x);
  }
  EXPECT_NE(params[0].to_vector<float>(), w0);
  EXPECT_LT(loss_on(x), first);
  for (const auto& [name, t] : opt->state())
    if (name.find(".step") == std::string::npos) {
      EXPECT_TRUE(t.device().is_cuda()) << name;
    }
}

}  // namespace

TEST(OptimCuda, OptimizerBuiltBeforeModelToCudaTrains) {
  TG_REQUIRE_GPU();
  trains_after_move(true, false);
  trains_after_move(true, true);
}

TEST(OptimCuda, OptimizerBuiltAfterModelToCudaTrains) {
  TG_REQUIRE_GPU();
  trains_after_move(false, false);
  trains_after_move(false, true);
}

// Param groups with their own options (parameter 0 in group 0, parameters 1 and 2 in
// group 1) run the same fused kernels with each group's settings.
TEST(OptimCuda, ParamGroupsMatchCpu) {
  TG_REQUIRE_GPU();
  compare_all([](std::vector<Tensor> p) {
    auto o = std::make_unique<nn::SGD>(std::vector<Tensor>{p[0]}, nn::SGDOptions{.lr = 0.05, .momentum = 0.9});
    o->add_param_group({p[1], p[2]}, {.lr = 0.2, .momentum = 0.5, .weight_decay = 0.1});
    return o;
  });
  compare_all([](std::vector<Tensor> p) {
    auto o = std::make_unique<nn::AdamW>(std::vector<Tensor>{p[0]}, nn::AdamWOptions{.lr = 0.01});
    o->add_param_group({p[1], p[2]}, {.lr = 0.03, .beta1 = 0.7, .weight_decay = 0.2});
    return o;
  });
}
