// tg::Autocast (core/autocast.h) on the CPU. The op table: conv2d, conv3d, linear and matmul
// return the scope's half type, bit-identical to the same op on operands rounded to that type,
// computed in f32 and rounded once; group_norm, softmax and the losses return f32; relu stays in
// its input's type; f32 meeting bf16 in add computes in f32; f64 is untouched; a nested disabled
// scope switches it off. Autograd: the recorded casts carry gradients back to f32 parameters
// (exactly where the math is exact), through half results used twice too, and a small
// ResNet-style block's gradients under autocast stay within bf16's reach of the f32 ones. A
// conv net trained under bf16 autocast, and under f16 autocast with a GradScaler, tracks the
// f32 loss curve.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/half_util.h"
#include "common/test_util.h"
#include "core/autocast.h"
#include "nn/layers.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/sgd.h"

using namespace tg;
using namespace tg::test;

namespace {

// The same op outside any scope on operands rounded to `t` and widened back: what the scope
// must produce, once rounded to t.
Tensor rounded(const Tensor& x, DType t) { return x.defined() ? x.to(t).to(DType::f32) : x; }

}  // namespace

TEST(Autocast, MatrixOpsRunInTheScopesTypeBitForBit) {
  manual_seed(1);
  const Tensor x = randn({2, 5, 9, 7}), w = randn({6, 5, 3, 3}), b = randn({6});
  const Tensor a = randn({7, 11}), m = randn({11, 4}), lw = randn({3, 11}), lb = randn({3});
  const ConvParams p{.padding = {1}};
  for (DType t : kHalves) {
    Tensor y, mm, lin;
    {
      Autocast ac(t);
      y = conv2d(x, w, b, p);
      mm = matmul(a, m);
      lin = linear(a, lw, lb);
    }
    ASSERT_EQ(y.dtype(), t);
    ASSERT_EQ(mm.dtype(), t);
    ASSERT_EQ(lin.dtype(), t);
    EXPECT_EQ(half_bits(y), half_bits(conv2d(rounded(x, t), rounded(w, t), rounded(b, t), p).to(t))) << dtype_name(t);
    EXPECT_EQ(half_bits(mm), half_bits(matmul(rounded(a, t), rounded(m, t)).to(t))) << dtype_name(t);
    EXPECT_EQ(half_bits(lin), half_bits(linear(rounded(a, t), rounded(lw, t), rounded(lb, t)).to(t))) << dtype_name(t);
  }
  // The other convolutions: 3-D, channels-last, transposed.
  const Tensor x3 = randn({1, 3, 5, 6, 4}), w3 = randn({4, 3, 3, 3, 3});
  const Tensor xl = randn({2, 7, 6, 5}), wl = randn({4, 5, 3, 3});
  const Tensor xt = randn({2, 4, 5, 5}), wt = randn({4, 3, 3, 3});
  const ConvParams nhwc{.padding = {1}, .layout = Layout::NHWC};
  const ConvTransposeParams tp{.stride = {2}, .padding = {1}};
  Tensor y3, yl, yt;
  {
    Autocast ac(DType::bf16);
    y3 = conv3d(x3, w3, Tensor(), p);
    yl = conv2d(xl, wl, Tensor(), nhwc);
    yt = conv_transpose2d(xt, wt, Tensor(), tp);
  }
  const DType bf = DType::bf16;
  EXPECT_EQ(half_bits(y3), half_bits(conv3d(rounded(x3, bf), rounded(w3, bf), Tensor(), p).to(bf)));
  EXPECT_EQ(half_bits(yl), half_bits(conv2d(rounded(xl, bf), rounded(wl, bf), Tensor(), nhwc).to(bf)));
  EXPECT_EQ(half_bits(yt), half_bits(conv_transpose2d(rounded(xt, bf), rounded(wt, bf), Tensor(), tp).to(bf)));
  // Outside the scope, and in a nested disabled scope: f32 as always.
  EXPECT_EQ(conv2d(x, w, b, p).dtype(), DType::f32);
  {
    Autocast ac(DType::bf16);
    Autocast off(DType::bf16, false);
    EXPECT_FALSE(autocast_enabled());
    EXPECT_EQ(matmul(a, m).dtype(), DType::f32);
  }
  EXPECT_FALSE(autocast_enabled());
  // f64 is left alone; the scope's type must be a half type.
  {
    Autocast ac(DType::bf16);
    EXPECT_EQ(matmul(a.to(DType::f64), m.to(DType::f64)).dtype(), DType::f64);
  }
  TG_EXPECT_ERROR(Autocast(DType::f32), "Autocast", "bf16 or f16", "f32");
}

