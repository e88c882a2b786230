// The CUDA graph API where no GPU can be captured: a build without CUDA says so with
// tg::UnsupportedError, a CUDA build refuses a CPU device with tg::DeviceError, and the
// capture queries answer "not capturing" so that CPU code paths are unaffected. Plus the
// host side of a captured Adam update: its replay scalars round to the eager coefficients.
#include <cmath>

#include "common/expect_message.h"
#include "common/test_util.h"
#include "core/cuda_graph.h"
#include "nn/optim/cuda_updates.h"

using namespace tg;
using namespace tg::test;

TEST(CudaGraphCpu, GraphOnTheCpuIsRefused) {
#if TG_CUDA
  const std::string msg = message_of<DeviceError>([] { cuda::Graph g(Device::cpu()); });
  EXPECT_TRUE(contains(msg, "GPU device")) << msg;
#else
  const std::string msg = message_of<UnsupportedError>([] { cuda::Graph g; });
  EXPECT_TRUE(contains(msg, "build with CUDA")) << msg;
#endif
}

TEST(CudaGraphCpu, GraphedStepOnTheCpuIsRefused) {
  auto step = [] { return full({}, 1.0); };
#if TG_CUDA
  const std::string msg = message_of<DeviceError>([&] { cuda::GraphedStep s(step, {.device = Device::cpu()}); });
  EXPECT_TRUE(contains(msg, "GPU device")) << msg;
#else
  const std::string msg = message_of<UnsupportedError>([&] { cuda::GraphedStep s(step); });
  EXPECT_TRUE(contains(msg, "build with CUDA")) << msg;
#endif
}

TEST(CudaGraphCpu, CpuWorkIsNeverCapturing) {
  EXPECT_FALSE(cuda::any_capturing());
  // CPU tensors never ask; the host ops keep working.
  Tensor t = randn({3});
  EXPECT_TRUE(std::isfinite(sum(t).item()));
  EXPECT_EQ(t.to(Device::cpu()).to_vector<float>(), t.to_vector<float>());
  const ReplayShift none = cuda::capture_random_draw(0, {}, 10);
  EXPECT_EQ(none.replay, nullptr);
  EXPECT_EQ(shifted_offset(41, none), 41u);
  // A shift as a replayed graph's kernel sees it: replay 3, 100 counters per step.
  const uint64_t replay = 3, span = 100;
  EXPECT_EQ(shifted_offset(41, {&replay, &span}), 341u);
}

// A graph-captured Adam update reads its per-step coefficients from the graph's scalars
// (nn/optim/cuda_updates.h): they must round to exactly the coefficients the eager update
// passes as arguments, in f32 and f64, for any step and learning rate.
TEST(CudaGraphCpu, AdamReplayScalarsGiveTheEagerCoefficients) {
  for (double t : {1.0, 2.0, 7.0, 1000.0}) {
    for (double lr : {1e-3, 0.37}) {
      const double beta1 = 0.9, beta2 = 0.999;
      const nn::AdamUpdate u{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = 1e-8, .weight_decay = 0.01,
                             .decoupled_weight_decay = true, .step_size = lr / (1.0 - std::pow(beta1, t)),
                             .bias_correction2_sqrt = std::sqrt(1.0 - std::pow(beta2, t))};
      double scalars[nn::kAdamReplayScalars];
      nn::write_replay_scalars(scalars, u);
      // Coefficients made from another step's settings, then overwritten from the scalars.
      nn::AdamUpdate stale = u;
      stale.lr = 5.0;
      stale.step_size = 123.0;
      stale.bias_correction2_sqrt = 0.5;
      nn::AdamCoefficients<float> eager_f(u), replay_f(stale);
      nn::read_replay_scalars(replay_f, scalars);
      EXPECT_EQ(replay_f.step_size, eager_f.step_size);
      EXPECT_EQ(replay_f.bias_correction2_sqrt, eager_f.bias_correction2_sqrt);
      EXPECT_EQ(replay_f.decay_factor, eager_f.decay_factor);
      nn::AdamCoefficients<double> eager_d(u), replay_d(stale);
      nn::read_replay_scalars(replay_d, scalars);
      EXPECT_EQ(replay_d.step_size, eager_d.step_size);
      EXPECT_EQ(replay_d.bias_correction2_sqrt, eager_d.bias_correction2_sqrt);
      EXPECT_EQ(replay_d.decay_factor, eager_d.decay_factor);
    }
  }
}
