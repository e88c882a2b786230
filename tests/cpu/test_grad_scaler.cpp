// nn::GradScaler (dynamic loss scaling): with a power-of-two scale and no overflow, training
// through the scaler gives bit-identical parameters to training without it (SGD with momentum
// and Adam, a small MLP, several steps, clipping after unscale_ included); a step whose grads
// hold an infinity or a NaN is skipped (parameters, optimizer state and step count untouched)
// and the scale backs off; the scale grows after growth_interval clean steps; the call order
// and the options are checked; disabled, the scaler passes everything through.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "common/test_util.h"
#include "nn/layers.h"
#include "nn/optim/adam.h"
#include "nn/optim/clip.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/sgd.h"

using namespace tg;
using namespace tg::test;

namespace {

struct Mlp {
  nn::Linear a{{.in_features = 6, .out_features = 16}}, b{{.in_features = 16, .out_features = 3}};
  Tensor operator()(const Tensor& x) { return b(relu(a(x))); }
  std::vector<Tensor> parameters() {
    std::vector<Tensor> p = a.parameters(), q = b.parameters();
    p.insert(p.end(), q.begin(), q.end());
    return p;
  }
};

std::vector<std::vector<float>> values_of(const std::vector<Tensor>& ts) {
  std::vector<std::vector<float>> out;
  for (const Tensor& t : ts) out.push_back(t.to_vector<float>());
  return out;
}

using MakeOpt = std::function<std::unique_ptr<nn::Optimizer>(std::vector<Tensor>)>;

// Trains a fresh seeded MLP for `steps` steps, with or without the scaler; returns its
// parameters.
std::vector<std::vector<float>> train(const MakeOpt& make, bool scaled, bool clip, int steps) {
  manual_seed(7);
  Mlp m;
  auto opt = make(m.parameters());
  nn::GradScaler scaler;
  for (int s = 0; s < steps; ++s) {
    const Tensor x = randn({8, 6}), y = randn({8, 3});
    Tensor loss;
    {
      Tape tape;
      loss = mse_loss(m(x), y);
      tape.backward(scaled ? scaler.scale(loss) : loss);
    }
    if (scaled) {
      scaler.unscale_(*opt);
      if (clip) nn::clip_grad_norm_(m.parameters(), 0.5);
      EXPECT_TRUE(scaler.step(*opt));
      scaler.update();
    } else {
      if (clip) nn::clip_grad_norm_(m.parameters(), 0.5);
      opt->step();
    }
    opt->zero_grad();
  }
  return values_of(m.parameters());
}

}  // namespace

TEST(GradScaler, ScaledTrainingIsBitIdenticalWithoutOverflow) {
  const MakeOpt sgd = [](std::vector<Tensor> p) {
    return std::make_unique<nn::SGD>(std::move(p), nn::SGDOptions{.lr = 0.05, .momentum = 0.9});
  };
  const MakeOpt adam = [](std::vector<Tensor> p) {
    return std::make_unique<nn::Adam>(std::move(p), nn::AdamOptions{.lr = 0.01});
  };
  for (const bool clip : {false, true}) {
    EXPECT_EQ(train(sgd, true, clip, 6), train(sgd, false, clip, 6)) << "SGD, clip " << clip;
    EXPECT_EQ(train(adam, true, clip, 6), train(adam, false, clip, 6)) << "Adam, clip " << clip;
  }
  // The scale did something: the grads backward produced were 2^16 times the true ones.
  manual_seed(7);
  Mlp m;
  nn::SGD opt(m.parameters(), {.lr = 0.1});
  nn::GradScaler scaler;
  const Tensor x = randn({8, 6}), y = randn({8, 3});
  Tensor plain_grad;
  {
    Tape tape;
    tape.backward(mse_loss(m(x), y));
    plain_grad = m.b.weight.grad().clone();
  }
  opt.zero_grad();
  {
    Tape tape;
    tape.backward(scaler.scale(mse_loss(m(x), y)));
  }
  EXPECT_EQ(m.b.weight.grad().to_vector<float>(), (plain_grad * 65536.0).to_vector<float>());
  scaler.unscale_(opt);
  EXPECT_EQ(m.b.weight.grad().to_vector<float>(), plain_grad.to_vector<float>());
}

