// clip_grad_norm_ / clip_grad_value_ on a GPU against the CPU path on copies of the same
// grads: many parameters of odd sizes (beyond one reduction block and below one warp),
// f32 and f64 mixed, every norm type; bit-identical repeats (fixed-order reduction);
// untouched grads when no clipping is due or the norm is not finite; mixed devices; and
// clip_grad_value_ queued without waiting for the device.
#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/cuda_context.h"

using namespace tg;
using namespace tg::test;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// Parameters with grads on `d` (every third one f64) and one without a grad.
std::vector<Tensor> make_params(Device d) {
  std::vector<Tensor> ps;
  const std::vector<int64_t> sizes = {1000003, 7, 13, 1, 65537, 117, 257 * 1025, 31, 33, 4099};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const DType dt = i % 3 == 2 ? f64 : f32;
    Tensor p = random({sizes[i]}, dt, d).requires_grad_();
    p.set_grad(uniform({sizes[i]}, -2.0, 2.0, {.dtype = dt, .device = d}));
    ps.push_back(p);
  }
  ps.push_back(random({5}, f32, d).requires_grad_());  // no grad: skipped
  return ps;
}

// Copies of the parameters and their grads on `d`.
std::vector<Tensor> copy_to(const std::vector<Tensor>& ps, Device d) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) {
    // clone(): to() on the same device returns the same storage, and the copies must not alias.
    Tensor c = p.detach().to(d).clone().requires_grad_();
    if (p.grad().defined()) c.set_grad(p.grad().to(d).clone());
    out.push_back(c);
  }
  return out;
}

void expect_grads_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!want[i].grad().defined()) {
      EXPECT_FALSE(got[i].grad().defined());
      continue;
    }
    // The GPU's scale may differ from the CPU's in the norm's last bits: f32 rounding at most.
    EXPECT_LE(rel_l2(got[i].grad(), want[i].grad()), want[i].dtype() == f32 ? 1e-6 : 1e-12) << "grad " << i;
  }
}

}  // namespace

TEST(ClipGradNormCuda, MatchesCpuForEveryNormType) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (double p : {2.0, 1.0, 3.0, kInf}) {
    SCOPED_TRACE(p);
    std::vector<Tensor> g = make_params(gpu);
    std::vector<Tensor> c = copy_to(g, Device::cpu());
    const double cpu_norm = nn::clip_grad_norm_(c, 0.5, p);  // clips: the norm is far above 0.5
    const double gpu_norm = nn::clip_grad_norm_(g, 0.5, p);
    EXPECT_NEAR(gpu_norm, cpu_norm, 1e-12 * cpu_norm);
    // Grads are uniform in (-2, 2): the max norm is just under 2, every p-norm above it.
    EXPECT_GT(cpu_norm, 1.9);
    expect_grads_close(g, c);
  }
}

TEST(ClipGradNormCuda, RepeatsAreBitIdentical) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  std::vector<Tensor> a = make_params(gpu);
  std::vector<Tensor> b = copy_to(a, gpu);
  const double na = nn::clip_grad_norm_(a, 1.0), nb = nn::clip_grad_norm_(b, 1.0);
  EXPECT_EQ(na, nb);
  for (size_t i = 0; i + 1 < a.size(); ++i) EXPECT_TRUE(bitwise_equal(a[i].grad(), b[i].grad())) << i;
}

