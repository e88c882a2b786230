// The TF32 wgmma grad-weight (ops/cuda/conv3x3/wgrad_tf32_sm90.h) against the CPU reference in f64, at
// shapes that break every tile (block: 64 output channels x 64 input channels x 9 taps, strips of
// 32 output columns, slices of output rows that cross images and strips: odd H and W, W >> H,
// C = 1, 3, 70, K = 1, 65, 130; pads 0 to 2; widths not a multiple of 4, so rows start off 16-byte
// boundaries), dw poisoned with NaN, the same bits on every run; exact cases with integer inputs
// (one-hot dy, then small integers everywhere) whose failure message names the wrong (k, c, tap);
// argument checks; applies only in TF32 on an H100 / H200; conv3x3_grad_weight and the tape's
// conv2d backward route here (the same bits as the direct call). Tensors off 16-byte boundaries
// (4-byte copies for every row) are covered by the host emulation only: no test helper makes them.
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "common/conv3x3_cases.h"
#include "common/test_util.h"
#include "ops/conv.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv3x3/wgrad_tf32_sm90.h"
#include "ops/cuda/policy.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::conv3x3;

namespace {

// Skips a test unless this GPU runs the wgmma kernels (an H100 / H200 with an sm_90a build).
#define REQUIRE_WGMMA_DW()                                                                                \
  do {                                                                                                    \
    TG_REQUIRE_GPU();                                                                                     \
    PrecisionGuard tf32_(Precision::TF32);                                                                \
    if (!cuda::conv3x3_wgmma_dw_applies(shape_of({1, 1, 4, 4, 1, 0, 0}), kGpu))                            \
      GTEST_SKIP() << "no wgmma path on this GPU / build (needs compute capability 9.0 and sm_90a code)"; \
  } while (0)

// TF32, dy rounded and x truncated: ~4.2e-4 expected (host emulation of the kernel; without the
// rounding pass, kRoundDy = false in conv3x3/wgrad_tf32_sm90.cu, ~7e-4).
constexpr double kTolerance = 1e-3;

void check_grad_weight(const Case& c) {
  SCOPED_TRACE(name(c));
  PrecisionGuard guard(Precision::TF32);
  const ConvShape s = shape_of(c);
  ASSERT_TRUE(cuda::conv3x3_wgmma_dw_applies(s, kGpu));
  Tensor dy = random(s.y_shape(), f32), x = random(s.x_shape(), f32);
  Tensor want = Tensor::empty(s.w_shape(), {.dtype = f64});
  cpu::conv_grad_weight(want, dy.to(f64), x.to(f64), s);
  Tensor gdy = dy.to(kGpu), gx = x.to(kGpu);
  Tensor dw = run_twice(s.w_shape(), [&](const Tensor& out) { cuda::conv3x3_wgmma_grad_weight(out, gdy, gx, s); });
  EXPECT_LE(rel_l2(dw, want), kTolerance) << "grad_weight";
}

// The first element of dw (K, C, 3, 3) that differs, by (k, c, r, s).
void expect_dw_exact(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  const int64_t C = want.shape()[1];
  for (size_t i = 0; i < w.size(); ++i) {
    if (g[i] == w[i]) continue;
    const int64_t tap = i % 9, ch = i / 9 % C, k = i / (9 * C);
    ADD_FAILURE() << "grad_weight: first mismatch at (k " << k << ", c " << ch << ", r " << tap / 3 << ", s "
                  << tap % 3 << "): got " << g[i] << ", want " << w[i];
    return;
  }
}

// dy one-hot per output channel (channel k has one 1 at a pixel that depends on k), x small
// integers: dw[k][c][r][s] is a single x value, exact in TF32, so the GPU must match bit for bit
// and a wrong shift, tap row, channel or pixel mapping shows up as the first wrong element.
void expect_one_hot_dy_exact(const Case& c) {
  SCOPED_TRACE(name(c));
  const ConvShape s = shape_of(c);
  const Shape ys = s.y_shape();  // (N, K, Ho, Wo)
  const int64_t Ho = ys[2], Wo = ys[3];
  std::vector<float> dyv(ys.numel(), 0.f);
  for (int64_t k = 0; k < c.K; ++k) {
    const int64_t n = k % c.N, p = (k * 5) % Ho, q = (k * 7 + 3) % Wo;
    dyv[((n * c.K + k) * Ho + p) * Wo + q] = 1.f;
  }
  Tensor dy = from_vector(dyv, ys), x = small_integers(s.x_shape());
  Tensor want = Tensor::empty(s.w_shape(), {.dtype = f64});
  cpu::conv_grad_weight(want, dy.to(f64), x.to(f64), s);
  Tensor dw = poisoned(s.w_shape());
  cuda::conv3x3_wgmma_grad_weight(dw, dy.to(kGpu), x.to(kGpu), s);
  expect_dw_exact(dw, want);
}

// Small integers in both (|v| <= 30, sums far below 2^24): every product and partial sum is exact.
void expect_small_integers_exact(const Case& c) {
  SCOPED_TRACE(name(c));
  const ConvShape s = shape_of(c);
  Tensor dy = small_integers(s.y_shape()), x = small_integers(s.x_shape());
  Tensor want = Tensor::empty(s.w_shape(), {.dtype = f64});
  cpu::conv_grad_weight(want, dy.to(f64), x.to(f64), s);
  Tensor dw = poisoned(s.w_shape());
  cuda::conv3x3_wgmma_grad_weight(dw, dy.to(kGpu), x.to(kGpu), s);
  expect_dw_exact(dw, want);
}

const std::vector<Case> kCases = {
    {1, 13, 7, 21, 9, 1, 1},      // every tile partial; odd H and W
    {1, 1, 4, 8, 1, 0, 0},        // C = 1, K = 1, N = 1
    {2, 70, 6, 37, 65, 0, 2},     // C = 70, K = 65: 2 x 2 tiles; asymmetric pad; 2 strips
    {1, 5, 3, 41, 7, 0, 0},       // Ho = 1: every segment one row; W % 4 == 1
    {1, 5, 4, 9, 7, 2, 2},        // pad 2: border rows and columns see only padding
    {1, 64, 3, 1030, 128, 0, 0},  // W >> H, workload A's channels; W % 4 == 2 (rows 8 bytes off)
    {3, 9, 11, 35, 20, 1, 0},     // slices cross images; W % 4 == 3
    {2, 3, 9, 66, 130, 1, 1},     // K = 130: 3 k tiles, the last with 2; 3 strips (32 + 32 + 2)
    {4, 19, 67, 300, 96, 1, 1},   // many slices and segments per block
};

}  // namespace