TEST(GradScaler, NonFiniteGradsSkipTheStepAndBackOff) {
  for (const double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    manual_seed(8);
    Mlp m;
    nn::Adam opt(m.parameters(), {.lr = 0.01});
    nn::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});
    // One clean step first, so that the optimizer has state to keep.
    {
      Tape tape;
      tape.backward(scaler.scale(mse_loss(m(randn({4, 6})), randn({4, 3}))));
    }
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    opt.zero_grad();
    EXPECT_EQ(scaler.growth_tracker(), 1);
    const auto before = values_of(m.parameters());
    const int64_t steps = opt.step_count();
    {
      Tape tape;
      tape.backward(scaler.scale(mse_loss(m(randn({4, 6})), randn({4, 3}))));
    }
    // One element of one grad made non-finite, as an overflow in backward would.
    Tensor g = m.a.weight.grad();
    std::vector<float> v = g.to_vector<float>();
    v[5] = static_cast<float>(bad);
    m.a.weight.set_grad(from_vector(v, g.shape()));
    EXPECT_FALSE(scaler.step(opt));
    scaler.update();
    EXPECT_EQ(values_of(m.parameters()), before) << "bad " << bad;
    EXPECT_EQ(opt.step_count(), steps);
    EXPECT_EQ(scaler.get_scale(), 512.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
    opt.zero_grad();
  }
}

TEST(GradScaler, OverflowingBackwardIsCaughtAndTheScaleRecovers) {
  // A scale so large that backward itself overflows to infinity: skipped, halved, and after
  // enough halvings the steps run again.
  manual_seed(9);
  Mlp m;
  nn::SGD opt(m.parameters(), {.lr = 0.01});
  nn::GradScaler scaler({.init_scale = std::ldexp(1.0, 140), .growth_interval = 1000});
  int skipped = 0, ran = 0;
  for (int s = 0; s < 40 && ran < 3; ++s) {
    {
      Tape tape;
      tape.backward(scaler.scale(mse_loss(m(randn({4, 6})), randn({4, 3}))));
    }
    (scaler.step(opt) ? ran : skipped)++;
    scaler.update();
    opt.zero_grad();
  }
  EXPECT_GT(skipped, 0);
  EXPECT_EQ(ran, 3);
  EXPECT_LT(scaler.get_scale(), std::ldexp(1.0, 128));  // below f32's range again
  EXPECT_EQ(std::log2(scaler.get_scale()), std::floor(std::log2(scaler.get_scale())));  // still a power of two
}

TEST(GradScaler, ScaleGrowsAfterGrowthIntervalCleanSteps) {
  manual_seed(10);
  Mlp m;
  nn::SGD opt(m.parameters(), {.lr = 0.001});
  nn::GradScaler scaler({.init_scale = 8.0, .growth_factor = 2.0, .growth_interval = 3});
  std::vector<double> scales;
  for (int s = 0; s < 7; ++s) {
    {
      Tape tape;
      tape.backward(scaler.scale(mse_loss(m(randn({4, 6})), randn({4, 3}))));
    }
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    opt.zero_grad();
    scales.push_back(scaler.get_scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{8, 8, 16, 16, 16, 32, 32}));
}

