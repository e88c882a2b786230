// The engine's TMA convolution kernel in channel-quad mode (Im2colQuadBoxes in
// ops/cuda/gemm/im2col_boxes.cuh): few input channels (a forward's C, a stride-1 grad-input's
// dy channels), each k-tile 8 (tap, 4-channel quad) pairs. Against the f64 CPU reference at
// shapes that break its assumptions: 1, 2, 3, 5, 7 channels (NCHW pads them to 4 in the
// scratch), pair counts that leave most of the last k-tile past the reduction (1x1 with 3
// channels: one pair of eight), kernels larger than the input, strides past the kernel,
// dilations, 3-D volumes and one-image batches, 1 output channel and more than one tile of
// them. Outputs are NaN-poisoned first. Also: an infinite input reaches only the outputs whose
// windows hold it (the pairs past the reduction add exact zeros, never inf x 0), split
// reductions repeat bit for bit, and the policy switches the mode off and on. Needs an sm_90a
// GPU (H100 / H200); elsewhere the tests say so and skip.
#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/conv_tma_util.h"
#include "ops/cpu/conv.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::conv_tma;

namespace {

std::vector<ConvCase> few_channel_cases() {
  return {
      {"7x7 s2 p3 stem, 3 channels", {2, 3, 37, 41}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"3x3 p1, 1 channel", {3, 1, 19, 13}, {16, 1, 3, 3}, {.padding = {1}}},
      {"1x1, 3 channels (one pair of eight)", {2, 3, 9, 15}, {24, 3, 1, 1}, {}},
      {"3x3 p1, 4 channels (9 pairs: the second k-tile one real pair)", {2, 4, 11, 10}, {8, 4, 3, 3}, {.padding = {1}}},
      {"5x5 d2 p3 s2, 5 channels", {2, 5, 17, 14}, {12, 5, 5, 5}, {.stride = {2}, .padding = {3}, .dilation = {2}}},
      {"rect kernel, per-dim params, 7 channels", {1, 7, 16, 9}, {5, 7, 3, 1},
       {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 3}}},
      {"kernel past the input, padding 3, 2 channels", {2, 2, 3, 4}, {9, 2, 5, 5}, {.padding = {3}}},
      {"stride past the kernel, 12 channels", {2, 12, 20, 20}, {20, 12, 2, 2}, {.stride = {3}}},
      {"15 channels, 1 output channel", {2, 15, 12, 12}, {1, 15, 3, 3}, {.padding = {1}}},
      {"2 channels, 200 output channels, N = 1", {1, 2, 14, 9}, {200, 2, 3, 3}, {.padding = {1}}},
      {"NHWC 3x3 p1, 4 channels", {2, 9, 11, 4}, {20, 4, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"NHWC 7x7 s2 p3, 8 channels", {3, 23, 19, 8}, {64, 8, 7, 7}, {.stride = {2}, .padding = {3}, .layout = Layout::NHWC}},
      {"NHWC 5x5 s2 d2 p3, 12 channels", {2, 17, 13, 12}, {7, 12, 5, 5},
       {.stride = {2}, .padding = {3}, .dilation = {2}, .layout = Layout::NHWC}},
      {"3d 3x3x3 p1, 1 channel", {2, 1, 9, 10, 11}, {32, 1, 3, 3, 3}, {.padding = {1}}},
      {"3d s2 d2 p2, 3 channels", {2, 3, 9, 10, 11}, {24, 3, 3, 3, 3}, {.stride = {2}, .padding = {2}, .dilation = {2}}},
      {"3d anisotropic, 6 channels", {2, 6, 5, 9, 6}, {4, 6, 1, 3, 2}, {.stride = {1, 2, 1}, .padding = {0, 1, 1}, .dilation = {1, 1, 2}}},
  };
}

// The mode's correctness wherever it can run: tma_quads = 1 (the default takes it only where it
// pays: DefaultTakesItWhereItPays).
TEST(ConvTmaQuads, ForwardMatchesF64Reference) {
  TG_REQUIRE_TMA();
  for (const ConvCase& c : few_channel_cases()) expect_forward_on_tma(c, kTilingVariants, std::size(kTilingVariants), 1);
}

// tma_quads = 1 takes 16-31 channels too (instead of one 32-channel slice per tap, half zeros).
TEST(ConvTmaQuads, SixteenToThirtyOneChannelsOnRequest) {
  TG_REQUIRE_TMA();
  const ConvCase cases[] = {
      {"3x3 p1, 16 channels", {2, 16, 10, 9}, {24, 16, 3, 3}, {.padding = {1}}},
      {"5x5 p2, 31 channels (NCHW pads to 32)", {2, 31, 9, 12}, {40, 31, 5, 5}, {.padding = {2}}},
      {"NHWC 3x3 s2 p1, 20 channels", {2, 13, 10, 20}, {36, 20, 3, 3}, {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
  };
  for (const ConvCase& c : cases) expect_forward_on_tma(c, kTilingVariants, std::size(kTilingVariants), 1);
}

// Stride-1 grad-input runs as a forward over dy: few output channels make it a few-channel
// forward. (Few input channels go to the columns pass instead: dgrad_columns.cu.)
TEST(ConvTmaQuads, GradInputWithFewOutputChannels) {
  TG_REQUIRE_TMA();
  const ConvCase cases[] = {
      {"3x3 p1, 24 -> 3 channels", {2, 24, 11, 9}, {3, 24, 3, 3}, {.padding = {1}}},
      {"5x5 p2, 40 -> 1 channel", {2, 40, 8, 13}, {1, 40, 5, 5}, {.padding = {2}}},
      {"3d 3x3x3 p1, 20 -> 6 channels", {2, 20, 5, 6, 7}, {6, 20, 3, 3, 3}, {.padding = {1}}},
  };
  for (const ConvCase& c : cases) expect_grad_input_on_tma(c, kTilingVariants, std::size(kTilingVariants), /*tma_quads=*/1);
}

// One infinite input: exactly the outputs whose windows hold it are non-finite, as in the f64
// reference; every other output matches it. A pair past the reduction that kept a stale box
// (inf) instead of zeros would turn outputs elsewhere into NaN (inf x 0).
TEST(ConvTmaQuads, AnInfiniteInputReachesOnlyItsWindows) {
  TG_REQUIRE_TMA();
  const ConvCase cases[] = {
      {"3x3 p1, 3 channels", {2, 3, 12, 12}, {16, 3, 3, 3}, {.padding = {1}}},
      {"1x1, 1 channel", {2, 1, 16, 16}, {8, 1, 1, 1}, {}},
  };
  for (const ConvCase& c : cases) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    std::vector<float> xs = random(c.x, DType::f32).to_vector<float>();
    for (size_t i = 5; i < xs.size(); i += 97) xs[i] = std::numeric_limits<float>::infinity();
    Tensor x = from_vector(xs, c.x, {.dtype = DType::f32}).to(kGpu), w = random(c.w, DType::f32, kGpu);
    Tensor y_ref = Tensor::empty(s.y_shape(), {.dtype = DType::f64});
    cpu::conv_forward(y_ref, ref(x), ref(w), Tensor(), s);
    const std::vector<double> want = y_ref.to_vector<double>();
    for (Precision prec : kPrecisions)
      for (const Variant& v : kTilingVariants) {
        cuda::EnginePolicy policy = v.policy;
        policy.tma_quads = 1;
        Tensor y = Tensor::empty(s.y_shape(), {.device = kGpu});
        poison(y);
        cuda::engine_conv_forward(y, x, w, Tensor(), s, prec, policy);
        const std::vector<double> got = y.to_vector<double>();
        double num = 0, den = 0;
        int64_t finite = 0, mismatched = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::isfinite(want[i]) != std::isfinite(got[i])) ++mismatched;
          if (!std::isfinite(want[i]) || !std::isfinite(got[i])) continue;
          ++finite;
          num += (got[i] - want[i]) * (got[i] - want[i]);
          den += want[i] * want[i];
        }
        const std::string where = std::string(c.name) + ", " + name_of(prec) + ", " + v.name;
        EXPECT_EQ(mismatched, 0) << where;
        EXPECT_GT(finite, int64_t(got.size()) / 4) << where;  // the test still compares most outputs
        EXPECT_LE(std::sqrt(num / den), tolerance(prec)) << where;
      }
  }
}

