// The CUDA elementwise losses (bce_with_logits, l1, smooth_l1, huber) against the CPU
// reference computed in f64 from the same f32 values: values and both gradients for every
// reduction, sizes beyond one reduction block, the launchers on poisoned outputs,
// deterministic reductions, and device errors.
#include "common/cuda_compare.h"
#include "common/fixtures.h"
#include "common/test_util.h"
#include "ops/cuda/loss.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr double kTol = 1e-5;

const PointwiseLossParams kLosses[] = {
    {.kind = PointwiseLoss::bce_with_logits},
    {.kind = PointwiseLoss::l1},
    {.kind = PointwiseLoss::smooth_l1, .beta = 0.5},
    {.kind = PointwiseLoss::smooth_l1, .beta = 0.0},
    {.kind = PointwiseLoss::huber, .beta = 0.7},
};

Tensor call(const Tensor& x, const Tensor& y, const PointwiseLossParams& p) {
  switch (p.kind) {
    case PointwiseLoss::bce_with_logits: return binary_cross_entropy_with_logits(x, y, p.reduction);
    case PointwiseLoss::l1: return l1_loss(x, y, p.reduction);
    case PointwiseLoss::smooth_l1: return smooth_l1_loss(x, y, {.beta = p.beta, .reduction = p.reduction});
    case PointwiseLoss::huber: return huber_loss(x, y, {.delta = p.beta, .reduction = p.reduction});
  }
  return Tensor();
}

// pred in [-3, 3), target in [0, 1): both sides of every kink.
Tensor preds(const Shape& s, Device d) { return uniform(s, -3.0, 3.0, {.dtype = f32, .device = d}); }
Tensor targets(const Shape& s, Device d) { return rand(s, {.dtype = f32, .device = d}); }

}  // namespace

TEST(PointwiseLossCuda, ForwardAndBothGradientsMatchCpu) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (PointwiseLossParams p : kLosses) {
    for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
      p.reduction = r;
      for (const Shape& s : {Shape{1}, Shape{7, 9, 13}, Shape{1000003}, Shape{257, 1025}}) {
        SCOPED_TRACE(testing::Message() << pointwise_loss_name(p.kind) << " beta " << p.beta << " "
                                        << reduction_name(r) << " " << s);
        Tensor x = preds(s, gpu).requires_grad_(), y = targets(s, gpu).requires_grad_();
        Tensor seed = r == Reduction::none ? uniform(s, -2.0, 2.0, {.dtype = f32, .device = gpu})
                                           : full({}, 0.75, {.dtype = f32, .device = gpu});
        expect_matches_f64_cpu([p](const std::vector<Tensor>& in) { return call(in[0], in[1], p); }, {x, y}, seed,
                               kTol);
      }
    }
  }
}

TEST(PointwiseLossCuda, LaunchersWritePoisonedOutputsDeterministically) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  const TensorOptions o{.dtype = f32, .device = gpu}, h{.dtype = f64};
  const Shape s{999, 1001};
  Tensor x = preds(s, gpu), y = targets(s, gpu);
  for (PointwiseLossParams p : kLosses) {
    for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
      p.reduction = r;
      SCOPED_TRACE(testing::Message() << pointwise_loss_name(p.kind) << " beta " << p.beta << " " << reduction_name(r));
      const Shape out_shape = r == Reduction::none ? s : Shape{};
      Tensor out = Tensor::empty(out_shape, o), again = Tensor::empty(out_shape, o);
      poison(out);
      poison(again);
      cuda::pointwise_loss_forward(out, x, y, p);
      cuda::pointwise_loss_forward(again, x, y, p);
      Tensor want = Tensor::empty(out_shape, h);
      cpu::pointwise_loss_forward(want, ref_of(x), ref_of(y), p);
      EXPECT_LE(rel_l2(out, want), kTol);
      EXPECT_TRUE(bitwise_equal(out, again));  // fixed-order reduction

      Tensor g = r == Reduction::none ? uniform(s, -2.0, 2.0, o) : full({}, -1.5, o);
      Tensor dx = Tensor::empty(s, o), dy = Tensor::empty(s, o), only = Tensor::empty(s, o);
      for (Tensor* t : {&dx, &dy, &only}) poison(*t);
      cuda::pointwise_loss_backward(dx, dy, g, x, y, p);
      cuda::pointwise_loss_backward(Tensor(), only, g, x, y, p);
      Tensor rdx = Tensor::empty(s, h), rdy = Tensor::empty(s, h);
      cpu::pointwise_loss_backward(rdx, rdy, ref_of(g), ref_of(x), ref_of(y), p);
      EXPECT_LE(rel_l2(dx, rdx), kTol);
      EXPECT_LE(rel_l2(dy, rdy), kTol);
      EXPECT_LE(rel_l2(only, rdy), kTol);
    }
  }
}

TEST(PointwiseLossCuda, BceWithLogitsIsStableForLargeLogits) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  Tensor x = from_vector(std::vector<float>{1000, -1000, 1000, -1000, 80}, {5}, {.device = gpu}).requires_grad_();
  Tensor y = from_vector(std::vector<float>{1, 0, 0, 1, 0.5f}, {5}, {.device = gpu});
  Tensor l;
  {
    Tape tape;
    l = binary_cross_entropy_with_logits(x, y, Reduction::none);
    tape.backward(l, full({5}, 1.0, {.device = gpu}));
  }
  const std::vector<float> lv = l.to_vector<float>(), gv = x.grad().to_vector<float>();
  EXPECT_EQ(lv, (std::vector<float>{0, 0, 1000, 1000, 40}));
  EXPECT_EQ(gv, (std::vector<float>{0, 0, 1, -1, 0.5f}));
}

TEST(PointwiseLossCuda, DeviceAndShapeErrors) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  TG_EXPECT_ERROR(l1_loss(preds({4}, gpu), targets({4}, Device::cpu())), "l1_loss", "different devices");
  TG_EXPECT_ERROR(huber_loss(preds({4, 3}, gpu), targets({3, 4}, gpu)), "huber_loss: prediction [4, 3] and target [3, 4] differ");
  Tensor out = Tensor::empty({4}, {.dtype = f32, .device = gpu});
  TG_EXPECT_ERROR(cuda::pointwise_loss_forward(out, preds({4}, gpu), targets({4}, gpu), {.kind = PointwiseLoss::l1}),
                  "l1_loss", "reduction 'mean'", "[4]");
}
