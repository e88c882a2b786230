// The CUDA losses against the CPU reference (computed in f64 from the same f32 values):
// values and every input gradient, sizes beyond one reduction block, poisoned outputs,
// determinism, and target validation on the GPU.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "common/cuda_compare.h"
#include "common/test_util.h"
#include "core/cuda_context.h"
#include "ops/cuda/loss.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr double kTol = 1e-5;

// Random class indices in [0, classes), on `d`.
Tensor random_targets(int64_t n, int64_t classes, Device d) {
  auto u = rand({n}, {.dtype = f64}).to_vector<double>();
  std::vector<int64_t> t(u.size());
  for (size_t i = 0; i < u.size(); ++i) t[i] = std::min<int64_t>(classes - 1, int64_t(u[i] * double(classes)));
  return from_vector(t, {n}, {.dtype = i64, .device = d});
}

}  // namespace

TEST(MseLossCuda, ForwardAndBothGradientsMatchCpu) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (const Shape& s : {Shape{1}, Shape{7, 9, 13}, Shape{1000003}, Shape{257, 1025}}) {
    SCOPED_TRACE(testing::Message() << s);
    Tensor p = random(s, f32, gpu).requires_grad_(), t = random(s, f32, gpu).requires_grad_();
    Tensor seed = full({}, 0.75, {.dtype = f32, .device = gpu});
    expect_matches_f64_cpu([](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1]); }, {p, t}, seed, kTol);
  }
}

TEST(MseLossCuda, LaunchersWritePoisonedOutputsDeterministically) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  const TensorOptions o{.dtype = f32, .device = gpu};
  Tensor p = random({1000003}, f32, gpu), t = random({1000003}, f32, gpu);
  Tensor out = Tensor::empty({}, o), again = Tensor::empty({}, o);
  poison(out);
  poison(again);
  cuda::mse_loss_forward(out, p, t);
  cuda::mse_loss_forward(again, p, t);
  Tensor want = Tensor::empty({}, {.dtype = f64});
  cpu::mse_loss_forward(want, ref_of(p), ref_of(t));
  EXPECT_LE(rel_l2(out, want), kTol);
  EXPECT_EQ(out.item(), again.item());  // fixed-order reduction: bit-identical

  Tensor g = full({}, -1.5, o);
  Tensor dp = Tensor::empty(p.shape(), o), dt = Tensor::empty(p.shape(), o), only = Tensor::empty(p.shape(), o);
  for (Tensor* x : {&dp, &dt, &only}) poison(*x);
  cuda::mse_loss_backward(dp, dt, g, p, t);
  cuda::mse_loss_backward(Tensor(), only, g, p, t);
  const TensorOptions h{.dtype = f64};
  Tensor rdp = Tensor::empty(p.shape(), h), rdt = Tensor::empty(p.shape(), h);
  cpu::mse_loss_backward(rdp, rdt, ref_of(g), ref_of(p), ref_of(t));
  EXPECT_LE(rel_l2(dp, rdp), kTol);
  EXPECT_LE(rel_l2(dt, rdt), kTol);
  EXPECT_LE(rel_l2(only, rdt), kTol);
}

TEST(CrossEntropyCuda, ForwardAndGradientMatchCpu) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  struct Dims { int64_t N, K; double shift; };
  for (Dims d : {Dims{7, 13, 0}, Dims{1, 1, 0}, Dims{300, 1000, 0}, Dims{5000, 3, 0}, Dims{33, 257, 80}}) {
    SCOPED_TRACE(testing::Message() << "N=" << d.N << " classes=" << d.K << " shift=" << d.shift);
    Tensor x = (uniform({d.N, d.K}, -3.0, 3.0, {.dtype = f32, .device = gpu}) + d.shift).detach().requires_grad_();
    Tensor t = random_targets(d.N, d.K, gpu);
    Tensor seed = full({}, 1.25, {.dtype = f32, .device = gpu});
    expect_matches_f64_cpu([&t](const std::vector<Tensor>& in) { return cross_entropy(in[0], t.to(in[0].device())); },
                           {x}, seed, kTol);
  }
}

