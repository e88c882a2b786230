// The wgmma fast path for 3x3 stride-1 NCHW convolutions (ops/cuda/conv3x3/fprop_sm90.h), in TF32
// and in FP32 mode (split products): forward (with and without bias) and grad-input against the
// CPU reference in f64 (TF32 at 1e-3, FP32 at 1e-5 rel. L2), at shapes that break every tile
// (odd H, W, C, K; C = 1, K = 1, N = 1; W >> H; pads 0 to 3; K = 64, 128, 200 in TF32), outputs
// poisoned with NaN, the same bits on every run; exact one-hot cases whose failure message names
// the wrong (channel, row, column); the longest FP32 chains (128 channels each way); that the
// public conv3x3 launchers take this path on an H100 / H200; argument checks. On other GPUs the
// launchers' tests are skipped.
#include <string>

#include "common/conv3x3_cases.h"
#include "common/test_util.h"
#include "ops/conv.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv3x3/fprop_sm90.h"
#include "ops/cuda/conv3x3/fprop_tf32_sm90.h"
#include "ops/cuda/policy.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::conv3x3;

namespace {

// Skips a test unless this GPU runs the wgmma kernels (an H100 / H200 with an sm_90a build).
#define REQUIRE_WGMMA()                                                                                   \
  do {                                                                                                    \
    TG_REQUIRE_GPU();                                                                                     \
    PrecisionGuard tf32_(Precision::TF32);                                                                \
    if (!cuda::conv3x3_wgmma_applies(shape_of({1, 1, 4, 4, 1, 0, 0}), kGpu))                               \
      GTEST_SKIP() << "no wgmma path on this GPU / build (needs compute capability 9.0 and sm_90a code)"; \
  } while (0)

double tolerance(Precision p) { return p == Precision::TF32 ? 1e-3 : 1e-5; }
const char* mode(Precision p) { return p == Precision::TF32 ? " TF32" : " FP32"; }
constexpr Precision kModes[] = {Precision::TF32, Precision::FP32};
constexpr int64_t kMaxFp32Channels = 128;  // conv3x3_applies: longer truncating chains stay off FP32
bool runs_in(const Case& c, Precision p) {
  return p == Precision::TF32 || (c.C <= kMaxFp32Channels && c.K <= kMaxFp32Channels);
}

void check_forward(const Case& c, bool with_bias, Precision prec) {
  SCOPED_TRACE(name(c) + (with_bias ? " bias" : " no bias") + mode(prec));
  PrecisionGuard guard(prec);
  const ConvShape s = shape_of(c);
  ASSERT_TRUE(cuda::conv3x3_wgmma_applies(s, kGpu));
  Tensor x = random(s.x_shape(), f32), w = random(s.w_shape(), f32);
  Tensor b = with_bias ? random({c.K}, f32) : Tensor();
  Tensor want = Tensor::empty(s.y_shape(), {.dtype = f64});
  cpu::conv_forward(want, x.to(f64), w.to(f64), with_bias ? b.to(f64) : Tensor(), s);
  Tensor gx = x.to(kGpu), gw = w.to(kGpu), gb = with_bias ? b.to(kGpu) : Tensor();
  Tensor y = run_twice(s.y_shape(), [&](const Tensor& out) { cuda::conv3x3_wgmma_forward(out, gx, gw, gb, s); });
  EXPECT_LE(rel_l2(y, want), tolerance(prec)) << "forward";
}

void check_grad_input(const Case& c, Precision prec) {
  SCOPED_TRACE(name(c) + mode(prec));
  PrecisionGuard guard(prec);
  const ConvShape s = shape_of(c);
  ASSERT_TRUE(cuda::conv3x3_wgmma_applies(s, kGpu));
  Tensor dy = random(s.y_shape(), f32), w = random(s.w_shape(), f32);
  Tensor want = Tensor::empty(s.x_shape(), {.dtype = f64});
  cpu::conv_grad_input(want, dy.to(f64), w.to(f64), s);
  Tensor gdy = dy.to(kGpu), gw = w.to(kGpu);
  Tensor dx = run_twice(s.x_shape(), [&](const Tensor& out) { cuda::conv3x3_wgmma_grad_input(out, gdy, gw, s); });
  EXPECT_LE(rel_l2(dx, want), tolerance(prec)) << "grad_input";
}

// Block tiles: TF32 2 x 128 pixels x 128 channels (more than 64 output channels) or 4 x 128 x 64;
// FP32 2 x 128 x 64; 8 input channels per stage; grad-input swaps the channel counts. Odd W means 4-byte copies,
// W = 2 (mod 4) 8-byte ones, W = 0 (mod 4) 16-byte ones.
const std::vector<Case> kCases = {
    {1, 13, 7, 21, 9, 1, 1},      // two channel chunks, the last partial; odd W
    {2, 3, 6, 18, 130, 0, 2},     // two output-channel tiles, the last with 2; asymmetric pad
    {1, 9, 5, 136, 70, 2, 0},     // the wide tile just past 64 channels; two column tiles; pad 2
    {1, 1, 4, 8, 1, 0, 0},        // C = 1, K = 1, N = 1
    {1, 16, 9, 12, 64, 1, 1},     // exactly 64 output channels (narrow), two full chunks
    {3, 70, 11, 37, 5, 1, 0},     // grad-input through the wide tile (70 input channels)
    {1, 5, 4, 9, 7, 3, 3},        // pad 3: border outputs see only padding; grad-input pad -1
    {1, 24, 5, 20, 200, 2, 1},    // K = 200: two 128-channel tiles, the second with 72
    {1, 64, 5, 1030, 128, 0, 0},  // W >> H, workload A's channels (grad-input: narrow, 16 chunks)
    {2, 128, 3, 130, 64, 1, 1},   // C = 128 -> K = 64: grad-input through the wide tile, 16 chunks
};

// The register-A forward launcher in the shape expect_forward_one_hot_exact calls (no bias).
void wgmma_forward(const Tensor& y, const Tensor& x, const Tensor& w, const ConvShape& s) {
  cuda::conv3x3_wgmma_forward(y, x, w, Tensor(), s);
}
// The grad-input launcher in the shape expect_grad_input_one_hot_exact calls (the precision in force).
void wgmma_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s) {
  cuda::conv3x3_wgmma_grad_input(dx, dy, w, s);
}

}  // namespace