TEST(GradScaler, CallOrderOptionsAndDisabled) {
  manual_seed(11);
  Mlp m;
  nn::SGD opt(m.parameters(), {.lr = 0.01});
  nn::GradScaler scaler;
  {
    Tape tape;
    tape.backward(scaler.scale(mse_loss(m(randn({4, 6})), randn({4, 3}))));
  }
  scaler.unscale_(opt);
  TG_EXPECT_ERROR(scaler.unscale_(opt), "unscale_", "already called");
  scaler.step(opt);
  TG_EXPECT_ERROR(scaler.step(opt), "step", "already called");
  scaler.update();
  TG_EXPECT_ERROR(scaler.update(), "update", "step() first");
  TG_EXPECT_ERROR(nn::GradScaler({.init_scale = 0}), "init_scale");
  TG_EXPECT_ERROR(nn::GradScaler({.growth_factor = 1.0}), "growth_factor");
  TG_EXPECT_ERROR(nn::GradScaler({.backoff_factor = 1.0}), "backoff_factor");
  TG_EXPECT_ERROR(nn::GradScaler({.growth_interval = 0}), "growth_interval");
  TG_EXPECT_ERROR(scaler.load_state(-1.0, 0), "scale");
  scaler.load_state(256.0, 5);
  EXPECT_EQ(scaler.get_scale(), 256.0);
  EXPECT_EQ(scaler.growth_tracker(), 5);

  // Disabled: the loss as it is, a plain step, no scale changes.
  nn::GradScaler off({.enabled = false});
  const Tensor loss = mse_loss(m(randn({4, 6})), randn({4, 3}));
  EXPECT_EQ(off.scale(loss).to_vector<float>(), loss.to_vector<float>());
  const int64_t steps = opt.step_count();
  EXPECT_TRUE(off.step(opt));
  off.update();
  EXPECT_EQ(opt.step_count(), steps + 1);
  EXPECT_EQ(off.get_scale(), 65536.0);
}

namespace {

// Backward of a scaled loss through the MLP: every parameter gets a (scaled) grad.
void scaled_backward(Mlp& m, const nn::GradScaler& scaler) {
  Tape tape;
  tape.backward(scaler.scale(mse_loss(m(randn({4, 6})), randn({4, 3}))));
}

std::vector<double> as_doubles(const Tensor& t) { return t.to_vector<double>(); }

}  // namespace

// Each optimizer has its own unscaled / found-inf state: unscale_(a) does not count as
// unscaling b (b's step would otherwise use grads still multiplied by the scale), and b
// steps when only a's grads are bad; update() backs off when any optimizer's were.
TEST(GradScaler, StateIsPerOptimizer) {
  manual_seed(12);
  Mlp m;
  nn::SGD a(m.a.parameters(), {.lr = 0.1});
  nn::SGD b(m.b.parameters(), {.lr = 0.1});
  nn::GradScaler scaler({.init_scale = 1024.0});
  scaled_backward(m, scaler);
  const std::vector<double> bias = as_doubles(m.b.bias), scaled_grad = as_doubles(m.b.bias.grad());
  scaler.unscale_(a);
  EXPECT_TRUE(scaler.step(b));
  // Reference in double: p - lr * (g_scaled / scale), to f32 rounding (the bug: 1024x off).
  const std::vector<double> after = as_doubles(m.b.bias);
  for (size_t k = 0; k < bias.size(); ++k) {
    const double expected = bias[k] - 0.1 * (scaled_grad[k] / 1024.0);
    EXPECT_NEAR(after[k], expected, 4 * std::numeric_limits<float>::epsilon() * std::max(1.0, std::abs(expected)))
        << "element " << k;
  }
  EXPECT_TRUE(scaler.step(a));  // a was unscaled once and steps once
  TG_EXPECT_ERROR(scaler.unscale_(a), "unscale_", "already called");
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  a.zero_grad();
  b.zero_grad();

  // Only a's grads overflow: a skips, b steps, and the scale backs off.
  scaled_backward(m, scaler);
  m.a.weight.grad().fill_(std::numeric_limits<float>::infinity());
  const auto a_before = values_of(m.a.parameters()), b_before = values_of(m.b.parameters());
  EXPECT_FALSE(scaler.step(a));
  EXPECT_TRUE(scaler.step(b));
  scaler.update();
  EXPECT_EQ(values_of(m.a.parameters()), a_before);
  EXPECT_NE(values_of(m.b.parameters()), b_before);
  EXPECT_EQ(scaler.get_scale(), 512.0);
}

