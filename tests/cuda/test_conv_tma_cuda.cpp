// The engine's TMA-fed convolution passes (ops/cuda/gemm/conv_fprop_sm90_tma.cu: the
// forward and the stride-1 grad-input it runs as a forward; conv_dgrad_sm90_tma.cu: the strided
// grad-input, one stride-1 forward over dy per stride phase; conv_wgrad_sm90_tma.cu:
// grad-weight) against the f64 CPU reference, at shapes that break its assumptions: channels
// that are not a multiple of the 32-channel k-tile (and, NCHW, not of 4), tiles of 128 output
// pixels that run across rows and images, strides, dilations and paddings larger than the
// kernel, 3-D volumes, N = 1, output channels past one tile or under 64, split reductions. Outputs are
// NaN-poisoned before each launch. Also: which problems it serves, and that its split
// reductions give the same bits every run. Needs an sm_90a GPU (H100 / H200); elsewhere the
// tests say so and skip.
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

// Every case has 16+ input channels and a geometry the im2col map can express.
std::vector<ConvCase> tma_cases() {
  return {
      {"3x3 s1 p1, 48 channels, many small images", {37, 48, 5, 3}, {40, 48, 3, 3}, {.padding = {1}}},
      {"3x3 s2 p1, 33 channels (NCHW pads to 36, slices to 64)", {3, 33, 15, 11}, {67, 33, 3, 3},
       {.stride = {2}, .padding = {1}}},
      {"4x4 s2 p1, 20 channels", {2, 20, 16, 17}, {24, 20, 4, 4}, {.stride = {2}, .padding = {1}}},
      {"1x1 s2, 40 channels, 130 outputs", {2, 40, 9, 9}, {130, 40, 1, 1}, {.stride = {2}}},
      {"3x3, N = 1, 70 -> 150 channels", {1, 70, 6, 7}, {150, 70, 3, 3}, {.padding = {1}}},
      {"3x3 p4 (padding past the kernel)", {2, 16, 6, 5}, {8, 16, 3, 3}, {.padding = {4}}},
      {"dilated 3x3 d3 p3, stride 3", {2, 24, 17, 14}, {36, 24, 3, 3}, {.stride = {3}, .padding = {3}, .dilation = {3}}},
      {"rect kernel, per-dim params", {1, 17, 16, 9}, {5, 17, 3, 1}, {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 3}}},
      {"300 output channels", {2, 24, 8, 8}, {300, 24, 3, 3}, {.padding = {1}}},
      {"NHWC 3x3 s1 p1, 36 channels", {2, 9, 11, 36}, {20, 36, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"NHWC 7x7 s2 p3, 32 channels, 64 outputs", {3, 23, 19, 32}, {64, 32, 7, 7},
       {.stride = {2}, .padding = {3}, .layout = Layout::NHWC}},
      {"NHWC 5x5 s2 d2 p3, 16 channels", {2, 17, 13, 16}, {7, 16, 5, 5},
       {.stride = {2}, .padding = {3}, .dilation = {2}, .layout = Layout::NHWC}},
      {"3d 3x3x3 p1, 20 channels", {2, 20, 6, 7, 5}, {9, 20, 3, 3, 3}, {.padding = {1}}},
      {"3d s2 d2 p2, 24 channels", {2, 24, 9, 10, 11}, {24, 24, 3, 3, 3}, {.stride = {2}, .padding = {2}, .dilation = {2}}},
      {"3d anisotropic", {2, 16, 5, 9, 6}, {4, 16, 1, 3, 2}, {.stride = {1, 2, 1}, .padding = {0, 1, 1}, .dilation = {1, 1, 2}}},
  };
}

const Variant kVariants[] = {
    {"auto", {}},
    {"128 wide, unsplit", {.tile = 128, .splits = 1}},
    {"128 wide, split 3", {.tile = 128, .splits = 3}},
    {"256 wide, unsplit", {.tile = 256, .splits = 1}},
    {"256 wide, split 2", {.tile = 256, .splits = 2}},
    {"128 wide, two blocks per SM", {.tile = 128, .splits = 1, .blocks_per_sm = 2}},
    {"128 wide, two blocks per SM, split 2", {.tile = 128, .splits = 2, .blocks_per_sm = 2}},
    {"128 wide, stores through the output map", {.tile = 128, .splits = 1, .tma_store = -1}},
    {"128 wide, split 3, stores through the output map", {.tile = 128, .splits = 3, .tma_store = -1}},
};

