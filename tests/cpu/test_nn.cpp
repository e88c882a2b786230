// nn on the CPU: PyTorch parameter names and shapes, registration errors, Module::train / eval /
// zero_grad / to(dtype), and default initialization (bounds and seeding). Layers are in
// test_nn_layers.cpp, Module::to across devices and buffers in test_nn_module_to.cpp.
#include <algorithm>
#include <cmath>

#include "common/nn_modules.h"
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST(Module, SequentialNamesAndShapes) {
  auto model = small_cnn();
  std::vector<std::pair<std::string, Shape>> want = {
      {"0.weight", {6, 3, 3, 3}}, {"0.bias", {6}}, {"1.weight", {6}}, {"1.bias", {6}},
      {"4.weight", {5, 6}},       {"4.bias", {5}}};
  auto got = model->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.shape(), want[i].second) << want[i].first;
    EXPECT_TRUE(got[i].second.requires_grad()) << want[i].first;
    EXPECT_TRUE(got[i].second.is_leaf()) << want[i].first;
  }
  // parameters() is the same list, as handles to the same tensors.
  auto params = model->parameters();
  ASSERT_EQ(params.size(), want.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].same(got[i].second));
  EXPECT_EQ(model->size(), 5u);
}

TEST(Module, NestedNamesAndSlots) {
  Net net;
  EXPECT_EQ(names_of(net), (std::vector<std::string>{"scale", "features.0.weight", "head.weight", "head.bias"}));
  // A slot is the member itself: replacing through it replaces the layer's tensor.
  auto slots = net.named_parameter_slots();
  ASSERT_EQ(slots.size(), 4u);
  EXPECT_EQ(slots[3].second, &net.head->bias);
  Tensor replacement = full({5}, 0.25).requires_grad_();
  *slots[3].second = replacement;
  EXPECT_TRUE(net.head->bias.same(replacement));
}

// A weight tied between two layers is one parameter: listed once (under its first name), so
// an optimizer accepts the list and a gradient norm counts it once; every slot still loads.
TEST(Module, TiedWeightIsListedOnce) {
  auto a = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 2, .out_features = 2, .bias = false});
  auto b = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 2, .out_features = 2, .bias = false});
  b->weight = a->weight;
  nn::Sequential seq{a, b};
  const auto named = seq.named_parameters();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].first, "0.weight");
  EXPECT_EQ(seq.parameters().size(), 1u);
  EXPECT_EQ(seq.named_parameter_slots().size(), 2u);
  a->weight.set_grad(from_vector(std::vector<float>{3, 4, 0, 0}, {2, 2}));
  EXPECT_NEAR(nn::clip_grad_norm_(seq.parameters(), 1.0), 5.0, 1e-6);
  EXPECT_NEAR(a->weight.grad().to_vector<double>()[0], 0.6, 1e-6);
  nn::SGD opt(seq.parameters(), {.lr = 0.1});
  EXPECT_EQ(opt.params().size(), 1u);
}

TEST(Module, RegistrationErrors) {
  Registrar r;
  r.param("a", &r.a);
  TG_EXPECT_ERROR(r.param("a", &r.b), "'a'", "already registered");
  TG_EXPECT_ERROR(r.module("a", std::make_shared<nn::ReLU>()), "'a'", "already registered");
  TG_EXPECT_ERROR(r.param("x.y", &r.b), "'x.y'", "'.'");
  TG_EXPECT_ERROR(r.param("", &r.b), "non-empty");
  TG_EXPECT_ERROR(r.module("m", nullptr), "null module");
  // Registration makes a parameter require grad.
  EXPECT_TRUE(r.a.requires_grad());
  TG_EXPECT_ERROR(nn::Sequential().add(std::shared_ptr<nn::Module>()), "Sequential", "null module");
}

TEST(Module, BiasFalseHasNoBias) {
  nn::Conv2d conv({.in_channels = 64, .out_channels = 128, .kernel_size = {3, 3}, .bias = false});
  EXPECT_EQ(names_of(conv), (std::vector<std::string>{"weight"}));
  EXPECT_FALSE(conv.bias.defined());
  EXPECT_EQ(conv.weight.shape(), Shape({128, 64, 3, 3}));
  nn::GroupNorm gn({.num_groups = 2, .num_channels = 4, .affine = false});
  EXPECT_TRUE(gn.parameters().empty());
}

TEST(Module, TrainEvalPropagates) {
  Net net;
  EXPECT_TRUE(net.is_training());
  net.eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.features->is_training());
  EXPECT_FALSE((*net.features)[1].is_training());
  net.train();
  EXPECT_TRUE((*net.features)[2].is_training());
}