TEST(CudaConv3x3Wgmma, AppliesInBothPrecisionsOnHopperWithSm90aCode) {
  TG_REQUIRE_GPU();
  const ConvShape s = shape_of({1, 8, 9, 9, 8, 1, 1});
  const ConvShape wide = shape_of({1, 8, 9, 9, 130, 1, 1});
  for (Precision prec : kModes) {
    SCOPED_TRACE(mode(prec));
    PrecisionGuard guard(prec);
    EXPECT_FALSE(cuda::conv3x3_wgmma_applies(s, Device::cpu()));
    const ConvShape strided = make_conv_shape("test", {1, 8, 9, 9}, {8, 8, 3, 3}, ConvParams{.stride = {2}});
    EXPECT_FALSE(cuda::conv3x3_wgmma_applies(strided, kGpu));
    // On an H100 / H200 the project's default build (sm_90a) must take the wgmma path: a
    // failure here means the build lacks sm_90a code or the probe is wrong.
    if (is_hopper()) EXPECT_TRUE(cuda::conv3x3_wgmma_applies(s, kGpu)) << "compute capability 9.0 but no wgmma path";
    else EXPECT_FALSE(cuda::conv3x3_wgmma_applies(s, kGpu)) << "wgmma path claimed on a non-Hopper GPU";
    // FP32 mode takes at most 128 channels each way (as conv3x3_applies): longer chains of
    // truncating tensor-core sums would approach the 1e-5 tolerance.
    if (is_hopper()) {
      EXPECT_EQ(cuda::conv3x3_wgmma_applies(wide, kGpu), prec == Precision::TF32);
    }
  }
}

