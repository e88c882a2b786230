// The CUDA graph API where no GPU can be captured: a build without CUDA says so with
// tg::UnsupportedError, a CUDA build refuses a CPU device with tg::DeviceError, and the
// capture queries answer "not capturing" so that CPU code paths are unaffected.
#include "common/expect_message.h"
#include "common/test_util.h"
#include "core/cuda_graph.h"

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