TEST(Module, ZeroGradAndToDType) {
  auto model = small_cnn();
  Tensor x = random({2, 3, 5, 7}, f32);
  {
    Tape tape;
    tape.backward(sum(model->forward(x)));
  }
  for (const Tensor& p : model->parameters()) ASSERT_TRUE(p.grad().defined());
  auto before = model->named_parameters();
  model->to(f64);
  auto after = model->named_parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    const Tensor& p = after[i].second;
    EXPECT_EQ(after[i].first, before[i].first);
    EXPECT_EQ(p.dtype(), f64);
    EXPECT_TRUE(p.is_leaf() && p.requires_grad());
    EXPECT_EQ(p.to_vector<double>(), before[i].second.to_vector<double>());
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().dtype(), f64);
  }
  model->to(Device::cpu());  // already there: nothing changes
  EXPECT_TRUE(model->parameters()[0].same(after[0].second));
  model->zero_grad();
  for (const Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  TG_EXPECT_ERROR(model->to(i64), "floating");
}

TEST(Init, KaimingBoundMatchesPyTorchDefault) {
  // a = sqrt(5): gain = sqrt(2 / 6) = sqrt(1/3), bound = sqrt(1/3) * sqrt(3 / fan_in) = 1/sqrt(fan_in).
  EXPECT_NEAR(nn::init::kaiming_uniform_bound(std::sqrt(5.0), 144), 1.0 / 12.0, 1e-15);
  // a = 0 (relu): bound = sqrt(6 / fan_in); fan_in 6 -> 1.
  EXPECT_NEAR(nn::init::kaiming_uniform_bound(0.0, 6), 1.0, 1e-15);
  EXPECT_EQ(nn::init::fan_in(Tensor::empty({8, 3, 3, 5})), 45);
  EXPECT_EQ(nn::init::fan_in(Tensor::empty({8, 7})), 7);
  TG_EXPECT_ERROR(nn::init::fan_in(Tensor::empty({8})), "fan_in", "[8]");
  TG_EXPECT_ERROR(nn::init::kaiming_uniform_bound(1.0, 0), "fan_in");
}

TEST(Init, DefaultInitBounds) {
  manual_seed(3);
  nn::Linear lin({.in_features = 300, .out_features = 200});
  nn::Conv2d conv({.in_channels = 16, .out_channels = 32, .kernel_size = {3, 3}});
  nn::Conv3d conv3({.in_channels = 3, .out_channels = 24, .kernel_size = {3}});
  struct Case { const char* name; Tensor t; int64_t fan_in; };
  for (const Case& c : {Case{"linear.weight", lin.weight, 300}, Case{"linear.bias", lin.bias, 300},
                        Case{"conv.weight", conv.weight, 144}, Case{"conv.bias", conv.bias, 144},
                        Case{"conv3.weight", conv3.weight, 81}}) {
    double bound = 1.0 / std::sqrt(double(c.fan_in));
    double m = max_abs(c.t);
    EXPECT_LE(m, bound) << c.name;
    // Enough draws that the largest lands near the bound: a too-narrow init fails here.
    EXPECT_GE(m, 0.95 * bound) << c.name;
  }
  // Uniform(-b, b) has variance b^2 / 3: checks the shape of the distribution, not just its range.
  auto w = lin.weight.to_vector<double>();
  double mean_ = 0, var = 0;
  for (double v : w) mean_ += v / double(w.size());
  for (double v : w) var += (v - mean_) * (v - mean_) / double(w.size());
  double b2 = 1.0 / 300;
  EXPECT_NEAR(mean_, 0.0, 0.01 / std::sqrt(300.0));
  EXPECT_NEAR(var, b2 / 3, 0.03 * b2 / 3);
  nn::GroupNorm gn({.num_groups = 8, .num_channels = 24});
  EXPECT_EQ(gn.weight.to_vector<double>(), std::vector<double>(24, 1.0));
  EXPECT_EQ(gn.bias.to_vector<double>(), std::vector<double>(24, 0.0));
}

TEST(Init, SeededReproducible) {
  manual_seed(42);
  auto a = small_cnn();
  manual_seed(42);
  auto b = small_cnn();
  manual_seed(43);
  auto c = small_cnn();
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].to_vector<double>(), pb[i].to_vector<double>());
  EXPECT_NE(pa[0].to_vector<double>(), pc[0].to_vector<double>());
  // f64 parameters hold the same draws as f32 ones, up to rounding.
  manual_seed(42);
  auto d = small_cnn({.dtype = f64});
  EXPECT_LT(rel_l2(d->parameters()[0], pa[0].to(f64)), 1e-7);
}