TEST(CudaConv3x3Wgmma, ForwardOneHotIsExact) {
  REQUIRE_WGMMA();
  // Single tiles: narrow (K = 16 <= 64) and wide (K = 128); one chunk of 8 channels, and 13.
  // FP32 mode (split tile, 64 channels): the low parts are all 0, the result exact likewise.
  for (Precision prec : kModes)
    for (const Case& c : {Case{1, 8, 4, 16, 16, 1, 1}, Case{1, 8, 2, 128, 128, 1, 1}, Case{1, 13, 5, 40, 72, 0, 2}}) {
      SCOPED_TRACE(name(c) + mode(prec));
      PrecisionGuard guard(prec);
      expect_forward_one_hot_exact(c, wgmma_forward);
    }
}

TEST(CudaConv3x3Wgmma, GradInputOneHotIsExact) {
  REQUIRE_WGMMA();
  for (Precision prec : kModes)
    for (const Case& c : {Case{1, 16, 4, 16, 8, 1, 1}, Case{1, 128, 4, 126, 8, 0, 0}, Case{1, 72, 5, 40, 13, 2, 0}}) {
      SCOPED_TRACE(name(c) + mode(prec));
      PrecisionGuard guard(prec);
      expect_grad_input_one_hot_exact(c, wgmma_grad_input);
    }
}

TEST(CudaConv3x3Wgmma, ForwardMatchesReference) {
  REQUIRE_WGMMA();
  for (Precision prec : kModes)
    for (const Case& c : kCases) {
      if (!runs_in(c, prec)) continue;
      check_forward(c, /*with_bias=*/false, prec);
      check_forward(c, /*with_bias=*/true, prec);
    }
}

TEST(CudaConv3x3Wgmma, GradInputMatchesReference) {
  REQUIRE_WGMMA();
  for (Precision prec : kModes)
    for (const Case& c : kCases)
      if (runs_in(c, prec)) check_grad_input(c, prec);
}

// The staged stores (even Wo, output 8-byte aligned: rounds of 32 channels through shared
// memory, 64 pixels per store instruction) at their edges, both precisions and every tile:
// channels past Kout inside a round (K = 13, 70, 40), output rows past Hout (odd Ho), columns
// ending inside an m64 tile or exactly at one (Wo = 100, 130, 64), bias per channel; grad-input
// the same for dx. Odd Wo (the per-float stores) is covered by the cases above.
TEST(CudaConv3x3Wgmma, StagedStoresMatchReferenceAtTheEdges) {
  REQUIRE_WGMMA();
  for (Precision prec : kModes)
    for (const Case& c : {Case{1, 5, 5, 100, 13, 1, 1}, Case{1, 8, 3, 130, 70, 1, 1}, Case{1, 4, 5, 66, 9, 0, 0},
                          Case{2, 3, 7, 200, 40, 1, 1}}) {
      if (!runs_in(c, prec)) continue;
      check_forward(c, /*with_bias=*/true, prec);
      check_grad_input(c, prec);
    }
}

TEST(CudaConv3x3Wgmma, Fp32LongestChainsStayAccurate) {
  REQUIRE_WGMMA();
  // 128 input channels: 144 truncating tensor-core sums in the hi*hi' chain of each output (the
  // cross terms have their own accumulator); 128 output channels = 2 tiles of 64.
  const Case c{2, 128, 6, 45, 128, 1, 1};
  check_forward(c, /*with_bias=*/true, Precision::FP32);
  check_grad_input(c, Precision::FP32);
}

TEST(CudaConv3x3Wgmma, ManyTilesPerBlockMatchReference) {
  REQUIRE_WGMMA();
  // More tiles than SMs: every block runs several tiles back to back (the pipeline crosses
  // tile boundaries, the next tile's first wgmma overwrites the accumulators).
  const Case c{4, 19, 67, 300, 96, 1, 1};
  for (Precision prec : kModes) {
    check_forward(c, /*with_bias=*/true, prec);
    check_grad_input(c, prec);
  }
}