TEST(Autocast, OtherOpsFollowTheTable) {
  manual_seed(2);
  const Tensor x = randn({2, 8, 5, 5}), gamma = randn({8}), beta = randn({8});
  const Tensor logits = randn({6, 5});
  const Tensor targets = from_vector(std::vector<int64_t>{0, 4, 2, 1, 3, 0}, {6});
  Autocast ac(DType::bf16);
  const Tensor h = x.to(DType::bf16);
  const Tensor gn = group_norm(h, gamma, beta, 4);
  EXPECT_EQ(gn.dtype(), DType::f32);
  {
    Autocast off(DType::bf16, false);
    EXPECT_EQ(gn.to_vector<float>(), group_norm(h.to(DType::f32), gamma, beta, 4).to_vector<float>());
  }
  EXPECT_EQ(relu(h).dtype(), DType::bf16);
  EXPECT_EQ(softmax(logits.to(DType::bf16), 1).dtype(), DType::f32);
  EXPECT_EQ(cross_entropy(logits.to(DType::bf16), targets).dtype(), DType::f32);
  EXPECT_EQ(adaptive_avg_pool2d(h, {1, 1}).dtype(), DType::f32);
  // f32 + bf16: computed in f32, the bf16 operand widened exactly.
  const Tensor sum_mixed = add(h, x);
  EXPECT_EQ(sum_mixed.dtype(), DType::f32);
  {
    Autocast off(DType::bf16, false);
    EXPECT_EQ(sum_mixed.to_vector<float>(), add(h.to(DType::f32), x).to_vector<float>());
    TG_EXPECT_ERROR(add(h, x), "add", "dtypes differ");  // outside a scope, mixing is an error
  }
}

TEST(Autocast, CastsCarryGradientsToF32Parameters) {
  manual_seed(3);
  // sum over a bf16 copy: d/dx = 1 exactly, and the gradient arrives in f32.
  Tensor x = randn({4, 6}).requires_grad_();
  {
    Tape tape;
    Autocast ac(DType::bf16);
    const Tensor y = x.to(DType::bf16);
    EXPECT_TRUE(y.requires_grad());
    tape.backward(sum(y).to(DType::f32));
  }
  ASSERT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>(24, 1.0f));

  // A half result used twice (its gradients are summed in bf16): z = y * y + y, dz/dx = 2y + 1.
  x.zero_grad();
  {
    Tape tape;
    const Tensor y = x.to(DType::bf16);
    tape.backward(sum(y * y + y).to(DType::f32));
  }
  const std::vector<float> g = x.grad().to_vector<float>(), yv = x.detach().to(DType::bf16).to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(g[i], 2 * yv[i] + 1, (std::fabs(2 * yv[i]) + 1) * std::ldexp(1.0, -7)) << i;
}

TEST(Autocast, ResidualBlockGradientsStayWithinBf16OfF32) {
  // conv -> group_norm -> relu -> conv + skip -> pool -> linear -> cross_entropy. bf16 keeps 8
  // significant bits (relative rounding 2^-9 ~ 0.002); the operands of 3 matrix ops and the
  // gradients between them are each rounded once or twice, and group_norm's backward subtracts
  // group means, which cancels and magnifies those relative errors for the first conv's
  // weight. Measured: 0.6-1.5% relative L2 for 7 of the 8 parameters, 3.3% for that weight. A
  // wrong gradient (a lost cast, a wrong type) differs by O(1); the bound is 5%.
  manual_seed(4);
  nn::Conv2d c1({.in_channels = 4, .out_channels = 8, .kernel_size = {3}, .padding = 1});
  nn::GroupNorm gn({.num_groups = 4, .num_channels = 8});
  nn::Conv2d c2({.in_channels = 8, .out_channels = 4, .kernel_size = {3}, .padding = 1});
  nn::Linear head({.in_features = 4, .out_features = 5});
  const Tensor x = randn({6, 4, 8, 8});
  const Tensor targets = from_vector(std::vector<int64_t>{0, 4, 2, 1, 3, 0}, {6});
  auto grads = [&](bool autocast) {
    for (nn::Module* m : std::initializer_list<nn::Module*>{&c1, &gn, &c2, &head})
      for (Tensor& p : m->parameters()) p.zero_grad();
    Tape tape;
    Tensor loss;
    {
      Autocast ac(DType::bf16, autocast);
      const Tensor h = relu(gn(c1(x)));
      const Tensor r = add(c2(h), x);  // bf16 + f32 under autocast
      loss = cross_entropy(head(adaptive_avg_pool2d(r, {1, 1}).reshape({6, 4})), targets);
    }
    EXPECT_EQ(loss.dtype(), DType::f32);
    tape.backward(loss);
    std::vector<Tensor> out;
    for (nn::Module* m : std::initializer_list<nn::Module*>{&c1, &gn, &c2, &head})
      for (Tensor& p : m->parameters()) {
        EXPECT_EQ(p.grad().dtype(), DType::f32);
        out.push_back(p.grad().clone());
      }
    return out;
  };
  const std::vector<Tensor> ref = grads(false), mixed = grads(true);
  ASSERT_EQ(ref.size(), mixed.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = rel_l2(mixed[i], ref[i]);
    worst = std::max(worst, d);
    EXPECT_LE(d, 5e-2) << "parameter " << i;
  }
  EXPECT_GT(worst, 0.0);  // the scope did change something
}

