// nn on the CPU: PyTorch parameter names and shapes, default initialization (bounds and
// seeding), option validation, forward shapes and values of the layers, a gradient check
// through a whole small model, and Module::to / train / zero_grad; to() keeping parameter
// identity, buffers, modules()/apply(), both option spellings, Linear over leading dims.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

// conv -> group norm -> relu -> global mean -> linear: the shape of the training tests.
std::shared_ptr<nn::Sequential> small_cnn(TensorOptions t = {}) {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 3, .out_channels = 6, .kernel_size = {3, 3},
                                                     .padding = {1}}, t),
      std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 2, .num_channels = 6}, t),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MeanPool>(),
      std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 6, .out_features = 5}, t)});
}

// A module with its own parameter and two named children, to check nested names.
class Net : public nn::Module {
 public:
  Net() {
    scale = ones({5}).requires_grad_();
    register_parameter("scale", &scale);
    register_module("features", features);
    register_module("head", head);
  }
  Tensor forward(const Tensor& x) override { return head->forward(features->forward(x)) * scale; }

  Tensor scale;
  std::shared_ptr<nn::Sequential> features = std::make_shared<nn::Sequential>(
      std::initializer_list<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 3, .out_channels = 4, .kernel_size = 3, .bias = false}),
          std::make_shared<nn::ReLU>(), std::make_shared<nn::MeanPool>()});
  std::shared_ptr<nn::Linear> head = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 5});
};

// Registers whatever the test asks for, to reach the protected registration errors.
class Registrar : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  void param(const std::string& name, Tensor* slot) { register_parameter(name, slot); }
  void module(const std::string& name, std::shared_ptr<nn::Module> m) { register_module(name, std::move(m)); }
  Tensor a = random({2}), b = random({2});
};

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

TEST(Layers, OptionsAreValidated) {
  TG_EXPECT_ERROR(nn::Linear({.in_features = 0, .out_features = 3}), "Linear", "in_features");
  TG_EXPECT_ERROR(nn::Linear({.in_features = 3, .out_features = -1}), "Linear", "out_features");
  TG_EXPECT_ERROR(nn::Linear({.in_features = 3, .out_features = 2}, {.dtype = i64}), "Linear", "floating");
  TG_EXPECT_ERROR(nn::Conv2d({.in_channels = 0, .out_channels = 4, .kernel_size = 3}), "Conv2d", "in_channels");
  TG_EXPECT_ERROR(nn::Conv2d({.in_channels = 3, .out_channels = 4, .kernel_size = {3, 3, 3}}), "Conv2d",
                  "kernel_size", "[3, 3, 3]");
  TG_EXPECT_ERROR(nn::Conv2d({.in_channels = 3, .out_channels = 4, .kernel_size = {3, 0}}), "Conv2d", "kernel_size");
  TG_EXPECT_ERROR(nn::Conv2d({.in_channels = 3, .out_channels = 4, .kernel_size = 3, .stride = {0}}), "Conv2d", "stride");
  TG_EXPECT_ERROR(nn::Conv2d({.in_channels = 3, .out_channels = 4, .kernel_size = 3, .padding = {-1}}), "Conv2d", "padding");
  TG_EXPECT_ERROR(nn::Conv2d({.in_channels = 3, .out_channels = 4, .kernel_size = 3, .dilation = {1, 1, 1}}), "Conv2d", "dilation");
  TG_EXPECT_ERROR(nn::Conv3d({.in_channels = 3, .out_channels = 4, .kernel_size = {3, 3}}), "Conv3d", "kernel_size");
  TG_EXPECT_ERROR(nn::Conv3d({.in_channels = 3, .out_channels = 4, .kernel_size = 3, .layout = Layout::NHWC}), "Conv3d", "layout");
  TG_EXPECT_ERROR(nn::GroupNorm({.num_groups = 3, .num_channels = 10}), "GroupNorm", "divisible");
  TG_EXPECT_ERROR(nn::GroupNorm({.num_groups = 0, .num_channels = 10}), "GroupNorm", "num_groups");
  TG_EXPECT_ERROR(nn::GroupNorm({.num_groups = 2, .num_channels = 10, .eps = 0}), "GroupNorm", "eps");
}