TEST(ConvTmaQuads, SplitReductionsAreBitReproducible) {
  TG_REQUIRE_TMA();
  const ConvShape s = make_conv_shape("test", {2, 3, 30, 30}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}});
  Tensor x = random({2, 3, 30, 30}, DType::f32, kGpu), w = random({64, 3, 7, 7}, DType::f32, kGpu);
  for (int splits : {0, 3, 7}) {
    Tensor first = Tensor::empty(s.y_shape(), {.device = kGpu}), second = Tensor::empty(s.y_shape(), {.device = kGpu});
    poison(first);
    poison(second);
    cuda::engine_conv_forward(first, x, w, Tensor(), s, Precision::TF32, {.splits = splits, .tma_quads = 1});
    cuda::engine_conv_forward(second, x, w, Tensor(), s, Precision::TF32, {.splits = splits, .tma_quads = 1});
    EXPECT_EQ(first.to_vector<float>(), second.to_vector<float>()) << "splits " << splits;
  }
}

// By default the mode runs where padding the channels to 4 costs at most half as many k-tiles
// again as packing C x kvol densely (the cp.async kernels' form); FP32 takes it for 16-31.
TEST(ConvTmaQuads, DefaultTakesItWhereItPays) {
  TG_REQUIRE_TMA();
  struct Expectation {
    ConvCase c;
    bool tf32, fp32;
  };
  const Expectation cases[] = {
      {{"7x7 s2, 3 channels: 7 k-tiles against 5", {2, 3, 30, 30}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}}, true, true},
      {{"5x5, 8 channels: 7 against 7", {2, 8, 12, 12}, {32, 8, 5, 5}, {.padding = {2}}}, true, true},
      {{"3x3, 3 channels: 2 against 1", {2, 3, 12, 12}, {64, 3, 3, 3}, {.padding = {1}}}, false, false},
      {{"3x3x3, 1 channel: 4 against 1", {2, 1, 6, 6, 6}, {32, 1, 3, 3, 3}, {.padding = {1}}}, false, false},
  };
  for (const Expectation& e : cases) {
    const ConvShape s = make_conv_shape("test", e.c.x, e.c.w, e.c.p);
    Tensor x = random(e.c.x, DType::f32, kGpu);
    EXPECT_EQ(cuda::engine_conv_forward_uses_tma(s, x, Precision::TF32), e.tf32) << e.c.name;
    EXPECT_EQ(cuda::engine_conv_forward_uses_tma(s, x, Precision::FP32), e.fp32) << e.c.name;
    EXPECT_TRUE(cuda::engine_conv_forward_uses_tma(s, x, Precision::TF32, {.tma_quads = 1})) << e.c.name;
  }
}

