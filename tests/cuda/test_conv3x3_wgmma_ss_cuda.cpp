// The TF32 wgmma fast path with both operands in shared memory (ops/cuda/conv3x3/fprop_tf32_sm90.h):
// forward (with and without bias) and grad-input against the CPU reference in f64, at shapes
// that break every tile (block tile: 64 output channels x 2 rows x 256 columns, 8 input channels
// per stage: odd H, W around 128 and 256, C = 1, 3, 13, 64, 70, K = 1, 64, 65, 128, 200; pads 0
// to 3; W >> H; the staged stores' edges), outputs poisoned with NaN, the same bits on every run; exact one-hot cases whose
// failure message names the wrong (channel, row, column); argument checks; applies only in TF32
// on an H100 / H200. The launchers are called directly (the routing from conv3x3/dispatch.cu, its default
// in TF32 on Hopper, is checked in test_conv3x3_wgmma_cuda.cpp).
#include <string>

#include "common/conv3x3_cases.h"
#include "common/test_util.h"
#include "ops/conv.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/conv3x3/fprop_tf32_sm90.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::conv3x3;

namespace {

// Skips a test unless this GPU runs the wgmma kernels (an H100 / H200 with an sm_90a build).
#define REQUIRE_WGMMA_SS()                                                                                \
  do {                                                                                                    \
    TG_REQUIRE_GPU();                                                                                     \
    PrecisionGuard tf32_(Precision::TF32);                                                                \
    if (!cuda::conv3x3_wgmma_ss_applies(shape_of({1, 1, 4, 4, 1, 0, 0}), kGpu))                            \
      GTEST_SKIP() << "no wgmma path on this GPU / build (needs compute capability 9.0 and sm_90a code)"; \
  } while (0)

// TF32 with truncated activations: ~4.6e-4 expected (rounded weights, truncated inputs).
constexpr double kTolerance = 1e-3;

void check_forward(const Case& c, bool with_bias) {
  SCOPED_TRACE(name(c) + (with_bias ? " bias" : " no bias"));
  PrecisionGuard guard(Precision::TF32);
  const ConvShape s = shape_of(c);
  ASSERT_TRUE(cuda::conv3x3_wgmma_ss_applies(s, kGpu));
  Tensor x = random(s.x_shape(), f32), w = random(s.w_shape(), f32);
  Tensor b = with_bias ? random({c.K}, f32) : Tensor();
  Tensor want = Tensor::empty(s.y_shape(), {.dtype = f64});
  cpu::conv_forward(want, x.to(f64), w.to(f64), with_bias ? b.to(f64) : Tensor(), s);
  Tensor gx = x.to(kGpu), gw = w.to(kGpu), gb = with_bias ? b.to(kGpu) : Tensor();
  Tensor y = run_twice(s.y_shape(), [&](const Tensor& out) { cuda::conv3x3_wgmma_ss_forward(out, gx, gw, gb, s); });
  EXPECT_LE(rel_l2(y, want), kTolerance) << "forward";
}

void check_grad_input(const Case& c) {
  SCOPED_TRACE(name(c));
  PrecisionGuard guard(Precision::TF32);
  const ConvShape s = shape_of(c);
  ASSERT_TRUE(cuda::conv3x3_wgmma_ss_applies(s, kGpu));
  Tensor dy = random(s.y_shape(), f32), w = random(s.w_shape(), f32);
  Tensor want = Tensor::empty(s.x_shape(), {.dtype = f64});
  cpu::conv_grad_input(want, dy.to(f64), w.to(f64), s);
  Tensor gdy = dy.to(kGpu), gw = w.to(kGpu);
  Tensor dx = run_twice(s.x_shape(), [&](const Tensor& out) { cuda::conv3x3_wgmma_ss_grad_input(out, gdy, gw, s); });
  EXPECT_LE(rel_l2(dx, want), kTolerance) << "grad_input";
}

// Odd output widths take the one-column stores, even ones the two-column stores.
const std::vector<Case> kCases = {
    {1, 13, 7, 21, 9, 1, 1},      // two channel chunks, the last partial; odd W, odd H
    {2, 3, 6, 18, 130, 0, 2},     // C = 3; three output-channel tiles, the last with 2; asymmetric pad
    {1, 9, 5, 300, 70, 2, 0},     // two column tiles (256 + 46); K = 70: two channel tiles; pad 2
    {1, 1, 4, 8, 1, 0, 0},        // C = 1, K = 1, N = 1
    {1, 16, 9, 12, 64, 1, 1},     // exactly 64 output channels, two full chunks
    {3, 70, 11, 37, 5, 1, 0},     // nine chunks; grad-input: 70 output channels (two tiles)
    {1, 5, 4, 9, 7, 3, 3},        // pad 3: border outputs see only padding; grad-input pad -1
    {1, 24, 5, 20, 200, 2, 1},    // K = 200: four channel tiles, the last with 8
    {1, 64, 5, 1030, 128, 0, 0},  // W >> H, workload A's channels: 5 column tiles (grad-input: 16 chunks)
    {2, 64, 3, 259, 65, 1, 1},    // C = 64, K = 65; Wo = 259: one column past a tile (odd: one-column stores)
    {1, 3, 9, 258, 64, 0, 1},     // C = 3; Wo = 258: two columns past a tile (two-column stores)
};

// The SS forward launcher in the shape expect_forward_one_hot_exact calls (no bias).
void ss_forward(const Tensor& y, const Tensor& x, const Tensor& w, const ConvShape& s) {
  cuda::conv3x3_wgmma_ss_forward(y, x, w, Tensor(), s);
}
// The grad-input launcher in the shape expect_grad_input_one_hot_exact calls (the precision in force).
void ss_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s) {
  cuda::conv3x3_wgmma_ss_grad_input(dx, dy, w, s);
}

}  // namespace