namespace {

// 40 SGD steps of a conv net on a fixed batch from fixed initial weights; returns the loss per
// step. The forward runs in an Autocast scope of `half` when it is a half type, and the step
// goes through `scaler` when one is given.
std::vector<double> train_conv_net(DType half, nn::GradScaler* scaler) {
  manual_seed(5);
  nn::Conv2d c1({.in_channels = 3, .out_channels = 8, .kernel_size = {3}, .padding = 1});
  nn::GroupNorm gn({.num_groups = 2, .num_channels = 8});
  nn::Linear head({.in_features = 8, .out_features = 4});
  std::vector<Tensor> params = c1.parameters();
  for (const Tensor& p : gn.parameters()) params.push_back(p);
  for (const Tensor& p : head.parameters()) params.push_back(p);
  nn::SGD opt(params, {.lr = 0.2, .momentum = 0.9});
  const Tensor x = randn({16, 3, 8, 8});
  std::vector<int64_t> labels(16);
  for (int i = 0; i < 16; ++i) labels[i] = i % 4;
  const Tensor y = from_vector(labels, {16});
  std::vector<double> losses;
  for (int s = 0; s < 40; ++s) {
    Tape tape;
    Tensor loss;
    {
      Autocast ac(is_half(half) ? half : DType::bf16, is_half(half));
      loss = cross_entropy(head(adaptive_avg_pool2d(relu(gn(c1(x))), {1, 1}).reshape({16, 8})), y);
    }
    tape.backward(scaler ? scaler->scale(loss) : loss);
    if (scaler) {
      EXPECT_TRUE(scaler->step(opt)) << "step " << s;
      scaler->update();
    } else {
      opt.step();
    }
    opt.zero_grad();
    losses.push_back(loss.to_vector<float>()[0]);
  }
  return losses;
}

// Each step's loss within 5% (+0.01) of the f32 run's, both falling by more than half (so a
// broken scope, or one that changes nothing, fails), and not identical to f32.
void expect_tracks(const std::vector<double>& mixed, const std::vector<double>& f32, const char* what) {
  EXPECT_LT(f32.back(), 0.5 * f32.front());
  EXPECT_LT(mixed.back(), 0.5 * mixed.front()) << what;
  bool differ = false;
  for (size_t i = 0; i < f32.size(); ++i) {
    EXPECT_LE(std::fabs(mixed[i] - f32[i]), 0.05 * f32[i] + 0.01) << what << ", step " << i;
    differ = differ || mixed[i] != f32[i];
  }
  EXPECT_TRUE(differ) << what;
}

}  // namespace

TEST(Autocast, TrainingTracksTheF32LossCurve) {
  expect_tracks(train_conv_net(DType::bf16, nullptr), train_conv_net(DType::f32, nullptr), "bf16");
}

TEST(Autocast, F16WithGradScalerTracksTheF32LossCurve) {
  // f16 has 3 more mantissa bits than bf16 but a range down to only ~6e-8, which is why its
  // training scales the loss: the scaler's power-of-two scale leaves the f32 steps unchanged.
  nn::GradScaler scaler({.init_scale = 1024.0});
  expect_tracks(train_conv_net(DType::f16, &scaler), train_conv_net(DType::f32, nullptr), "f16 + GradScaler");
  EXPECT_EQ(scaler.get_scale(), 1024.0);  // 40 clean steps: no backoff, growth interval not reached
}