// tma_quads = -1: fewer than 16 channels leave the TMA kernel (the cp.async kernels give the
// same answer); NHWC with a channel count that is not a multiple of 4 never reaches it.
TEST(ConvTmaQuads, PolicyAndLayoutLimits) {
  TG_REQUIRE_TMA();
  const ConvCase off{"8 channels, quads off", {2, 8, 9, 9}, {16, 8, 3, 3}, {.padding = {1}}};
  const ConvCase nhwc{"NHWC, 6 channels", {2, 7, 6, 6}, {8, 6, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}};
  const std::pair<const ConvCase*, cuda::EnginePolicy> elsewhere[] = {{&off, {.tma_quads = -1}}, {&nhwc, {}}};
  for (const auto& [c, policy] : elsewhere) {
    const ConvShape s = make_conv_shape("test", c->x, c->w, c->p);
    Tensor x = random(c->x, DType::f32, kGpu), w = random(c->w, DType::f32, kGpu);
    EXPECT_FALSE(cuda::engine_conv_forward_uses_tma(s, x, Precision::TF32, policy)) << c->name;
    Tensor y = Tensor::empty(s.y_shape(), {.device = kGpu});
    poison(y);
    cuda::engine_conv_forward(y, x, w, Tensor(), s, Precision::TF32, policy);
    Tensor y_ref = Tensor::empty(s.y_shape(), {.dtype = DType::f64});
    cpu::conv_forward(y_ref, ref(x), ref(w), Tensor(), s);
    EXPECT_LE(rel_l2(y, y_ref), kTf32Tolerance) << c->name;
  }
  const ConvShape s = make_conv_shape("test", off.x, off.w, off.p);
  Tensor x = random(off.x, DType::f32, kGpu);
  EXPECT_TRUE(cuda::engine_conv_forward_uses_tma(s, x, Precision::TF32));
  EXPECT_TRUE(cuda::engine_conv_forward_uses_tma(s, x, Precision::FP32));
  EXPECT_FALSE(cuda::engine_conv_forward_uses_tma(s, x, Precision::TF32, {.arch = 80}));
}

}  // namespace