TEST(CudaConv3x3WgmmaSs, AppliesOnlyInTf32OnHopperWithSm90aCode) {
  TG_REQUIRE_GPU();
  const ConvShape s = shape_of({1, 8, 9, 9, 8, 1, 1});
  {
    PrecisionGuard guard(Precision::FP32);
    EXPECT_FALSE(cuda::conv3x3_wgmma_ss_applies(s, kGpu)) << "FP32 mode is not offered (truncated activations)";
  }
  PrecisionGuard guard(Precision::TF32);
  EXPECT_FALSE(cuda::conv3x3_wgmma_ss_applies(s, Device::cpu()));
  const ConvShape strided = make_conv_shape("test", {1, 8, 9, 9}, {8, 8, 3, 3}, ConvParams{.stride = {2}});
  EXPECT_FALSE(cuda::conv3x3_wgmma_ss_applies(strided, kGpu));
  const ConvShape five = make_conv_shape("test", {1, 8, 9, 9}, {8, 8, 5, 5}, ConvParams{.padding = {2}});
  EXPECT_FALSE(cuda::conv3x3_wgmma_ss_applies(five, kGpu));
  // On an H100 / H200 the project's default build (sm_90a) must offer this path: a failure here
  // means the build lacks sm_90a code or the probe is wrong.
  if (is_hopper()) EXPECT_TRUE(cuda::conv3x3_wgmma_ss_applies(s, kGpu)) << "compute capability 9.0 but no SS path";
  else EXPECT_FALSE(cuda::conv3x3_wgmma_ss_applies(s, kGpu)) << "SS path claimed on a non-Hopper GPU";
}

TEST(CudaConv3x3WgmmaSs, ForwardOneHotIsExact) {
  REQUIRE_WGMMA_SS();
  PrecisionGuard guard(Precision::TF32);
  // One tile (K = 16, one chunk); two channel tiles and a partial chunk; two column tiles with
  // an odd number of rows and pad 2 on the columns.
  for (const Case& c : {Case{1, 8, 4, 16, 16, 1, 1}, Case{1, 13, 3, 64, 72, 1, 1}, Case{1, 9, 5, 270, 64, 0, 2}}) {
    SCOPED_TRACE(name(c));
    expect_forward_one_hot_exact(c, ss_forward);
  }
}

TEST(CudaConv3x3WgmmaSs, GradInputOneHotIsExact) {
  REQUIRE_WGMMA_SS();
  PrecisionGuard guard(Precision::TF32);
  for (const Case& c : {Case{1, 16, 4, 16, 8, 1, 1}, Case{1, 128, 4, 126, 8, 0, 0}, Case{1, 72, 5, 300, 13, 2, 0}}) {
    SCOPED_TRACE(name(c));
    expect_grad_input_one_hot_exact(c, ss_grad_input);
  }
}

TEST(CudaConv3x3WgmmaSs, ForwardMatchesReference) {
  REQUIRE_WGMMA_SS();
  for (const Case& c : kCases) {
    check_forward(c, /*with_bias=*/false);
    check_forward(c, /*with_bias=*/true);
  }
}

TEST(CudaConv3x3WgmmaSs, GradInputMatchesReference) {
  REQUIRE_WGMMA_SS();
  for (const Case& c : kCases) check_grad_input(c);
}

// The halo fill at every column alignment: W % 4 == 0..3 (each halo row starts at its own offset
// from a 16-byte boundary), pads 0 to 3 (grad-input pad -1), partial last chunks (channels past
// Cin), several column tiles, 25 chunks, K = 9, 65, 70, 128, 200.
const std::vector<Case> kAlignmentCases = {
    {1, 64, 4, 1024, 128, 0, 0},  // workload A's rows: forward W % 4 == 0; grad-input dy 2 x 1022
    {1, 9, 4, 301, 70, 1, 2},     // W % 4 == 1, pads 1 / 2, two column tiles; grad-input dy 4 x 303
    {2, 13, 4, 263, 65, 2, 1},    // W % 4 == 3, K = 65, two images (grad-input: dy 6 x 263)
    {1, 16, 8, 515, 128, 1, 3},   // pad 3 on the columns, three column tiles; grad-input pad -1, dy 8 x 519
    {1, 200, 2, 12, 9, 1, 1},     // 25 chunks (the last partial), tiny image
    {1, 24, 4, 20, 200, 2, 1},    // K = 200: four channel tiles (grad-input: 25 chunks over dy 6 x 20)
};

