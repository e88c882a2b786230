// The engine's BF16 convolution passes (ops/cuda/gemm/conv_bf16_sm90_tma.cu: forward, stride-1
// grad-input, grad-weight) and conv2d / conv3d under Autocast(bf16) on the GPU, which run them
// there.
//
// Tolerances (as test_gemm_bf16_cuda.cpp): the operands are bf16 values, so every product is
// exact in f32 and the kernel differs from the f64 reference of the same values by its f32
// accumulation alone, at most 2^-23 of the running sum per addition that may not round to
// nearest: within R 2^-23 (relative L2) for a reduction of R = C kvol terms, and at least 1e-5.
// A kernel that mixed up taps, channels, rows or tiles misses by 1e-3 and more. The ops under
// Autocast are compared with the CPU's bf16 path: one bf16 rounding apart for the outputs
// (2^-8), two for the gradients (2^-7). The forward and grad-input also write bf16 outputs (each
// sum rounded once, in the kernel's epilogue or from an f32 scratch): exactly the bits of their
// f32 outputs cast to bf16. Outputs are NaN-poisoned first. Needs an sm_90a GPU for
// the BF16 kernel; the fallback (the f32 kernels at TF32 on f32 copies) runs on any GPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "autograd/tape.h"
#include "common/autocast_compare.h"
#include "common/conv_tma_util.h"
#include "common/half_util.h"
#include "core/autocast.h"
#include "core/precision.h"
#include "ops/conv.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/conv.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::conv_tma;

