// nn layers on the CPU: option validation, both option spellings (designated initializers and
// libtorch-style builders), forward shapes and values against loops, a gradient check through a
// whole small model, and Linear over leading dims.
#include <algorithm>
#include <cmath>

#include "common/nn_modules.h"
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

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
  EXPECT_EQ(nn::Flatten(0)(random({2, 3, 5, 7}, f32)).shape(), Shape({210}));
  EXPECT_EQ(nn::Flatten(1, 2)(random({2, 3, 5, 7}, f32)).shape(), Shape({2, 15, 7}));
  EXPECT_EQ(nn::Flatten(-3, -2)(random({2, 3, 5, 7}, f32)).shape(), Shape({2, 15, 7}));
  TG_EXPECT_ERROR(nn::Flatten(1, 7)(random({2, 3}, f32)), "flatten");
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