// Grad-input the TMA kernel leaves to the other kernels, which still give the right answer.
void expect_grad_input_elsewhere(const ConvCase& c) {
  const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
  Tensor w = random(c.w, DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
  EXPECT_FALSE(cuda::engine_conv_grad_input_uses_tma(s, dy, Precision::TF32)) << c.name;
  Tensor dx = Tensor::empty(c.x, {.device = kGpu});
  poison(dx);
  cuda::engine_conv_grad_input(dx, dy, w, s, Precision::TF32);
  Tensor dx_ref = Tensor::empty(c.x, {.dtype = DType::f64});
  cpu::conv_grad_input(dx_ref, ref(dy), ref(w), s);
  EXPECT_LE(rel_l2(dx, dx_ref), kTf32Tolerance) << c.name;
}

TEST(ConvTma, ForwardMatchesF64Reference) {
  TG_REQUIRE_TMA();
  for (const ConvCase& c : tma_cases()) expect_forward_on_tma(c, kVariants, std::size(kVariants));
}

// Without a bias and with one: the bias reaches every output channel exactly once (split
// reductions add it in the final pass, unsplit ones in the epilogue).
TEST(ConvTma, BiasIsAddedOnceSplitOrNot) {
  TG_REQUIRE_TMA();
  const ConvCase c{"bias", {4, 32, 12, 12}, {72, 32, 3, 3}, {.padding = {1}}};
  const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
  Tensor x = random(c.x, DType::f32, kGpu), w = random(c.w, DType::f32, kGpu);
  Tensor b = random({s.K}, DType::f32, kGpu);
  for (int splits : {1, 4}) {
    Tensor with = Tensor::empty(s.y_shape(), {.device = kGpu}), without = Tensor::empty(s.y_shape(), {.device = kGpu});
    poison(with);
    poison(without);
    cuda::engine_conv_forward(with, x, w, b, s, Precision::TF32, {.splits = splits});
    cuda::engine_conv_forward(without, x, w, Tensor(), s, Precision::TF32, {.splits = splits});
    const auto a = with.to_vector<float>(), z = without.to_vector<float>(), bias = b.to_vector<float>();
    const int64_t plane = s.out_volume();
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const int64_t k = (int64_t(i) / plane) % s.K;
      worst = std::max(worst, double(std::abs(a[i] - z[i] - bias[size_t(k)])));
    }
    EXPECT_LE(worst, 1e-4) << "splits " << splits;
  }
}