TEST(Layers, ForwardShapes) {
  nn::Linear lin({.in_features = 13, .out_features = 5});
  EXPECT_EQ(lin(random({7, 13}, f32)).shape(), Shape({7, 5}));
  // (9 + 2 - 3) / 2 + 1 = 5, (13 + 2 - 3) / 2 + 1 = 7
  nn::Conv2d conv({.in_channels = 3, .out_channels = 4, .kernel_size = {3}, .stride = {2}, .padding = {1}});
  EXPECT_EQ(conv(random({2, 3, 9, 13}, f32)).shape(), Shape({2, 4, 5, 7}));
  nn::Conv2d nhwc({.in_channels = 3, .out_channels = 4, .kernel_size = {1, 1}, .layout = Layout::NHWC});
  EXPECT_EQ(nhwc(random({2, 9, 7, 3}, f32)).shape(), Shape({2, 9, 7, 4}));
  // dilation 2 spans 5 inputs: 9 - 5 + 1 = 5, 7 - 5 + 1 = 3, 13 - 5 + 1 = 9
  nn::Conv3d conv3({.in_channels = 3, .out_channels = 24, .kernel_size = {3}, .dilation = {2}});
  EXPECT_EQ(conv3(random({2, 3, 9, 7, 13}, f32)).shape(), Shape({2, 24, 5, 3, 9}));
  nn::GroupNorm gn({.num_groups = 8, .num_channels = 24});
  EXPECT_EQ(gn(random({2, 24, 3, 5, 7}, f32)).shape(), Shape({2, 24, 3, 5, 7}));
  TG_EXPECT_ERROR(gn(random({2, 12, 5}, f32)), "GroupNorm", "[2, 12, 5]");
  EXPECT_EQ(nn::MeanPool()(random({2, 24, 3, 5, 7}, f32)).shape(), Shape({2, 24}));
  TG_EXPECT_ERROR(nn::MeanPool()(random({2, 24}, f32)), "MeanPool", "[2, 24]");
  EXPECT_EQ(nn::Flatten()(random({2, 3, 5, 7}, f32)).shape(), Shape({2, 105}));
  EXPECT_EQ(small_cnn()->forward(random({4, 3, 9, 7}, f32)).shape(), Shape({4, 5}));
  nn::Sequential empty;
  Tensor x = random({3});
  EXPECT_TRUE(empty(x).same(x));
  TG_EXPECT_ERROR(empty[0], "Sequential", "index 0");
}

TEST(Layers, LinearMatchesLoop) {
  nn::Linear lin({.in_features = 13, .out_features = 5}, {.dtype = f64});
  Tensor x = random({7, 13});
  auto y = lin(x).to_vector<double>();
  auto vx = x.to_vector<double>(), w = lin.weight.to_vector<double>(), b = lin.bias.to_vector<double>();
  for (int i = 0; i < 7; ++i)
    for (int o = 0; o < 5; ++o) {
      double acc = b[o];
      for (int k = 0; k < 13; ++k) acc += vx[i * 13 + k] * w[o * 13 + k];
      EXPECT_NEAR(y[i * 5 + o], acc, 1e-12);
    }
}

TEST(Layers, Conv2dOptionsReachTheOp) {
  // Stride (2, 1), padding (1, 0), dilation (1, 2) are all different per dim: a layer that
  // dropped or swapped any of them gives other values.
  nn::Conv2d conv({.in_channels = 2, .out_channels = 3, .kernel_size = {3, 2}, .stride = {2, 1},
                   .padding = {1, 0}, .dilation = {1, 2}}, {.dtype = f64});
  const int N = 2, C = 2, H = 7, W = 9, K = 3, kh = 3, kw = 2;
  Tensor x = random({N, C, H, W});
  Tensor y = conv(x);
  const int Ho = (H + 2 - 3) / 2 + 1, Wo = (W - (2 * (kw - 1) + 1)) + 1;
  ASSERT_EQ(y.shape(), Shape({N, K, Ho, Wo}));
  auto vx = x.to_vector<double>(), vw = conv.weight.to_vector<double>(), vb = conv.bias.to_vector<double>();
  auto vy = y.to_vector<double>();
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k)
      for (int i = 0; i < Ho; ++i)
        for (int j = 0; j < Wo; ++j) {
          double acc = vb[k];
          for (int c = 0; c < C; ++c)
            for (int a = 0; a < kh; ++a)
              for (int b = 0; b < kw; ++b) {
                int hi = i * 2 - 1 + a, wi = j + 2 * b;
                if (hi < 0 || hi >= H || wi < 0 || wi >= W) continue;
                acc += vx[((n * C + c) * H + hi) * W + wi] * vw[((k * C + c) * kh + a) * kw + b];
              }
          EXPECT_NEAR(vy[((n * K + k) * Ho + i) * Wo + j], acc, 1e-12);
        }
}