TEST(ClipGradNormCuda, UntouchedBelowTheLimitOrWhenNotFinite) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  std::vector<Tensor> g = make_params(gpu);
  std::vector<Tensor> before = copy_to(g, gpu);
  const double norm = nn::clip_grad_norm_(g, 1e9);
  EXPECT_GT(norm, 5.0);
  for (size_t i = 0; i + 1 < g.size(); ++i) EXPECT_TRUE(bitwise_equal(g[i].grad(), before[i].grad())) << i;

  for (double bad : {std::numeric_limits<double>::quiet_NaN(), kInf}) {
    for (double p : {2.0, kInf}) {
      SCOPED_TRACE(testing::Message() << bad << " p=" << p);
      std::vector<Tensor> h = make_params(gpu);
      Tensor odd = random({1}, f64, gpu).requires_grad_();
      odd.set_grad(full({1}, bad, {.dtype = f64, .device = gpu}));
      h[5] = odd;
      std::vector<Tensor> keep = copy_to(h, gpu);
      const double n = nn::clip_grad_norm_(h, 0.1, p);
      EXPECT_TRUE(std::isnan(bad) ? std::isnan(n) : n == kInf) << n;
      for (size_t i = 0; i + 1 < h.size(); ++i) EXPECT_TRUE(bitwise_equal(h[i].grad(), keep[i].grad())) << i;
      TG_EXPECT_ERROR(nn::clip_grad_norm_(h, 0.1, p, true), "clip_grad_norm_", "left unchanged");
    }
  }
}

TEST(ClipGradNormCuda, ManySmallParameters) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  // More entries than the staging buffers start with (256), of sizes 1..600.
  std::vector<Tensor> g;
  for (int64_t i = 0; i < 600; ++i) {
    Tensor p = random({i % 97 + 1}, i % 2 ? f64 : f32, gpu).requires_grad_();
    p.set_grad(uniform({i % 97 + 1}, -1.0, 1.0, {.dtype = p.dtype(), .device = gpu}));
    g.push_back(p);
  }
  std::vector<Tensor> c = copy_to(g, Device::cpu());
  const double cpu_norm = nn::clip_grad_norm_(c, 2.0);
  EXPECT_NEAR(nn::clip_grad_norm_(g, 2.0), cpu_norm, 1e-12 * cpu_norm);
  expect_grads_close(g, c);
}

TEST(ClipGradValueCuda, MatchesCpuExactly) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  std::vector<Tensor> g = make_params(gpu);
  std::vector<Tensor> c = copy_to(g, Device::cpu());
  nn::clip_grad_value_(g, 0.75);
  nn::clip_grad_value_(c, 0.75);
  for (size_t i = 0; i + 1 < g.size(); ++i) EXPECT_TRUE(bitwise_equal(g[i].grad(), c[i].grad())) << i;
  EXPECT_FALSE(g.back().grad().defined());
}

TEST(ClipGradCuda, MixedDevicesAreRejected) {
  TG_REQUIRE_GPU();
  Tensor a = random({3}).requires_grad_(), b = random({4}, f32, Device::cuda()).requires_grad_();
  a.set_grad(random({3}));
  b.set_grad(random({4}, f32, Device::cuda()));
  TG_EXPECT_ERROR(nn::clip_grad_norm_({a, b}, 1.0), "clip_grad_norm_: the grad of parameter 1", "cuda:0",
                  "every grad must be on one device");
  TG_EXPECT_ERROR(nn::clip_grad_value_({b, a}, 1.0), "clip_grad_value_: the grad of parameter 1", "cpu");
  EXPECT_THROW(nn::clip_grad_norm_({a, b}, 1.0), DeviceError);
}

// clip_grad_value_ queues its work and returns: the stream is held by a host function until
// released, and a call that waited for the device would find it idle afterwards.
TEST(ClipGradValueCuda, DoesNotSynchronizeTheDevice) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  std::vector<Tensor> g = make_params(gpu);
  for (int i = 0; i < 8; ++i) nn::clip_grad_value_(g, 1.5);  // staging buffers allocated
  synchronize(gpu);
  static std::atomic<bool> release{false};
  release = false;
  auto hold = [](void*) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!release && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  };
  cudaStream_t s = tg::cuda::stream(gpu.index);
  ASSERT_EQ(cudaLaunchHostFunc(s, hold, nullptr), cudaSuccess);
  nn::clip_grad_value_(g, 0.5);
  const cudaError_t busy = cudaStreamQuery(s);
  release = true;
  EXPECT_EQ(busy, cudaErrorNotReady) << "clip_grad_value_ waited for the device";
  synchronize(gpu);
  const std::vector<double> v = g[0].grad().to_vector<double>();
  for (double x : v) ASSERT_LE(std::fabs(x), 0.5);
}