// The epilogue that hands tiles to the TMA unit (channels-last and channels-first outputs, split
// partial sums, grad-weight) against the one that stores element by element through the output map:
// the same accumulators, the same bias additions, so the same bits, at ragged edges (rows past
// the last tile, columns past the last 32-column box) and for every tile width.
TEST(ConvTma, TmaStoreEpilogueMatchesTheElementwiseOne) {
  TG_REQUIRE_TMA();
  const ConvCase cases[] = {
      {"NHWC 3x3, 36 -> 20 channels", {3, 9, 11, 36}, {20, 36, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"NHWC 3x3 s2, 48 -> 132 channels", {2, 13, 10, 48}, {132, 48, 3, 3},
       {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
      {"NCHW 3x3, 40 -> 200 channels (partial sums when split)", {2, 40, 9, 7}, {200, 40, 3, 3}, {.padding = {1}}},
      // Channels-first outputs by TMA: tiles that straddle images (156 pixels each), a box of 32
      // pixels that spans eight 4-pixel images, and a 3-D output.
      {"NCHW 3x3, 20 -> 72 channels, 12 x 13 images", {3, 20, 12, 13}, {72, 20, 3, 3}, {.padding = {1}}},
      {"NCHW 3x3, 16 -> 40 channels, 2 x 2 images", {9, 16, 2, 2}, {40, 16, 3, 3}, {.padding = {1}}},
      {"NCDHW 3x3x3, 24 -> 36 channels", {2, 24, 3, 4, 6}, {36, 24, 3, 3, 3}, {.padding = {1}}},
      // Strided: the grad-input's phases scatter through the output map (partial sums by TMA
      // when split).
      {"NCHW 3x3 s2, 24 -> 40 channels, 15 x 11 images", {2, 24, 15, 11}, {40, 24, 3, 3},
       {.stride = {2}, .padding = {1}}},
  };
  const cuda::EnginePolicy layouts[] = {{.tile = 128, .splits = 1}, {.tile = 128, .splits = 3}, {.tile = 256, .splits = 1},
                                        {.tile = 128, .splits = 1, .blocks_per_sm = 2}, {}};
  for (const ConvCase& c : cases) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    Tensor x = random(c.x, DType::f32, kGpu), w = random(c.w, DType::f32, kGpu), b = random({s.K}, DType::f32, kGpu);
    Tensor dy = random(s.y_shape(), DType::f32, kGpu);
    for (const cuda::EnginePolicy& base : layouts) {
      cuda::EnginePolicy elementwise = base;
      elementwise.tma_store = -1;
      const std::string where = std::string(c.name) + ", tile " + std::to_string(base.tile) + ", splits " +
                                std::to_string(base.splits) + ", blocks per SM " + std::to_string(base.blocks_per_sm);
      for (Precision prec : kPrecisions) {
        Tensor y_tma = Tensor::empty(s.y_shape(), {.device = kGpu});
        Tensor y_map = Tensor::empty(s.y_shape(), {.device = kGpu});
        poison(y_tma);
        poison(y_map);
        cuda::engine_conv_forward(y_tma, x, w, b, s, prec, base);
        cuda::engine_conv_forward(y_map, x, w, b, s, prec, elementwise);
        EXPECT_EQ(y_tma.to_vector<float>(), y_map.to_vector<float>()) << "forward, " << name_of(prec) << ", " << where;
      }
      for (Precision prec : kPrecisions) {
        if (!cuda::engine_conv_grad_weight_uses_tma(s, Tensor::empty(c.w, {.device = kGpu}), prec, base)) continue;
        Tensor dw_tma = Tensor::empty(c.w, {.device = kGpu}), dw_map = Tensor::empty(c.w, {.device = kGpu});
        poison(dw_tma);
        poison(dw_map);
        cuda::engine_conv_grad_weight(dw_tma, dy, x, s, prec, base);
        cuda::engine_conv_grad_weight(dw_map, dy, x, s, prec, elementwise);
        EXPECT_EQ(dw_tma.to_vector<float>(), dw_map.to_vector<float>()) << "grad-weight, " << name_of(prec) << ", "
                                                                        << where;
      }
      for (Precision prec : kPrecisions) {
        if (!cuda::engine_conv_grad_input_uses_tma(s, dy, prec, base)) continue;
        Tensor dx_tma = Tensor::empty(c.x, {.device = kGpu}), dx_map = Tensor::empty(c.x, {.device = kGpu});
        poison(dx_tma);
        poison(dx_map);
        cuda::engine_conv_grad_input(dx_tma, dy, w, s, prec, base);
        cuda::engine_conv_grad_input(dx_map, dy, w, s, prec, elementwise);
        EXPECT_EQ(dx_tma.to_vector<float>(), dx_map.to_vector<float>()) << "grad-input, " << name_of(prec) << ", "
                                                                        << where;
      }
    }
  }
}

TEST(ConvTma, SplitReductionsAreBitReproducible) {
  TG_REQUIRE_TMA();
  const ConvCase c{"split", {2, 96, 8, 8}, {48, 96, 3, 3}, {.padding = {1}}};
  const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
  Tensor x = random(c.x, DType::f32, kGpu), w = random(c.w, DType::f32, kGpu);
  for (int splits : {0, 5, 27}) {
    Tensor first = Tensor::empty(s.y_shape(), {.device = kGpu}), second = Tensor::empty(s.y_shape(), {.device = kGpu});
    poison(first);
    poison(second);
    cuda::engine_conv_forward(first, x, w, Tensor(), s, Precision::TF32, {.splits = splits});
    cuda::engine_conv_forward(second, x, w, Tensor(), s, Precision::TF32, {.splits = splits});
    EXPECT_EQ(first.to_vector<float>(), second.to_vector<float>()) << "splits " << splits;
  }
}

// Stride-1 grad-input runs as the forward of dy with the weights transposed and flipped.
TEST(ConvTma, GradInputMatchesF64Reference) {
  TG_REQUIRE_TMA();
  const ConvCase cases[] = {
      {"3x3 p1", {2, 24, 9, 11}, {32, 24, 3, 3}, {.padding = {1}}},
      {"3x3 d2 p2", {2, 20, 12, 10}, {24, 20, 3, 3}, {.padding = {2}, .dilation = {2}}},
      {"5x5 p1 (padding under the reach)", {2, 16, 11, 9}, {20, 16, 5, 5}, {.padding = {1}}},
      {"1x1", {2, 20, 5, 5}, {36, 20, 1, 1}, {}},
      {"19 output channels (NCHW pads dy's to 20)", {1, 10, 8, 8}, {19, 10, 3, 3}, {.padding = {1}}},
      {"150 -> 70 channels, N = 1", {1, 70, 6, 7}, {150, 70, 3, 3}, {.padding = {1}}},
      {"NHWC 3x3 p1", {2, 8, 7, 12}, {16, 12, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"3d 3x3x3 p1", {2, 12, 5, 6, 7}, {20, 12, 3, 3, 3}, {.padding = {1}}},
  };
  for (const ConvCase& c : cases) expect_grad_input_on_tma(c, kVariants, std::size(kVariants));
  // Strided grad-input: StridedGradInputMatchesF64Reference.
  const ConvCase others[] = {
      {"padding past the reach", {2, 24, 9, 11}, {32, 24, 3, 3}, {.padding = {3}}},
      {"NHWC, 18 output channels", {2, 8, 7, 12}, {18, 12, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
  };
  for (const ConvCase& c : others) expect_grad_input_elsewhere(c);
}

// Strided grad-input: per stride phase a stride-1 forward over dy (taps reversed, a padding
// that may be negative: the window starting inside dy), scattered into dx through the output
// map's phase mode. Shapes where the phases differ in pixel and tap counts, phases that no tap
// reaches (zeros), per-dim strides, dilations sharing a factor with the stride or not, channel
// counts that are not multiples of 4 or 32, more dx channels than one tile.
TEST(ConvTma, StridedGradInputMatchesF64Reference) {
  TG_REQUIRE_TMA();
  const ConvCase cases[] = {
      {"3x3 s2 p1, 19 -> 24 channels (NCHW pads dy's to 20), 15 x 11", {2, 24, 15, 11}, {19, 24, 3, 3},
       {.stride = {2}, .padding = {1}}},
      {"3x3 s2 p1, 33 -> 70 channels, N = 1, 13 x 9", {1, 70, 13, 9}, {33, 70, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"3x3 s2 p1, 32 -> 150 channels (two column tiles)", {1, 150, 9, 10}, {32, 150, 3, 3},
       {.stride = {2}, .padding = {1}}},
      {"4x4 s2 p1", {2, 20, 16, 17}, {24, 20, 4, 4}, {.stride = {2}, .padding = {1}}},
      {"3x3 s3 d2 p2 (windows starting inside dy)", {2, 16, 17, 14}, {20, 16, 3, 3},
       {.stride = {3}, .padding = {2}, .dilation = {2}}},
      {"5x5 s2 d3 p4 (phase taps 3 dy pixels apart)", {1, 24, 17, 14}, {16, 24, 5, 5},
       {.stride = {2}, .padding = {4}, .dilation = {3}}},
      {"1x1 s2 (phases without taps)", {2, 20, 9, 10}, {40, 20, 1, 1}, {.stride = {2}}},
      {"2x2 s3 (phases without taps)", {2, 12, 11, 10}, {32, 12, 2, 2}, {.stride = {3}}},
      {"3x3 s2 p4 (padding past the kernel)", {2, 16, 10, 9}, {24, 16, 3, 3}, {.stride = {2}, .padding = {4}}},
      {"per-dim strides 2, 1", {2, 20, 9, 8}, {16, 20, 3, 3}, {.stride = {2, 1}, .padding = {1}}},
      {"per-dim strides 1, 3, 3x2 kernel", {2, 20, 7, 13}, {24, 20, 3, 2}, {.stride = {1, 3}, .padding = {1, 0}}},
      {"7x7 s2 p3, 64 -> 12 channels", {2, 12, 23, 19}, {64, 12, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"NHWC 3x3 s2 p1, 36 -> 24 channels", {2, 13, 10, 24}, {36, 24, 3, 3},
       {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
      {"NHWC 3x3 s2 p1, 16 -> 40 channels, N = 1", {1, 11, 9, 40}, {16, 40, 3, 3},
       {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
      {"3d 3x3x3 s2 p1", {2, 12, 7, 6, 9}, {20, 12, 3, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"3d anisotropic", {2, 16, 5, 9, 6}, {20, 16, 1, 3, 2},
       {.stride = {1, 2, 3}, .padding = {0, 1, 1}, .dilation = {1, 1, 2}}},
  };
  for (const ConvCase& c : cases) expect_grad_input_on_tma(c, kVariants, std::size(kVariants));
  // Left to the other kernels, which still give the right answer.
  const ConvCase others[] = {
      {"8 dy channels (most of each 32-channel slice wasted)", {2, 24, 9, 11}, {8, 24, 3, 3},
       {.stride = {2}, .padding = {1}}},
      {"NHWC, 18 dy channels (rows not 16-byte multiples)", {2, 9, 11, 12}, {18, 12, 3, 3},
       {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
      {"7x7 s2 p3 stem, 3 dx channels (the columns pass)", {2, 3, 23, 19}, {64, 3, 7, 7},
       {.stride = {2}, .padding = {3}}},
      {"3d padding 34 (a phase's window corner past the 5-d range)", {1, 16, 3, 3, 3}, {16, 16, 3, 3, 3},
       {.stride = {2}, .padding = {34}}},
  };
  for (const ConvCase& c : others) expect_grad_input_elsewhere(c);
  // The policy's mma.sync and never-FP32-on-TMA choices keep the phases on the cp.async kernels.
  const ConvShape s = make_conv_shape("test", {2, 24, 9, 11}, {32, 24, 3, 3}, {.stride = {2}, .padding = {1}});
  Tensor dy = random(s.y_shape(), DType::f32, kGpu);
  EXPECT_FALSE(cuda::engine_conv_grad_input_uses_tma(s, dy, Precision::TF32, {.arch = 80}));
  EXPECT_FALSE(cuda::engine_conv_grad_input_uses_tma(s, dy, Precision::FP32, {.fp32_tma = -1}));
}

// A split strided grad-input gives the same bits every run (the engine's fixed-order reduction
// per phase), and the right answer.
TEST(ConvTma, SplitStridedGradInputIsBitReproducible) {
  TG_REQUIRE_TMA();
  const ConvShape s = make_conv_shape("test", {2, 48, 16, 15}, {96, 48, 3, 3}, {.stride = {2}, .padding = {1}});
  Tensor w = random(s.w_shape(), DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
  Tensor dx_ref = Tensor::empty(s.x_shape(), {.dtype = DType::f64});
  cpu::conv_grad_input(dx_ref, ref(dy), ref(w), s);
  for (Precision prec : kPrecisions) {
    ASSERT_TRUE(cuda::engine_conv_grad_input_uses_tma(s, dy, prec, {.splits = 5})) << name_of(prec);
    Tensor first = Tensor::empty(s.x_shape(), {.device = kGpu}), second = Tensor::empty(s.x_shape(), {.device = kGpu});
    poison(first);
    poison(second);
    cuda::engine_conv_grad_input(first, dy, w, s, prec, {.splits = 5});
    cuda::engine_conv_grad_input(second, dy, w, s, prec, {.splits = 5});
    EXPECT_EQ(first.to_vector<float>(), second.to_vector<float>()) << name_of(prec);
    EXPECT_LE(rel_l2(first, dx_ref), tolerance(prec)) << name_of(prec);
  }
}

// Grad-weight: dy and the input's columns written out with the pixels contiguous, then the
// TMA product; the pixel count is not a multiple of 4 in most cases (padded rows). The shifted
// rows that stride-1 problems may take instead are off here (test_conv_wgrad_shifted_cuda.cpp).
TEST(ConvTma, GradWeightMatchesF64Reference) {
  TG_REQUIRE_TMA();
  const ConvCase cases[] = {
      {"3x3 p1, 5x7 images", {3, 12, 5, 7}, {170, 12, 3, 3}, {.padding = {1}}},
      {"3x3 s2 p1, 33 channels", {3, 33, 15, 11}, {167, 33, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"1 channel 5x5 d2 p3 (narrow columns)", {2, 1, 17, 19}, {32, 1, 5, 5}, {.padding = {3}, .dilation = {2}}},
      {"1x1, 300 outputs", {2, 20, 5, 5}, {300, 20, 1, 1}, {}},
      {"NHWC 3x3 s2, 5 channels", {3, 13, 10, 5}, {196, 5, 3, 3}, {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
      {"NHWC 3x3 p1, 40 channels (a partial 32-channel tile)", {2, 7, 9, 40}, {170, 40, 3, 3},
       {.padding = {1}, .layout = Layout::NHWC}},
      {"3d 3x3x3 s2 p1", {2, 6, 9, 8, 7}, {160, 6, 3, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"3d 3x3x3, 2 channels (narrow columns)", {1, 2, 6, 5, 7}, {40, 2, 3, 3, 3}, {.padding = {1}}},
      {"3x3, 64 outputs (the product transposed)", {2, 20, 9, 11}, {64, 20, 3, 3}, {.padding = {1}}},
      {"NHWC 3x3 s2, 64 outputs (the product transposed)", {3, 11, 10, 24}, {64, 24, 3, 3},
       {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
      {"N = 1, kernel past the input", {1, 4, 3, 2}, {200, 4, 5, 5}, {.padding = {2}}},
  };
  for (const ConvCase& c : cases) expect_grad_weight_on_tma(c, kVariants, std::size(kVariants), /*wgrad_shifted=*/-1);
  // A long reduction split many ways gives the same bits every run, and at FP32 the
  // FP32-accurate answer.
  const ConvShape s = make_conv_shape("test", {8, 16, 40, 40}, {192, 16, 3, 3}, {.padding = {1}});
  Tensor x = random(s.x_shape(), DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
  Tensor dw_ref = Tensor::empty(s.w_shape(), {.dtype = DType::f64});
  cpu::conv_grad_weight(dw_ref, ref(dy), ref(x), s);
  for (Precision prec : kPrecisions)
    for (int splits : {0, 7, 64}) {
      Tensor first = Tensor::empty(s.w_shape(), {.device = kGpu}), second = Tensor::empty(s.w_shape(), {.device = kGpu});
      poison(first);
      poison(second);
      cuda::engine_conv_grad_weight(first, dy, x, s, prec, {.splits = splits, .wgrad_shifted = -1});
      cuda::engine_conv_grad_weight(second, dy, x, s, prec, {.splits = splits, .wgrad_shifted = -1});
      EXPECT_EQ(first.to_vector<float>(), second.to_vector<float>()) << name_of(prec) << ", splits " << splits;
      EXPECT_LE(rel_l2(first, dw_ref), tolerance(prec)) << name_of(prec) << ", splits " << splits;
    }
  // Fewer output channels than the columns pay for (the shifted rows off): the cp.async kernel.
  for (const Shape& w_shape : {Shape{48, 16, 3, 3}, Shape{16, 4, 3, 3}}) {
    const ConvShape few = make_conv_shape("test", {2, w_shape[1], 8, 8}, w_shape, {.padding = {1}});
    EXPECT_FALSE(cuda::engine_conv_grad_weight_uses_tma(few, Tensor::empty(few.w_shape(), {.device = kGpu}),
                                                        Precision::TF32, {.wgrad_shifted = -1}))
        << w_shape;
  }
  // The policy overrides that rule both ways; forced onto few output channels, the columns
  // still give the right answer.
  const ConvShape few = make_conv_shape("test", {3, 24, 9, 7}, {16, 24, 3, 3}, {.padding = {1}});
  const ConvShape many = make_conv_shape("test", {2, 8, 6, 6}, {200, 8, 3, 3}, {.padding = {1}});
  Tensor dw_few = Tensor::empty(few.w_shape(), {.device = kGpu});
  EXPECT_TRUE(cuda::engine_conv_grad_weight_uses_tma(few, dw_few, Precision::TF32, {.wgrad_columns = 1}));
  EXPECT_FALSE(cuda::engine_conv_grad_weight_uses_tma(many, Tensor::empty(many.w_shape(), {.device = kGpu}),
                                                      Precision::TF32, {.wgrad_columns = -1}));
  Tensor x_few = random(few.x_shape(), DType::f32, kGpu), dy_few = random(few.y_shape(), DType::f32, kGpu);
  Tensor dw_few_ref = Tensor::empty(few.w_shape(), {.dtype = DType::f64});
  cpu::conv_grad_weight(dw_few_ref, ref(dy_few), ref(x_few), few);
  poison(dw_few);
  cuda::engine_conv_grad_weight(dw_few, dy_few, x_few, few, Precision::TF32, {.wgrad_columns = 1});
  EXPECT_LE(rel_l2(dw_few, dw_few_ref), kTf32Tolerance);
}

// What it must leave to the cp.async kernels, which then still give the right answer.
TEST(ConvTma, LeavesWhatItCannotServeToTheOtherKernels) {
  TG_REQUIRE_TMA();
  const ConvCase cases[] = {
      {"NHWC, 18 channels (rows not 16-byte multiples)", {2, 7, 6, 18}, {8, 18, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"padding 130 (past the im2col corner range)", {1, 16, 4, 4}, {4, 16, 3, 3}, {.padding = {130}}},
      {"3d padding 17 (past the 5-d corner range)", {1, 16, 3, 3, 3}, {2, 16, 3, 3, 3}, {.padding = {17}}},
      {"stride 9 (past the traversal stride range)", {1, 16, 20, 20}, {4, 16, 2, 2}, {.stride = {9}}},
      // One input plane, a 1-deep kernel and D padding with a D stride past it: the one output
      // plane reads the padding (all zeros). A rank-4 map has no D coordinate and would read the
      // input plane instead.
      {"3d, one plane, D padding 1, D stride 3", {2, 16, 1, 5, 6}, {4, 16, 1, 3, 3},
       {.stride = {3, 1, 1}, .padding = {1, 1, 1}}},
  };
  for (const ConvCase& c : cases) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    Tensor x = random(c.x, DType::f32, kGpu), w = random(c.w, DType::f32, kGpu);
    EXPECT_FALSE(cuda::engine_conv_forward_uses_tma(s, x, Precision::TF32)) << c.name;
    Tensor y = Tensor::empty(s.y_shape(), {.device = kGpu});
    poison(y);
    cuda::engine_conv_forward(y, x, w, Tensor(), s, Precision::TF32);
    Tensor y_ref = Tensor::empty(s.y_shape(), {.dtype = DType::f64});
    cpu::conv_forward(y_ref, ref(x), ref(w), Tensor(), s);
    EXPECT_LE(rel_l2(y, y_ref), kTf32Tolerance) << c.name;
  }
  // FP32 mode takes it unless the policy says never; the mma.sync policy never does.
  const ConvShape s = make_conv_shape("test", {2, 32, 8, 8}, {32, 32, 3, 3}, {.padding = {1}});
  Tensor x = random({2, 32, 8, 8}, DType::f32, kGpu);
  EXPECT_TRUE(cuda::engine_conv_forward_uses_tma(s, x, Precision::TF32));
  EXPECT_TRUE(cuda::engine_conv_forward_uses_tma(s, x, Precision::FP32));
  EXPECT_FALSE(cuda::engine_conv_forward_uses_tma(s, x, Precision::FP32, {.fp32_tma = -1}));
  EXPECT_TRUE(cuda::engine_conv_grad_weight_uses_tma(s, Tensor::empty({32, 32, 3, 3}, {.device = kGpu}),
                                                     Precision::FP32, {.wgrad_columns = 1}));
  EXPECT_FALSE(cuda::engine_conv_grad_weight_uses_tma(s, Tensor::empty({32, 32, 3, 3}, {.device = kGpu}),
                                                      Precision::FP32, {.wgrad_columns = 1, .fp32_tma = -1}));
  EXPECT_FALSE(cuda::engine_conv_forward_uses_tma(s, x, Precision::TF32, {.arch = 80}));
  EXPECT_FALSE(cuda::engine_conv_forward_uses_tma(s, x, Precision::TF32, {.tile = 64}));
}

}  // namespace