// The finiteness probe looks at the unscaled grads: with a tiny (valid) scale, finite
// scaled grads overflow when divided by it, and the step is skipped rather than writing
// infinities into the parameters.
TEST(GradScaler, TinyScaleSkipsStepsWhoseUnscaledGradsOverflow) {
  manual_seed(13);
  Mlp m;
  nn::SGD opt(m.parameters(), {.lr = 0.1});
  nn::GradScaler scaler({.init_scale = std::ldexp(1.0, -1000)});
  scaled_backward(m, scaler);
  m.b.bias.grad().fill_(1.0f);  // finite, but 2^1000 in the unscaled f32 grad
  const auto before = values_of(m.parameters());
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_EQ(values_of(m.parameters()), before);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), std::ldexp(1.0, -1001));
}

// A scale whose inverse overflows is refused, and backoff stops above such a scale.
TEST(GradScaler, ScaleKeepsAFiniteInverse) {
  TG_EXPECT_ERROR(nn::GradScaler({.init_scale = 1e-310}), "GradScaler", "init_scale", "inverse");
  nn::GradScaler scaler;
  TG_EXPECT_ERROR(scaler.load_state(1e-310, 0), "load_state", "inverse");
  EXPECT_EQ(scaler.get_scale(), 65536.0);

  manual_seed(14);
  Mlp m;
  nn::SGD opt(m.parameters(), {.lr = 0.1});
  nn::GradScaler tiny({.init_scale = std::ldexp(1.0, -1021)});
  const auto before = values_of(m.parameters());
  for (int s = 0; s < 5; ++s) {
    scaled_backward(m, tiny);
    m.a.bias.grad().fill_(std::numeric_limits<float>::quiet_NaN());
    EXPECT_FALSE(tiny.step(opt));
    tiny.update();
    opt.zero_grad();
  }
  // 2^-1023 is the smallest power of two whose inverse is finite: there the scale stays.
  EXPECT_EQ(tiny.get_scale(), std::ldexp(1.0, -1023));
  EXPECT_TRUE(std::isfinite(1.0 / tiny.get_scale()));
  EXPECT_EQ(values_of(m.parameters()), before);
}

// A refused unscale_ changes no grad, so a retry after fixing the bad one divides each
// grad exactly once; the error names GradScaler::unscale_ and the parameter.
TEST(GradScaler, FailedUnscaleLeavesTheGradsAsTheyWere) {
  manual_seed(15);
  Mlp m;
  nn::SGD opt(m.parameters(), {.lr = 0.1});
  nn::GradScaler scaler({.init_scale = 4.0});
  scaled_backward(m, scaler);
  const auto scaled = values_of({m.a.weight.grad(), m.a.bias.grad(), m.b.weight.grad()});
  const Tensor good = m.b.bias.grad();
  m.b.bias.set_grad(zeros({3}, {.dtype = DType::i64}));
  try {
    scaler.unscale_(opt);
    ADD_FAILURE() << "expected a DTypeError";
  } catch (const DTypeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("GradScaler::unscale_"), std::string::npos) << msg;
    EXPECT_NE(msg.find("parameter 3"), std::string::npos) << msg;
  }
  EXPECT_EQ(values_of({m.a.weight.grad(), m.a.bias.grad(), m.b.weight.grad()}), scaled);
  m.b.bias.set_grad(zeros({3, 1}));
  TG_EXPECT_ERROR(scaler.unscale_(opt), "GradScaler::unscale_", "parameter 3", "shape");
  m.b.bias.set_grad(good);
  scaler.unscale_(opt);
  const auto unscaled = values_of({m.a.weight.grad(), m.a.bias.grad(), m.b.weight.grad()});
  for (size_t t = 0; t < scaled.size(); ++t)
    for (size_t k = 0; k < scaled[t].size(); ++k) EXPECT_EQ(unscaled[t][k], scaled[t][k] / 4.0f);
}
