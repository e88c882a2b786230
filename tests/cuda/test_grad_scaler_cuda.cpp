// nn::GradScaler on the GPU: training a small MLP through the scaler gives bit-identical
// parameters to training without it (Adam, power-of-two scale, no overflow), and an infinite
// grad skips the step and backs the scale off. The logic is tested in depth on the CPU
// (tests/cpu/test_grad_scaler.cpp); this checks the device path (the finiteness probe, the
// unscale) on CUDA tensors.
#include <limits>

#include "common/test_util.h"
#include "nn/layers.h"
#include "nn/optim/adam.h"
#include "nn/optim/grad_scaler.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

std::vector<std::vector<float>> train(bool scaled, int steps) {
  manual_seed(21);
  nn::Linear a({.in_features = 6, .out_features = 16}, {.device = kGpu}), b({.in_features = 16, .out_features = 3},
                                                                            {.device = kGpu});
  std::vector<Tensor> params = a.parameters(), pb = b.parameters();
  params.insert(params.end(), pb.begin(), pb.end());
  nn::Adam opt(params, {.lr = 0.01});
  nn::GradScaler scaler;
  for (int s = 0; s < steps; ++s) {
    const Tensor x = randn({8, 6}).to(kGpu), y = randn({8, 3}).to(kGpu);
    {
      Tape tape;
      const Tensor loss = mse_loss(b(relu(a(x))), y);
      tape.backward(scaled ? scaler.scale(loss) : loss);
    }
    if (scaled) {
      EXPECT_TRUE(scaler.step(opt));
      scaler.update();
    } else {
      opt.step();
    }
    opt.zero_grad();
  }
  std::vector<std::vector<float>> out;
  for (const Tensor& p : params) out.push_back(p.to_vector<float>());
  return out;
}

}  // namespace

TEST(CudaGradScaler, ScaledTrainingIsBitIdentical) {
  TG_REQUIRE_GPU();
  EXPECT_EQ(train(true, 5), train(false, 5));
}

TEST(CudaGradScaler, InfiniteGradSkipsTheStep) {
  TG_REQUIRE_GPU();
  manual_seed(22);
  nn::Linear a({.in_features = 6, .out_features = 4}, {.device = kGpu});
  nn::Adam opt(a.parameters(), {.lr = 0.01});
  nn::GradScaler scaler({.init_scale = 4096.0});
  {
    Tape tape;
    tape.backward(scaler.scale(mse_loss(a(randn({5, 6}).to(kGpu)), randn({5, 4}).to(kGpu))));
  }
  std::vector<float> g = a.weight.grad().to_vector<float>();
  g[3] = std::numeric_limits<float>::infinity();
  a.weight.set_grad(from_vector(g, a.weight.shape()).to(kGpu));
  const std::vector<float> before = a.weight.to_vector<float>();
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(a.weight.to_vector<float>(), before);
  EXPECT_EQ(scaler.get_scale(), 2048.0);
}