TEST(CudaConv3x3Wgmma, PublicLaunchersTakeTheWgmmaPath) {
  REQUIRE_WGMMA();
  // conv3x3_forward / conv3x3_grad_input route to a wgmma kernel in both modes: the same bits as
  // calling its launchers directly. TF32 takes the shared-memory-operand kernel
  // (conv3x3_wgmma_ss) unless KernelPolicy::conv3x3 asks for the register-A one (this one);
  // FP32 always this one.
  using Data = cuda::Conv3x3Policy::Data;
  for (Precision prec : kModes) {
    for (Data data : {Data::Auto, Data::RegisterA}) {
      SCOPED_TRACE(::testing::Message() << mode(prec) << (data == Data::Auto ? " default policy" : " register-A"));
      PrecisionGuard guard(prec);
      cuda::KernelPolicy kernels = cuda::kernel_policy();
      kernels.conv3x3.data = data;
      cuda::KernelPolicyGuard policy(kernels);
      const Case c{1, 13, 7, 21, 70, 1, 1};
      const ConvShape s = shape_of(c);
      ASSERT_EQ(cuda::conv3x3_wgmma_ss_applies(s, kGpu), prec == Precision::TF32);
      const bool ss = prec == Precision::TF32 && data == Data::Auto;
      Tensor x = random(s.x_shape(), f32, kGpu), w = random(s.w_shape(), f32, kGpu), b = random({c.K}, f32, kGpu);
      Tensor direct = poisoned(s.y_shape()), routed = poisoned(s.y_shape());
      if (ss) cuda::conv3x3_wgmma_ss_forward(direct, x, w, b, s);
      else cuda::conv3x3_wgmma_forward(direct, x, w, b, s);
      cuda::conv3x3_forward(routed, x, w, b, s);
      EXPECT_EQ(direct.to_vector<float>(), routed.to_vector<float>());
      Tensor dy = random(s.y_shape(), f32, kGpu);
      Tensor dx_direct = poisoned(s.x_shape()), dx_routed = poisoned(s.x_shape());
      if (ss) cuda::conv3x3_wgmma_ss_grad_input(dx_direct, dy, w, s);
      else cuda::conv3x3_wgmma_grad_input(dx_direct, dy, w, s);
      cuda::conv3x3_grad_input(dx_routed, dy, w, s);
      EXPECT_EQ(dx_direct.to_vector<float>(), dx_routed.to_vector<float>());
    }
  }
}

TEST(CudaConv3x3Wgmma, RejectsWhatItDoesNotTake) {
  REQUIRE_WGMMA();
  const ConvShape s = shape_of({1, 3, 7, 9, 4, 1, 1});
  Tensor x = random(s.x_shape(), f32, kGpu), w = random(s.w_shape(), f32, kGpu);
  {
    PrecisionGuard guard(Precision::FP32);
    const ConvShape wide = shape_of({1, 3, 7, 9, 130, 1, 1});
    Tensor ww = random(wide.w_shape(), f32, kGpu), y = poisoned(wide.y_shape());
    TG_EXPECT_ERROR(cuda::conv3x3_wgmma_forward(y, x, ww, Tensor(), wide), "conv3x3_wgmma_forward", "128 channels");
  }
  PrecisionGuard guard(Precision::TF32);
  Tensor wrong = Tensor::empty({1, 4, 7, 8}, {.dtype = f32, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_forward(wrong, x, w, Tensor(), s), "conv3x3_wgmma_forward", "does not match");
  Tensor y64 = Tensor::empty(s.y_shape(), {.dtype = f64, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_forward(y64, x, w, Tensor(), s), "conv3x3_wgmma_forward", "f32");
  Tensor dy = random(s.y_shape(), f32, kGpu);
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_grad_input(wrong, dy, w, s), "conv3x3_wgmma_grad_input", "does not match");
  const ConvShape strided = make_conv_shape("test", {1, 3, 7, 9}, {4, 3, 3, 3}, ConvParams{.stride = {2}});
  Tensor ys = Tensor::empty(strided.y_shape(), {.dtype = f32, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_forward(ys, x, w, Tensor(), strided), "conv3x3_wgmma_forward", "3x3 stride-1");
}