TEST(CudaConv3x3WgmmaDw, AppliesOnlyInTf32OnHopperWithSm90aCode) {
  TG_REQUIRE_GPU();
  const ConvShape s = shape_of({1, 8, 9, 9, 8, 1, 1});
  {
    PrecisionGuard guard(Precision::FP32);
    EXPECT_FALSE(cuda::conv3x3_wgmma_dw_applies(s, kGpu)) << "FP32 mode is not offered (TF32 products)";
  }
  PrecisionGuard guard(Precision::TF32);
  EXPECT_FALSE(cuda::conv3x3_wgmma_dw_applies(s, Device::cpu()));
  const ConvShape strided = make_conv_shape("test", {1, 8, 9, 9}, {8, 8, 3, 3}, ConvParams{.stride = {2}});
  EXPECT_FALSE(cuda::conv3x3_wgmma_dw_applies(strided, kGpu));
  if (is_hopper()) EXPECT_TRUE(cuda::conv3x3_wgmma_dw_applies(s, kGpu)) << "compute capability 9.0 but no dw path";
  else EXPECT_FALSE(cuda::conv3x3_wgmma_dw_applies(s, kGpu)) << "dw path claimed on a non-Hopper GPU";
}

TEST(CudaConv3x3WgmmaDw, OneHotDyIsExact) {
  REQUIRE_WGMMA_DW();
  PrecisionGuard guard(Precision::TF32);
  for (const Case& c : {Case{1, 8, 4, 16, 16, 1, 1}, Case{2, 70, 5, 37, 65, 0, 2}, Case{1, 64, 4, 1030, 128, 0, 0},
                        Case{3, 3, 6, 9, 9, 2, 1}}) {
    expect_one_hot_dy_exact(c);
  }
}

TEST(CudaConv3x3WgmmaDw, SmallIntegersAreExact) {
  REQUIRE_WGMMA_DW();
  PrecisionGuard guard(Precision::TF32);
  for (const Case& c : {Case{1, 13, 7, 21, 9, 1, 1}, Case{2, 70, 6, 37, 65, 0, 2}, Case{1, 5, 3, 41, 7, 0, 0}}) {
    expect_small_integers_exact(c);
  }
}