TEST(CudaConv3x3WgmmaSs, AlignmentsMatchReference) {
  REQUIRE_WGMMA_SS();
  for (const Case& c : kAlignmentCases) {
    check_forward(c, /*with_bias=*/c.K % 2 == 1);
    check_grad_input(c);
  }
}

TEST(CudaConv3x3WgmmaSs, AlignmentsOneHotAreExact) {
  REQUIRE_WGMMA_SS();
  PrecisionGuard guard(Precision::TF32);
  for (const Case& c : {Case{1, 9, 4, 301, 70, 1, 2}, Case{1, 16, 8, 515, 128, 1, 3}, Case{1, 64, 4, 1024, 128, 0, 0}}) {
    SCOPED_TRACE(name(c));
    expect_forward_one_hot_exact(c, ss_forward);
    expect_grad_input_one_hot_exact(c, ss_grad_input);
  }
}

// The staged stores (Wout even, output 8-byte aligned) against the per-float stores (odd Wout),
// at their edges: output channels past Kout inside a staging round (K = 5, 13, 70), a last row
// past Hout (odd Ho), columns ending inside the first or the second 128-column half of a tile,
// at its end, or 2 columns into the next (Wo = 100, 130, 256, 386; 385 takes the per-float
// stores), bias per channel; grad-input the same for dx (C = 3 .. 8 output channels).
TEST(CudaConv3x3WgmmaSs, StagedStoresMatchReferenceAtTheEdges) {
  REQUIRE_WGMMA_SS();
  for (const Case& c : {Case{1, 5, 5, 100, 13, 1, 1}, Case{1, 8, 3, 130, 70, 1, 1}, Case{2, 3, 6, 258, 5, 0, 0},
                        Case{1, 4, 4, 386, 9, 1, 1}, Case{1, 4, 4, 385, 9, 1, 1}}) {
    check_forward(c, /*with_bias=*/true);
    check_grad_input(c);
  }
}

TEST(CudaConv3x3WgmmaSs, ManyTilesPerBlockMatchReference) {
  REQUIRE_WGMMA_SS();
  // More tiles than SMs: every block runs several tiles back to back (the pipeline crosses
  // tile boundaries, the next tile's first wgmma overwrites the accumulators).
  const Case c{4, 19, 67, 300, 96, 1, 1};
  check_forward(c, /*with_bias=*/true);
  check_grad_input(c);
}

TEST(CudaConv3x3WgmmaSs, RejectsWhatItDoesNotTake) {
  REQUIRE_WGMMA_SS();
  const ConvShape s = shape_of({1, 3, 7, 9, 4, 1, 1});
  Tensor x = random(s.x_shape(), f32, kGpu), w = random(s.w_shape(), f32, kGpu);
  {
    PrecisionGuard guard(Precision::FP32);
    Tensor y = poisoned(s.y_shape());
    TG_EXPECT_ERROR(cuda::conv3x3_wgmma_ss_forward(y, x, w, Tensor(), s), "conv3x3_wgmma_ss_forward", "TF32");
  }
  PrecisionGuard guard(Precision::TF32);
  Tensor wrong = Tensor::empty({1, 4, 7, 8}, {.dtype = f32, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_ss_forward(wrong, x, w, Tensor(), s), "conv3x3_wgmma_ss_forward",
                  "does not match");
  Tensor y64 = Tensor::empty(s.y_shape(), {.dtype = f64, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_ss_forward(y64, x, w, Tensor(), s), "conv3x3_wgmma_ss_forward", "f32");
  Tensor y = poisoned(s.y_shape());
  Tensor bad_bias = random({5}, f32, kGpu);
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_ss_forward(y, x, w, bad_bias, s), "conv3x3_wgmma_ss_forward", "does not match");
  Tensor dy = random(s.y_shape(), f32, kGpu);
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_ss_grad_input(wrong, dy, w, s), "conv3x3_wgmma_ss_grad_input", "does not match");
  const ConvShape strided = make_conv_shape("test", {1, 3, 7, 9}, {4, 3, 3, 3}, ConvParams{.stride = {2}});
  Tensor ys = Tensor::empty(strided.y_shape(), {.dtype = f32, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_ss_forward(ys, x, w, Tensor(), strided), "conv3x3_wgmma_ss_forward",
                  "3x3 stride-1");
}