namespace {

double tolerance_for(const ConvShape& s) { return std::max(1e-5, double(s.C * s.kernel_volume()) * std::ldexp(1.0, -23)); }

bool bf16_kernel() {
  const ConvShape s = make_conv_shape("probe", {1, 16, 4, 4}, {1, 16, 3, 3}, {});
  return cuda::engine_conv_forward_bf16_uses_tma(s, Tensor::empty({1, 16, 4, 4}, {.dtype = DType::bf16, .device = kGpu}));
}

// One case under each policy: f32 output (and f32 bias) against the f64 reference of the same
// bf16 values, and a bf16 output against the f32 one's bits rounded.
void expect_forward_matches(const ConvCase& c, const std::vector<Variant>& variants, bool want_tma) {
  const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
  const Tensor x = random(c.x, DType::bf16, kGpu), w = random(c.w, DType::bf16, kGpu);
  const Tensor b = random({s.K}, DType::f32, kGpu);
  Tensor want = Tensor::empty(s.y_shape(), {.dtype = DType::f64});
  cpu::conv_forward(want, ref(x), ref(w), ref(b), s);
  for (const Variant& v : variants) {
    const std::string where = std::string(c.name) + ", " + v.name;
    EXPECT_EQ(cuda::engine_conv_forward_bf16_uses_tma(s, x, v.policy), want_tma) << where;
    Tensor y = Tensor::empty(s.y_shape(), {.device = kGpu});
    poison(y);
    cuda::engine_conv_forward_bf16(y, x, w, b, s, v.policy);
    EXPECT_LE(rel_l2(y, want), tolerance_for(s)) << where;
    Tensor y16 = Tensor::empty(s.y_shape(), {.dtype = DType::bf16, .device = kGpu});
    poison(y16);
    cuda::engine_conv_forward_bf16(y16, x, w, b, s, v.policy);
    EXPECT_EQ(half_bits(y16), half_bits(y.to(DType::bf16))) << where << ", bf16 output";
  }
}

#define TG_REQUIRE_BF16_TMA() TG_REQUIRE_SM90A_KERNEL("BF16 TMA kernel", bf16_kernel())

// Channels that are not a multiple of the 64-channel k-tile (NCHW pads the scratch to 8),
// tiles of 128 output pixels across rows and images, strides, dilations, paddings past the
// kernel, 3-D volumes, N = 1, output channels under 64 (64-wide tiles) and past one tile.
TEST(ConvBf16, ForwardMatchesF64ReferenceOnTheTmaKernel) {
  TG_REQUIRE_BF16_TMA();
  const ConvCase cases[] = {
      {"3x3 s1 p1, 48 channels, many small images", {37, 48, 5, 3}, {40, 48, 3, 3}, {.padding = {1}}},
      {"3x3 s2 p1, 33 channels (NCHW pads to 40)", {3, 33, 15, 11}, {67, 33, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"1x1, 100 channels, 130 outputs", {2, 100, 9, 9}, {130, 100, 1, 1}, {}},
      {"3x3, N = 1, 70 -> 150 channels", {1, 70, 6, 7}, {150, 70, 3, 3}, {.padding = {1}}},
      {"3x3 p4 (padding past the kernel)", {2, 16, 6, 5}, {8, 16, 3, 3}, {.padding = {4}}},
      {"dilated 3x3 d3 p3, stride 3", {2, 24, 17, 14}, {36, 24, 3, 3}, {.stride = {3}, .padding = {3}, .dilation = {3}}},
      {"NHWC 3x3 s1 p1, 40 channels", {2, 9, 11, 40}, {20, 40, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"NHWC 7x7 s2 p3, 64 channels, 64 outputs", {3, 23, 19, 64}, {64, 64, 7, 7},
       {.stride = {2}, .padding = {3}, .layout = Layout::NHWC}},
      {"3d 3x3x3 p1, 20 channels", {2, 20, 6, 7, 5}, {9, 20, 3, 3, 3}, {.padding = {1}}},
      {"3d s2 d2 p2, 72 channels", {2, 72, 9, 10, 11}, {24, 72, 3, 3, 3}, {.stride = {2}, .padding = {2}, .dilation = {2}}},
      // Images of whole 16-byte pixel runs: bf16 outputs leave as 64-pixel TMA boxes, some of
      // them running into the next image.
      {"3x3 p1, 40 -> 72, 10 x 8 images", {3, 40, 10, 8}, {72, 40, 3, 3}, {.padding = {1}}},
      {"3x3 p1, 24 -> 136, 16 x 12 images", {2, 24, 16, 12}, {136, 24, 3, 3}, {.padding = {1}}},
      {"3x3 p1, 32 -> 48, 8 x 8 images", {3, 32, 8, 8}, {48, 32, 3, 3}, {.padding = {1}}},
  };
  const std::vector<Variant> variants(std::begin(kTilingVariants), std::end(kTilingVariants));
  for (const ConvCase& c : cases) expect_forward_matches(c, variants, true);
}

// Stride-1 grad-input as the BF16 forward of dy with the weights transposed and flipped; strided
// ones phase by phase (each phase a stride-1 forward over dy, scattered into dx); fewer than 16
// dy channels on the f32 kernels. The reduction is at most K kvol terms.
TEST(ConvBf16, GradInputMatchesF64Reference) {
  TG_REQUIRE_BF16_TMA();
  const std::pair<ConvCase, bool> cases[] = {
      {{"3x3 p1, 24 <- 32 channels", {2, 24, 9, 11}, {32, 24, 3, 3}, {.padding = {1}}}, true},
      {{"3x3 p1, 40 <- 64, 12 x 10 images", {2, 40, 12, 10}, {64, 40, 3, 3}, {.padding = {1}}}, true},
      {{"5x5 p1 (padding under the reach), 16 <- 72", {2, 16, 11, 9}, {72, 16, 5, 5}, {.padding = {1}}}, true},
      {{"NHWC 3x3 p1, 12 <- 16", {2, 8, 7, 12}, {16, 12, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}}, true},
      {{"3d 3x3x3 p1, 12 <- 20", {2, 12, 5, 6, 7}, {20, 12, 3, 3, 3}, {.padding = {1}}}, true},
      {{"3x3 s2 p1, 24 <- 40 (phases)", {2, 24, 15, 11}, {40, 24, 3, 3}, {.stride = {2}, .padding = {1}}}, true},
      {{"NHWC 1x1 s2, 20 <- 72 (phases no tap reaches: zeros)", {2, 9, 10, 20}, {72, 20, 1, 1},
        {.stride = {2}, .layout = Layout::NHWC}}, true},
      {{"3d 3x3x3 s2 d2 p2, 12 <- 24", {2, 12, 9, 10, 11}, {24, 12, 3, 3, 3}, {.stride = {2}, .padding = {2}, .dilation = {2}}},
       true},
      {{"NHWC 3x3 s2, 12 <- 20 (dy rows not 16 bytes: the f32 kernels)", {2, 9, 10, 12}, {20, 12, 3, 3},
        {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}}, false},
      {{"8 dy channels (the f32 kernels)", {2, 24, 9, 9}, {8, 24, 3, 3}, {.padding = {1}}}, false},
  };
  for (const auto& [c, want_tma] : cases) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    const Tensor w = random(c.w, DType::bf16, kGpu), dy = random(s.y_shape(), DType::bf16, kGpu);
    Tensor want = Tensor::empty(c.x, {.dtype = DType::f64});
    cpu::conv_grad_input(want, ref(dy), ref(w), s);
    for (const Variant& v : std::vector<Variant>{{"auto", {}}, {"128 wide, split 3", {.tile = 128, .splits = 3}}}) {
      const std::string where = std::string(c.name) + ", " + v.name;
      EXPECT_EQ(cuda::engine_conv_grad_input_bf16_uses_tma(s, dy, v.policy), want_tma) << where;
      Tensor dx = Tensor::empty(c.x, {.device = kGpu});
      poison(dx);
      cuda::engine_conv_grad_input_bf16(dx, dy, w, s, v.policy);
      EXPECT_LE(rel_l2(dx, want), std::max(1e-5, double(s.K * s.kernel_volume()) * std::ldexp(1.0, -23))) << where;
      Tensor dx16 = Tensor::empty(c.x, {.dtype = DType::bf16, .device = kGpu});
      poison(dx16);
      cuda::engine_conv_grad_input_bf16(dx16, dy, w, s, v.policy);
      EXPECT_EQ(half_bits(dx16), half_bits(dx.to(DType::bf16))) << where << ", bf16 output";
    }
  }
}

// Grad-weight over bf16 dy rows and input columns (64+ output channels, or 32+ where C kvol
// <= 64; rows padded to 8 pixels); fewer output channels on the f32 kernels. The reduction runs
// over every output pixel of every image: N P terms.
TEST(ConvBf16, GradWeightMatchesF64Reference) {
  TG_REQUIRE_BF16_TMA();
  const std::pair<ConvCase, bool> cases[] = {
      {{"3x3 p1, 32 -> 64, 10 x 9 images (pixels not a multiple of 8)", {3, 32, 10, 9}, {64, 32, 3, 3}, {.padding = {1}}},
       true},
      {{"NHWC 3x3 s2 p1, 40 -> 72", {2, 13, 11, 40}, {72, 40, 3, 3}, {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
       true},
      {{"3d 3x3x3 p1, 16 -> 64", {2, 16, 5, 6, 7}, {64, 16, 3, 3, 3}, {.padding = {1}}}, true},
      {{"3x3, 4 -> 48 (C kvol 36: the narrow rule)", {2, 4, 12, 12}, {48, 4, 3, 3}, {.padding = {1}}}, true},
      {{"3x3, 32 -> 16 (the f32 kernels)", {2, 32, 8, 8}, {16, 32, 3, 3}, {.padding = {1}}}, false},
  };
  for (const auto& [c, want_tma] : cases) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    const Tensor x = random(c.x, DType::bf16, kGpu), dy = random(s.y_shape(), DType::bf16, kGpu);
    Tensor want = Tensor::empty(c.w, {.dtype = DType::f64});
    cpu::conv_grad_weight(want, ref(dy), ref(x), s);
    for (const Variant& v : std::vector<Variant>{{"auto", {}}, {"128 wide, split 5", {.tile = 128, .splits = 5}}}) {
      const std::string where = std::string(c.name) + ", " + v.name;
      Tensor dw = Tensor::empty(c.w, {.device = kGpu});
      EXPECT_EQ(cuda::engine_conv_grad_weight_bf16_uses_tma(s, dw, v.policy), want_tma) << where;
      poison(dw);
      cuda::engine_conv_grad_weight_bf16(dw, dy, x, s, v.policy);
      EXPECT_LE(rel_l2(dw, want), std::max(1e-5, double(s.N * s.out_volume()) * std::ldexp(1.0, -23))) << where;
    }
  }
}

// What the kernel leaves to the f32 kernels (at TF32, on f32 copies: the same exact products).
TEST(ConvBf16, FallsBackToTheF32KernelsWithTheSameProducts) {
  TG_REQUIRE_GPU();
  const std::vector<Variant> automatic = {{"auto", {}}};
  expect_forward_matches({"8 channels", {2, 8, 9, 9}, {16, 8, 3, 3}, {.padding = {1}}}, automatic, false);
  expect_forward_matches({"NHWC, 20 channels (rows not 16-byte multiples)", {2, 7, 6, 20}, {8, 20, 3, 3},
                          {.padding = {1}, .layout = Layout::NHWC}},
                         automatic, false);
  expect_forward_matches({"padding 130 (past the im2col corner range)", {1, 16, 4, 4}, {4, 16, 3, 3}, {.padding = {130}}},
                         automatic, false);
  expect_forward_matches({"mma.sync policy", {2, 32, 8, 8}, {16, 32, 3, 3}, {.padding = {1}}},
                         {{"arch 80", {.arch = 80}}}, false);
}

TEST(ConvBf16, ErrorsAreTypedAndNameTheOp) {
  TG_REQUIRE_GPU();
  const ConvShape s = make_conv_shape("test", {2, 16, 6, 6}, {8, 16, 3, 3}, {.padding = {1}});
  const Tensor x32 = random({2, 16, 6, 6}, DType::f32, kGpu), w = random({8, 16, 3, 3}, DType::bf16, kGpu);
  Tensor y = Tensor::empty(s.y_shape(), {.device = kGpu});
  EXPECT_THROW(cuda::engine_conv_forward_bf16(y, x32, w, Tensor(), s), DTypeError);
  TG_EXPECT_ERROR(cuda::engine_conv_forward_bf16(y, x32, w, Tensor(), s), "engine_conv_forward_bf16", "got f32");
  Tensor y16 = Tensor::empty(s.y_shape(), {.dtype = DType::bf16, .device = kGpu});
  EXPECT_THROW(cuda::conv_forward_bf16(y16, x32, w, Tensor(), s), DTypeError);
  // Outputs: f32 or bf16 for the forward and grad-input, f32 for the grad-weight's kernels.
  const Tensor x = random({2, 16, 6, 6}, DType::bf16, kGpu), dy = random(s.y_shape(), DType::bf16, kGpu);
  Tensor y_f16 = Tensor::empty(s.y_shape(), {.dtype = DType::f16, .device = kGpu});
  TG_EXPECT_ERROR(cuda::engine_conv_forward_bf16(y_f16, x, w, Tensor(), s), "engine_conv_forward_bf16", "out f16");
  Tensor dw16 = Tensor::empty({8, 16, 3, 3}, {.dtype = DType::bf16, .device = kGpu});
  EXPECT_THROW(cuda::engine_conv_grad_weight_bf16(dw16, dy, x, s), DTypeError);
}

// conv2d and conv3d under Autocast(bf16) on the GPU (forward, grad-input and grad-weight on the
// BF16 kernels where they apply, the bias gradient as the f32 path) against the same model on the CPU (compute_in_f32's bf16 path). Parameters and
// input stay f32; their gradients arrive in f32 through Autocast's recorded casts.
TEST(ConvBf16, ConvUnderAutocastMatchesTheCpuPath) {
  TG_REQUIRE_GPU();
  PrecisionGuard fp32(Precision::FP32);
  const ConvCase cases[] = {
      {"conv2d 3x3 p1, 32 -> 48", {2, 32, 12, 11}, {48, 32, 3, 3}, {.padding = {1}}},
      {"conv2d 3x3 s2 p1, 20 -> 24 (NHWC, a fallback)", {2, 9, 10, 20}, {24, 20, 3, 3},
       {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
      {"conv3d 3x3x3 p1, 16 -> 8", {2, 16, 5, 6, 7}, {8, 16, 3, 3, 3}, {.padding = {1}}},
      {"conv2d 3x3 p1, 96 -> 96 (every pass on the BF16 kernels)", {2, 96, 9, 10}, {96, 96, 3, 3}, {.padding = {1}}},
      {"conv2d 3x3 p1, 64 -> 64 at 33x34 (grad-weight: the 3x3 kernels on f32 copies)", {2, 64, 33, 34},
       {64, 64, 3, 3}, {.padding = {1}}},
      {"conv2d 3x3 p1, 3 -> 64 at 40x40 (narrow columns: the bf16 grad-weight)", {2, 3, 40, 40}, {64, 3, 3, 3},
       {.padding = {1}}},
  };
  for (const ConvCase& c : cases) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    const std::string name = c.name;
    if (name.find("every pass") != std::string::npos && cuda::device_runs_wgmma(0)) {
      const TensorOptions bf16{.dtype = DType::bf16, .device = kGpu};
      EXPECT_TRUE(cuda::engine_conv_forward_bf16_uses_tma(s, Tensor::empty(c.x, bf16))) << c.name;
      EXPECT_TRUE(cuda::engine_conv_grad_input_bf16_uses_tma(s, Tensor::empty(s.y_shape(), bf16))) << c.name;
      EXPECT_TRUE(cuda::engine_conv_grad_weight_bf16_uses_tma(s, Tensor::empty(c.w, {.device = kGpu}))) << c.name;
      EXPECT_FALSE(cuda::conv_grad_weight_bf16_on_f32_copies(s, kGpu)) << c.name;
    }
    if (name.find("f32 copies") != std::string::npos && cuda::device_runs_wgmma(0)) {
      EXPECT_TRUE(cuda::conv_grad_weight_bf16_on_f32_copies(s, kGpu)) << c.name;
    }
    if (name.find("narrow columns") != std::string::npos) {
      EXPECT_FALSE(cuda::conv_grad_weight_bf16_on_f32_copies(s, kGpu)) << c.name;
    }
    expect_autocast_gpu_matches_cpu(
        c.name, random(c.x, DType::f32), random(c.w, DType::f32), random({s.K}, DType::f32),
        random(s.y_shape(), DType::f32), [&](const Tensor& x, const Tensor& w, const Tensor& b) {
          return s.spatial_dims == 3 ? conv3d(x, w, b, c.p) : conv2d(x, w, b, c.p);
        });
  }
}

}  // namespace