TEST(CudaConv3x3WgmmaDw, MatchesReference) {
  REQUIRE_WGMMA_DW();
  for (const Case& c : kCases) check_grad_weight(c);
}

// conv3x3_grad_weight and the tape's conv2d backward route TF32 grad-weight here: the same bits
// as the direct call (the mma.sync kernel, which KernelPolicy can pick instead, rounds its
// operands: different bits).
TEST(CudaConv3x3WgmmaDw, DispatchedOpsUseIt) {
  REQUIRE_WGMMA_DW();
  PrecisionGuard guard(Precision::TF32);
  const Case c{2, 19, 9, 45, 33, 1, 1};
  const ConvShape s = shape_of(c);
  Tensor x = random(s.x_shape(), f32, kGpu), w = random(s.w_shape(), f32, kGpu), dy = random(s.y_shape(), f32, kGpu);
  Tensor direct = poisoned(s.w_shape());
  cuda::conv3x3_wgmma_grad_weight(direct, dy, x, s);
  Tensor routed = poisoned(s.w_shape());
  cuda::conv3x3_grad_weight(routed, dy, x, s);
  EXPECT_EQ(routed.to_vector<float>(), direct.to_vector<float>()) << "conv3x3_grad_weight did not route here";
  {
    // KernelPolicy::conv3x3.weight = MmaSync takes the mma.sync kernel instead.
    cuda::KernelPolicy kernels = cuda::kernel_policy();
    kernels.conv3x3.weight = cuda::Conv3x3Policy::Weight::MmaSync;
    cuda::KernelPolicyGuard policy(kernels);
    Tensor mma = poisoned(s.w_shape());
    cuda::conv3x3_grad_weight(mma, dy, x, s);
    EXPECT_NE(mma.to_vector<float>(), direct.to_vector<float>()) << "the policy did not take the mma.sync kernel";
  }
  Tensor wl = w.detach().requires_grad_();
  {
    Tape tape;
    Tensor y = conv2d(x, wl, Tensor(), ConvParams{.padding = {c.pad_h, c.pad_w}});
    tape.backward(y, dy);
  }
  EXPECT_EQ(wl.grad().to_vector<float>(), direct.to_vector<float>()) << "conv2d backward did not route here";
}

TEST(CudaConv3x3WgmmaDw, RejectsWhatItDoesNotTake) {
  REQUIRE_WGMMA_DW();
  const ConvShape s = shape_of({1, 3, 7, 9, 4, 1, 1});
  Tensor x = random(s.x_shape(), f32, kGpu), dy = random(s.y_shape(), f32, kGpu);
  {
    PrecisionGuard guard(Precision::FP32);
    Tensor dw = poisoned(s.w_shape());
    TG_EXPECT_ERROR(cuda::conv3x3_wgmma_grad_weight(dw, dy, x, s), "conv3x3_wgmma_grad_weight", "TF32");
  }
  PrecisionGuard guard(Precision::TF32);
  Tensor wrong = Tensor::empty({4, 3, 3, 2}, {.dtype = f32, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_grad_weight(wrong, dy, x, s), "conv3x3_wgmma_grad_weight", "does not match",
                  "[4, 3, 3, 2]");
  Tensor dy_wrong = random({1, 4, 7, 8}, f32, kGpu);
  Tensor dw = poisoned(s.w_shape());
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_grad_weight(dw, dy_wrong, x, s), "conv3x3_wgmma_grad_weight", "does not match");
  Tensor dw64 = Tensor::empty(s.w_shape(), {.dtype = f64, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_grad_weight(dw64, dy, x, s), "conv3x3_wgmma_grad_weight", "f32");
  Tensor x_cpu = random(s.x_shape(), f32);
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_grad_weight(dw, dy, x_cpu, s), "conv3x3_wgmma_grad_weight", "one GPU");
  const ConvShape strided = make_conv_shape("test", {1, 3, 7, 9}, {4, 3, 3, 3}, ConvParams{.stride = {2}});
  TG_EXPECT_ERROR(cuda::conv3x3_wgmma_grad_weight(dw, dy, x, strided), "conv3x3_wgmma_grad_weight", "3x3 stride-1");
}