TEST(Layers, GroupNormMatchesLoopWithPerturbedAffine) {
  nn::GroupNorm gn({.num_groups = 3, .num_channels = 6, .eps = 1e-3}, {.dtype = f64});
  // gamma = 1, beta = 0 would hide a layer that ignores its affine parameters.
  gn.weight.copy_(random({6}));
  gn.bias.copy_(random({6}));
  const int N = 2, C = 6, HW = 35, G = 3, Cg = 2;
  Tensor x = random({N, C, 5, 7});
  auto vy = gn(x).to_vector<double>();
  auto vx = x.to_vector<double>(), g = gn.weight.to_vector<double>(), b = gn.bias.to_vector<double>();
  for (int n = 0; n < N; ++n)
    for (int grp = 0; grp < G; ++grp) {
      double mu = 0, var = 0;
      int base = (n * C + grp * Cg) * HW;
      for (int i = 0; i < Cg * HW; ++i) mu += vx[base + i] / (Cg * HW);
      for (int i = 0; i < Cg * HW; ++i) var += (vx[base + i] - mu) * (vx[base + i] - mu) / (Cg * HW);
      for (int i = 0; i < Cg * HW; ++i) {
        int c = grp * Cg + i / HW;
        EXPECT_NEAR(vy[base + i], (vx[base + i] - mu) / std::sqrt(var + 1e-3) * g[c] + b[c], 1e-12);
      }
    }
}

TEST(Layers, SmallModelGrad) {
  // Gradients of input and every parameter through conv -> group norm -> relu -> mean -> linear.
  manual_seed(9);
  auto model = small_cnn({.dtype = f64});
  auto gn = std::dynamic_pointer_cast<nn::GroupNorm>(model->named_children()[1].second);
  gn->weight.copy_(uniform({6}, 0.5, 1.5, {.dtype = f64}));
  gn->bias.copy_(random({6}));
  std::vector<Tensor> inputs = {param({2, 3, 5, 7})};
  for (const Tensor& p : model->parameters()) inputs.push_back(p);
  TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return model->forward(in[0]); }, inputs);
}

// ---- Module::to keeps identity, buffers, module traversal (issue 24) -------------------

namespace {

// One parameter (w), a member buffer (running: floating) and an owned one (count: i64).
class WithBuffers : public nn::Module {
 public:
  WithBuffers() {
    w = from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, {3});
    running = from_vector(std::vector<float>{1.0f, 2.0f, 3.0f}, {3});
    register_parameter("w", &w);
    register_buffer("running", &running);
    count = register_buffer("count", from_vector(std::vector<int64_t>{7}, {1}));
    register_module("lin", lin);
  }
  Tensor forward(const Tensor& x) override { return lin->forward(x * w); }
  void buffer(const std::string& name, Tensor value) { register_buffer(name, std::move(value)); }

  Tensor w, running, count;
  std::shared_ptr<nn::Linear> lin = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 3, .out_features = 2});
};

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()))).string();
}

}  // namespace

TEST(ModuleTo, KeepsParameterHandlesAndOptimizerTrains) {
  // An optimizer built before to() must keep training the module's parameters: the move
  // happens inside the same tensors (before, to() swapped in new tensors and the optimizer
  // went on updating the orphaned old ones, silently).
  manual_seed(3);
  auto model = small_cnn();
  const auto before = model->parameters();
  nn::SGD opt(before, {.lr = 0.1});
  model->to(f64);
  const auto after = model->parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(after[i].same(before[i])) << i;
    EXPECT_EQ(before[i].dtype(), f64);
    EXPECT_TRUE(after[i].is_leaf() && after[i].requires_grad());
  }
  model->to(Device::cpu());  // already there: still the same handles
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(model->parameters()[i].same(before[i]));

  const Tensor x = random({4, 3, 5, 5});
  auto loss_of = [&] {
    Tape tape;
    const Tensor y = model->forward(x);
    Tensor loss = mean(y * y);
    tape.backward(loss);
    return loss.item();
  };
  const std::vector<double> w0 = model->parameters()[0].to_vector<double>();
  const double first = loss_of();
  for (int t = 0; t < 5; ++t) {
    opt.step();
    opt.zero_grad();
    loss_of();
  }
  EXPECT_NE(model->parameters()[0].to_vector<double>(), w0);
  EXPECT_LT(loss_of(), first);
}

TEST(ModuleTo, TiedWeightStaysTied) {
  // The same tensor registered in two modules is moved once and stays one tensor.
  auto a = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 4});
  auto b = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 4});
  b->weight = a->weight;
  nn::Sequential seq{a, b};
  seq.to(f64);
  EXPECT_TRUE(a->weight.same(b->weight));
  EXPECT_EQ(b->weight.dtype(), f64);
}

