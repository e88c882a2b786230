// The engine's stride-1 grad-weight over shifted rows of the padded input
// (ops/cuda/gemm/conv_wgrad_shifted_sm90.cu) against the f64 CPU reference, at shapes that break
// its assumptions: channels that are not a multiple of its 16-row boxes (the per-tap padding of
// the (t, c) rows), output channels on both sides of 64 (the (t, c) rows as A or as B), paddings
// past the kernel and kernels past the input (taps that read only border), dilations, per-dim
// kernels, 3-D volumes, NHWC, N = 1, many small images (shifted reads that run into the next
// image's border), split reductions. TF32, FP32 (split TF32) and BF16 operands; outputs
// NaN-poisoned before each run. Also: which problems it takes, and that its split reductions
// give the same bits every run. Needs an sm_90a GPU (H100 / H200); elsewhere the tests say so
// and skip.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/conv_tma_util.h"
#include "ops/cpu/conv.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::conv_tma;

namespace {

std::vector<ConvCase> shifted_cases() {
  return {
      {"3x3 p1, 20 -> 170 (C pads to 32 per tap; (t, c) rows as B)", {3, 20, 5, 7}, {170, 20, 3, 3}, {.padding = {1}}},
      {"3x3 p1, 48 -> 40 ((t, c) rows as A, boxes of 16)", {2, 48, 9, 11}, {40, 48, 3, 3}, {.padding = {1}}},
      {"5x5 d2 p3, 33 -> 64", {2, 33, 13, 12}, {64, 33, 5, 5}, {.padding = {3}, .dilation = {2}}},
      {"100 -> 72 (eight boxes of 16 per tile)", {2, 100, 7, 6}, {72, 100, 3, 3}, {.padding = {1}}},
      {"256 outputs, 64 channels (two 64-row boxes per B tile)", {2, 64, 10, 10}, {256, 64, 3, 3}, {.padding = {1}}},
      {"many small images", {37, 48, 5, 3}, {40, 48, 3, 3}, {.padding = {1}}},
      {"N = 1, padding 4 (past the kernel)", {1, 16, 6, 5}, {24, 16, 3, 3}, {.padding = {4}}},
      {"kernel past the input", {2, 16, 3, 2}, {32, 16, 5, 5}, {.padding = {2}}},
      {"rect kernel, per-dim padding and dilation", {1, 17, 16, 9}, {5, 17, 3, 1}, {.padding = {1, 0}, .dilation = {1, 3}}},
      {"NHWC 3x3 p1, 36 -> 96", {2, 9, 11, 36}, {96, 36, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"NHWC 1x1, 64 -> 130", {2, 5, 6, 64}, {130, 64, 1, 1}, {.layout = Layout::NHWC}},
      {"3d 3x3x3 p1, 20 -> 9", {2, 20, 6, 7, 5}, {9, 20, 3, 3, 3}, {.padding = {1}}},
      {"3d anisotropic, 16 -> 70", {2, 16, 5, 9, 6}, {70, 16, 1, 3, 2}, {.padding = {0, 1, 1}, .dilation = {1, 1, 2}}},
  };
}

const Variant kVariants[] = {
    {"auto plan", {.wgrad_shifted = 1}},
    {"unsplit", {.splits = 1, .wgrad_shifted = 1}},
    {"split 3", {.splits = 3, .wgrad_shifted = 1}},
    {"split 64", {.splits = 64, .wgrad_shifted = 1}},
    {"two blocks per SM", {.splits = 1, .blocks_per_sm = 2, .wgrad_shifted = 1}},
    {"split 2, stores through the output map", {.splits = 2, .wgrad_shifted = 1, .tma_store = -1}},
    {"128 wide (FP32 on 128-wide tiles for 64 or fewer outputs too)", {.tile = 128, .splits = 2, .wgrad_shifted = 1}},
};

TEST(ConvWgradShifted, MatchesF64Reference) {
  TG_REQUIRE_TMA();
  for (const ConvCase& c : shifted_cases())
    expect_grad_weight_on_tma(c, kVariants, std::size(kVariants), /*wgrad_shifted=*/1);
}

// BF16 operands: exact products accumulated in f32, so within the accumulation's rounding of
// the f64 reference of the same values (N P terms per output: test_conv_bf16_cuda.cpp).
TEST(ConvWgradShifted, Bf16OperandsMatchF64Reference) {
  TG_REQUIRE_TMA();
  for (const ConvCase& c : shifted_cases()) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    if (s.channels_last() && s.C % 8 != 0) continue;
    const Tensor x = random(c.x, DType::bf16, kGpu), dy = random(s.y_shape(), DType::bf16, kGpu);
    Tensor dw_ref = Tensor::empty(c.w, {.dtype = DType::f64});
    cpu::conv_grad_weight(dw_ref, ref(dy), ref(x), s);
    const double tol = std::max(1e-5, double(s.N * s.out_volume()) * std::ldexp(1.0, -23));
    for (const Variant& v : kVariants) {
      const std::string where = std::string(c.name) + ", bf16, " + v.name;
      Tensor dw = Tensor::empty(c.w, {.device = kGpu});
      ASSERT_TRUE(cuda::engine_conv_grad_weight_uses_shifted_rows(s, dw, Precision::TF32, true, v.policy)) << where;
      poison(dw);
      cuda::engine_conv_grad_weight_bf16(dw, dy, x, s, v.policy);
      EXPECT_LE(rel_l2(dw, dw_ref), tol) << where;
    }
  }
}

// A long reduction split many ways: the same bits every run (the fixed-order split reduction).
TEST(ConvWgradShifted, SplitReductionsGiveTheSameBitsEveryRun) {
  TG_REQUIRE_TMA();
  const ConvShape s = make_conv_shape("test", {8, 40, 40, 40}, {96, 40, 3, 3}, {.padding = {1}});
  Tensor x = random(s.x_shape(), DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
  Tensor dw_ref = Tensor::empty(s.w_shape(), {.dtype = DType::f64});
  cpu::conv_grad_weight(dw_ref, ref(dy), ref(x), s);
  for (Precision prec : kPrecisions)
    for (int splits : {0, 7, 64}) {
      const cuda::EnginePolicy policy{.splits = splits, .wgrad_shifted = 1};
      Tensor first = Tensor::empty(s.w_shape(), {.device = kGpu}), second = Tensor::empty(s.w_shape(), {.device = kGpu});
      poison(first);
      poison(second);
      cuda::engine_conv_grad_weight(first, dy, x, s, prec, policy);
      cuda::engine_conv_grad_weight(second, dy, x, s, prec, policy);
      EXPECT_EQ(first.to_vector<float>(), second.to_vector<float>()) << name_of(prec) << ", splits " << splits;
      EXPECT_LE(rel_l2(first, dw_ref), tolerance(prec)) << name_of(prec) << ", splits " << splits;
    }
}

// Which problems it takes: stride 1 and 16+ input channels only; by default 32+ output channels
// and a padded grid of at most 1.2x the output pixels (1.45x with 25+ taps, 1.3x up to 256
// input channels); never past its index and copy limits; never when the policy says -1.
TEST(ConvWgradShifted, TakesStrideOneProblemsWithinItsRule) {
  TG_REQUIRE_TMA();
  auto takes = [](const Shape& x, const Shape& w, const ConvParams& p, const cuda::EnginePolicy& policy = {}) {
    const ConvShape s = make_conv_shape("test", x, w, p);
    return cuda::engine_conv_grad_weight_uses_shifted_rows(s, Tensor::empty(w, {.device = kGpu}), Precision::TF32,
                                                           false, policy);
  };
  const cuda::EnginePolicy forced{.wgrad_shifted = 1};
  EXPECT_TRUE(takes({2, 64, 32, 32}, {64, 64, 3, 3}, {.padding = {1}}));  // grid 34^2 / 32^2 = 1.13
  EXPECT_FALSE(takes({2, 64, 8, 8, 8}, {64, 64, 3, 3, 3}, {.padding = {1}}));  // 1000 / 512 = 1.95
  EXPECT_FALSE(takes({2, 64, 4, 4}, {64, 64, 3, 3}, {.padding = {1}}));  // 36 / 16 = 2.25
  EXPECT_TRUE(takes({2, 128, 16, 16, 16}, {128, 128, 3, 3, 3}, {.padding = {1}}));  // 1.42 with 27 taps
  EXPECT_TRUE(takes({2, 256, 16, 16}, {256, 256, 3, 3}, {.padding = {1}}));        // 1.27, 256 channels
  EXPECT_FALSE(takes({2, 384, 16, 16}, {384, 384, 3, 3}, {.padding = {1}}));       // 1.27, 384 channels
  EXPECT_TRUE(takes({2, 64, 4, 4}, {64, 64, 3, 3}, {.padding = {1}}, forced));
  EXPECT_FALSE(takes({2, 64, 32, 32}, {16, 64, 3, 3}, {.padding = {1}}));  // 16 output channels
  EXPECT_TRUE(takes({2, 64, 32, 32}, {16, 64, 3, 3}, {.padding = {1}}, forced));
  EXPECT_FALSE(takes({2, 64, 32, 32}, {64, 64, 3, 3}, {.stride = {2}, .padding = {1}}, forced));
  EXPECT_FALSE(takes({2, 8, 32, 32}, {64, 8, 3, 3}, {.padding = {1}}, forced));  // 8 input channels
  EXPECT_FALSE(takes({2, 64, 32, 32}, {64, 64, 3, 3}, {.padding = {1}}, {.wgrad_shifted = -1}));
  // N V past 2^31 positions: the columns or cp.async kernels' business (nothing is allocated).
  EXPECT_FALSE(takes({40000, 16, 256, 256}, {32, 16, 3, 3}, {.padding = {1}}, forced));
}

}  // namespace