TEST(CrossEntropyCuda, LaunchersWritePoisonedOutputs) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  const int64_t N = 65, K = 127;
  const TensorOptions o{.dtype = f32, .device = gpu};
  Tensor x = random({N, K}, f32, gpu), t = random_targets(N, K, gpu);
  Tensor out = Tensor::empty({}, o), lse = Tensor::empty({N}, {.dtype = f64, .device = gpu});
  Tensor dx = Tensor::empty({N, K}, o);
  for (Tensor* p : {&out, &lse, &dx}) poison(*p);
  cuda::cross_entropy_forward(out, lse, x, t);
  Tensor g = full({}, 0.5, o);
  cuda::cross_entropy_backward(dx, g, x, t, lse);
  const TensorOptions h{.dtype = f64};
  Tensor rout = Tensor::empty({}, h), rlse = Tensor::empty({N}, h), rdx = Tensor::empty({N, K}, h);
  cpu::cross_entropy_forward(rout, rlse, ref_of(x), t.cpu());
  cpu::cross_entropy_backward(rdx, ref_of(g), ref_of(x), t.cpu(), rlse);
  EXPECT_LE(rel_l2(out, rout), kTol);
  EXPECT_LE(rel_l2(lse, rlse), kTol);
  EXPECT_LE(rel_l2(dx, rdx), kTol);
}

TEST(CrossEntropyCuda, OutOfRangeTargetsAreRejected) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  Tensor x = random({4, 5}, f32, gpu);
  // Checked by the kernel, not on the host (no sync per call): the loss is NaN, and the
  // error comes from check_errors, or from the next cross_entropy on the device.
  Tensor loss = cross_entropy(x, from_vector(std::vector<int64_t>{0, 1, 5, 2}, {4}, {.dtype = i64, .device = gpu}));
  EXPECT_TRUE(std::isnan(loss.item()));
  TG_EXPECT_ERROR(check_errors(gpu), "cross_entropy: target 5 at row 2 is out of range [0, 5)");
  EXPECT_NO_THROW(check_errors(gpu));  // reported once

  Tensor good = from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4}, {.dtype = i64, .device = gpu});
  cross_entropy(x, from_vector(std::vector<int64_t>{-1, 1, 2, 3}, {4}, {.dtype = i64, .device = gpu}));
  synchronize(gpu);  // the next call then sees the record without waiting
  TG_EXPECT_ERROR(cross_entropy(x, good), "cross_entropy: target -1 at row 0 is out of range [0, 5)");
  EXPECT_TRUE(std::isfinite(cross_entropy(x, good).item()));
  EXPECT_NO_THROW(check_errors(gpu));

  TG_EXPECT_ERROR(cross_entropy(x, from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4})), "cross_entropy",
                  "different devices");
  // Called directly, the kernel must not read out of bounds: the loss is NaN instead.
  Tensor out = Tensor::empty({}, {.dtype = f32, .device = gpu}), lse = Tensor::empty({4}, {.dtype = f64, .device = gpu});
  cuda::cross_entropy_forward(out, lse, x, from_vector(std::vector<int64_t>{0, 1, 1000000, 2}, {4}, {.dtype = i64, .device = gpu}));
  EXPECT_TRUE(std::isnan(out.item()));
  TG_EXPECT_ERROR(check_errors(gpu), "target 1000000 at row 2");
}

// cross_entropy must not wait for the device (it used to copy the targets to the host every
// call: a sync per training step). The stream is held by a host function until released;
// a cross_entropy that synchronizes would wait for it (here until the 5 s safety timeout),
// after which the stream would be idle.
TEST(CrossEntropyCuda, DoesNotSynchronizeTheDevice) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  Tensor x = random({64, 10}, f32, gpu);
  Tensor t = random_targets(64, 10, gpu);
  cross_entropy(x, t);  // first use: creates the per-device record (may synchronize once)
  synchronize(gpu);

  static std::atomic<bool> release{false};
  release = false;
  auto hold = [](void*) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!release && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  };
  cudaStream_t s = tg::cuda::stream(gpu.index);
  ASSERT_EQ(cudaLaunchHostFunc(s, hold, nullptr), cudaSuccess);
  Tensor loss = cross_entropy(x, t);
  const cudaError_t busy = cudaStreamQuery(s);
  release = true;
  EXPECT_EQ(busy, cudaErrorNotReady) << "cross_entropy waited for the device";
  EXPECT_TRUE(std::isfinite(loss.item()));
  EXPECT_NO_THROW(check_errors(gpu));
}
