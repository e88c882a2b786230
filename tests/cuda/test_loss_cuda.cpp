// The CUDA losses against the CPU reference (computed in f64 from the same f32 values):
// values and every input gradient, sizes beyond one reduction block, poisoned outputs,
// determinism, and target validation on the GPU.
#include <algorithm>

#include "common/cuda_compare.h"
#include "common/test_util.h"
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
  TG_EXPECT_ERROR(cross_entropy(x, from_vector(std::vector<int64_t>{0, 1, 5, 2}, {4}, {.dtype = i64, .device = gpu})),
                  "cross_entropy: target 5 at row 2 is out of range [0, 5)");
  TG_EXPECT_ERROR(cross_entropy(x, from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4})), "cross_entropy",
                  "different devices");
  // Called directly, the kernel must not read out of bounds: the loss is NaN instead.
  Tensor out = Tensor::empty({}, {.dtype = f32, .device = gpu}), lse = Tensor::empty({4}, {.dtype = f64, .device = gpu});
  cuda::cross_entropy_forward(out, lse, x, from_vector(std::vector<int64_t>{0, 1, 1000000, 2}, {4}, {.dtype = i64, .device = gpu}));
  EXPECT_TRUE(std::isnan(out.item()));
}