TEST(ModuleTo, OptimizerStateFollowsItsParameter) {
  // SGD's momentum buffer was made in f32; after to(f64) the next step() converts it (values
  // kept) instead of mixing dtypes: p2 = p1 - lr (m buf1 + g2) with buf1 = g1.
  WithBuffers m;
  nn::SGD opt({m.w}, {.lr = 0.1, .momentum = 0.5});
  const std::vector<double> p0 = m.w.to_vector<double>(), g1 = {1, 2, 3}, g2 = {-1, 0.5, 0.25};
  m.w.set_grad(from_vector(std::vector<float>{1, 2, 3}, {3}));
  opt.step();
  ASSERT_EQ(opt.state().at(0).second.dtype(), f32);
  m.to(f64);
  ASSERT_TRUE(opt.params()[0].same(m.w));
  m.w.set_grad(from_vector(g2, {3}));
  opt.step();
  const Tensor buf = opt.state().at(0).second;
  EXPECT_EQ(buf.dtype(), f64);
  const std::vector<double> p2 = m.w.to_vector<double>(), b2 = buf.to_vector<double>();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(b2[i], 0.5 * g1[i] + g2[i], 1e-12);
    EXPECT_NEAR(p2[i], p0[i] - 0.1 * g1[i] - 0.1 * (0.5 * g1[i] + g2[i]), 1e-6);
  }
}

TEST(ModuleTo, MoveBetweenForwardAndBackwardIsCaught) {
  // The tape saved the weight before the move; the move bumps its version past the saved one.
  nn::Linear lin({.in_features = 3, .out_features = 2});
  Tape tape;
  Tensor y = sum(lin.forward(random({2, 3}, f32)));
  lin.to(f64);
  TG_EXPECT_ERROR(tape.backward(y), "modified in place");
}

TEST(ModuleTo, SetDataChecks) {
  Tensor p = random({3}).requires_grad_();
  TG_EXPECT_ERROR(p.set_data_(random({4})), "set_data_", "shape");
  TG_EXPECT_ERROR(p.set_data_(arange(3, {.dtype = i64})), "set_data_", "floating");
  Tensor view = p.detach();
  p.set_data_(full({3}, 2.0));
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{2, 2, 2}));
  EXPECT_NE(view.to_vector<double>(), (std::vector<double>{2, 2, 2}));  // a detached view keeps the old data
}

TEST(Buffers, SavedMovedButNotTrained) {
  WithBuffers m;
  EXPECT_EQ(names_of(m), (std::vector<std::string>{"w", "lin.weight", "lin.bias"}));
  std::vector<std::string> buffers, state;
  for (const auto& [name, t] : m.named_buffers()) buffers.push_back(name);
  for (const auto& [name, t] : m.state_dict()) state.push_back(name);
  EXPECT_EQ(buffers, (std::vector<std::string>{"running", "count"}));
  EXPECT_EQ(state, (std::vector<std::string>{"w", "running", "count", "lin.weight", "lin.bias"}));
  EXPECT_FALSE(m.running.requires_grad());
  EXPECT_TRUE(m.buffers()[1].same(m.count));
  TG_EXPECT_ERROR(m.buffer("w", zeros({1})), "'w'", "already registered");
  TG_EXPECT_ERROR(m.buffer("z", Tensor()), "register_buffer", "undefined");

  // to(f64) casts the floating buffer in place and leaves the integer one alone.
  const Tensor running = m.running;
  m.to(f64);
  EXPECT_TRUE(m.running.same(running));
  EXPECT_EQ(m.running.dtype(), f64);
  EXPECT_EQ(m.count.dtype(), i64);

  // Checkpoints hold the buffers and restore them.
  const std::string path = temp_path("tg_buffers.safetensors");
  save(m, path);
  WithBuffers other;
  other.to(f64);
  other.running.fill_(0);
  other.count.fill_(0);
  load(other, path);
  std::filesystem::remove(path);
  EXPECT_EQ(other.running.to_vector<double>(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(other.count.to_vector<int64_t>(), (std::vector<int64_t>{7}));
}

TEST(Modules, NamesOrderAndApply) {
  Net net;
  std::vector<std::string> names;
  for (const auto& [name, m] : net.named_modules()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"", "features", "features.0", "features.1", "features.2", "head"}));
  auto mods = net.modules();
  ASSERT_EQ(mods.size(), 6u);
  EXPECT_EQ(mods[0], &net);
  EXPECT_EQ(mods[5], net.head.get());
  // A submodule registered twice is listed once, under its first name.
  Registrar r;
  auto relu = std::make_shared<nn::ReLU>();
  r.module("a", relu);
  r.module("b", relu);
  EXPECT_EQ(r.named_modules().size(), 2u);
  // apply: each child's subtree first, then the module itself (PyTorch's order).
  std::map<const nn::Module*, std::string> name_of;
  for (const auto& [name, m] : net.named_modules()) name_of[m] = name;
  std::vector<std::string> order;
  nn::Module& self = net.apply([&](nn::Module& m) { order.push_back(name_of.at(&m)); });
  EXPECT_EQ(&self, &net);
  EXPECT_EQ(order,
            (std::vector<std::string>{"features.0", "features.1", "features.2", "features", "head", ""}));
}

// ---- options: designated initializers and libtorch-style builders ----------------------

TEST(Options, BuilderMatchesDesignated) {
  nn::Conv2dOptions built = nn::Conv2dOptions::make(3, 8, 3).stride(2).padding(1).bias(false);
  nn::Conv2dOptions designated{.in_channels = 3, .out_channels = 8, .kernel_size = 3, .stride = 2, .padding = {1},
                               .bias = false};
  for (const nn::Conv2dOptions& o : {built, designated}) {
    EXPECT_EQ(o.in_channels, 3);
    EXPECT_EQ(o.out_channels, 8);
    EXPECT_EQ(o.kernel_size, (std::vector<int64_t>{3}));
    EXPECT_EQ(o.stride, (std::vector<int64_t>{2}));
    EXPECT_EQ(o.padding, (std::vector<int64_t>{1}));
    EXPECT_EQ(o.dilation, (std::vector<int64_t>{1}));
    EXPECT_FALSE(o.bias);
  }
  nn::Conv2d conv(nn::Conv2dOptions::make(3, 8, {3, 5}).dilation({1, 2}).layout(Layout::NHWC));
  EXPECT_EQ(conv.weight.shape(), Shape({8, 3, 3, 5}));
  EXPECT_EQ(conv.options().layout, Layout::NHWC);
  nn::Conv3d conv3(nn::Conv3dOptions::make(2, 4, 3).padding(1).bias(false));
  EXPECT_EQ(conv3.weight.shape(), Shape({4, 2, 3, 3, 3}));
  EXPECT_FALSE(conv3.bias.defined());
  nn::Linear lin(nn::LinearOptions::make(6, 5).bias(false));
  EXPECT_EQ(lin.weight.shape(), Shape({5, 6}));
  EXPECT_FALSE(lin.bias.defined());
  nn::GroupNorm gn(nn::GroupNormOptions::make(2, 6).eps(1e-3).affine(false));
  EXPECT_EQ(gn.options().num_groups, 2);
  EXPECT_EQ(gn.options().num_channels, 6);
  EXPECT_EQ(gn.options().eps, 1e-3);
  EXPECT_TRUE(gn.parameters().empty());
}

TEST(Options, KernelSizeIsRequired) {
  TG_EXPECT_ERROR(nn::Conv2d({.in_channels = 3, .out_channels = 4}), "Conv2d", "kernel_size is required");
  TG_EXPECT_ERROR(nn::Conv3d({.in_channels = 3, .out_channels = 4, .padding = 1}), "Conv3d",
                  "kernel_size is required");
  TG_EXPECT_ERROR(nn::Conv2d(nn::Conv2dOptions::make(3, 4, {})), "Conv2d", "kernel_size is required");
}

// ---- Linear over any leading dims -------------------------------------------------------

TEST(Layers, LinearOverLeadingDims) {
  manual_seed(4);
  nn::Linear lin({.in_features = 4, .out_features = 3}, {.dtype = f64});
  const Tensor x = random({2, 5, 4});
  const Tensor y = lin.forward(x);
  ASSERT_EQ(y.shape(), Shape({2, 5, 3}));
  // Each row is the 2-D product of that row.
  const Tensor flat = lin.forward(x.reshape({10, 4}));
  EXPECT_EQ(y.to_vector<double>(), flat.to_vector<double>());
  EXPECT_EQ(lin.forward(random({2, 1, 3, 4})).shape(), Shape({2, 1, 3, 3}));
  EXPECT_EQ(lin.forward(random({0, 2, 4})).shape(), Shape({0, 2, 3}));
  TG_EXPECT_ERROR(lin.forward(random({2, 5, 6})), "Linear", "(..., 4)");
  std::vector<Tensor> inputs = {param({2, 3, 4}), lin.weight, lin.bias};
  TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return lin.forward(in[0]); }, inputs);
  std::vector<Tensor> deep = {param({3, 1, 2, 4}), lin.weight, lin.bias};
  TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return lin.forward(in[0]); }, deep);
}
