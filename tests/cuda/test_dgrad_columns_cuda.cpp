// The engine's grad-input for few input channels (ops/cuda/gemm/dgrad_columns.cu: the columns
// as one engine_gemm product, then a gather of each dx element's taps) against the f64 CPU
// reference. Every shape here has at most 8 input channels, a kernel of more than one tap and
// columns far under the 2^27-float cap: the columns pass by its rule. They cover NCHW dy
// (transposed into rows with the reduction padded to 16 bytes, zeros in the pad) and NHWC dy
// (read in place), output channels K that are and are not multiples of 4, 1, 2, 3 and 8 input
// channels, more than 128 columns (C*kvol) and reductions past one k-tile, strides, dilations,
// 2-D and 3-D, odd pixel counts N*P (rows of the columns not whole 16 bytes); FP32 (split
// TF32) and TF32, on the kernels the policy picks or forces. dx is NaN-poisoned before each call.
#include <string>
#include <vector>

#include "common/conv_tma_util.h"
#include "common/cuda_compare.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::conv_tma;  // kGpu, the tolerances, ConvCase, Variant, kPrecisions

namespace {

// Frees NaN-filled memory of the pass's scratch size (the weights and dy as padded rows, the
// columns) just before it runs: the stream-ordered pool is likely to hand it back as that
// scratch, so a pad left unwritten (not zero) shows as NaN in dx rather than passing by chance.
void litter_pool(const ConvShape& s) {
  const int64_t red = s.K + 3, pixels = s.N * s.out_volume(), cols = s.C * s.kernel_volume();
  Tensor litter = poisoned_gpu({pixels * red + cols * red + cols * pixels});
}

// N*P (the product's column count) is odd in every case but the last (a multiple of 4, so the
// TMA kernel may store whole tiles of the columns); the name gives C <- K.
std::vector<ConvCase> columns_cases() {
  return {
      {"NCHW stem 7x7 s2 p3, 3 <- 5 (147 columns)", {3, 3, 13, 13}, {5, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"NCHW 3x3 d2 p2, 1 <- 13", {1, 1, 17, 19}, {13, 1, 3, 3}, {.padding = {2}, .dilation = {2}}},
      {"NCHW 5x5 s3 d2 p3, 8 <- 5", {3, 8, 16, 17}, {5, 8, 5, 5}, {.stride = {3}, .padding = {3}, .dilation = {2}}},
      {"NCHW 3x3 s2 p1, 2 <- 37 (two k-tiles)", {5, 2, 21, 17}, {37, 2, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"NCHW stem 7x7 s2 p3, 3 <- 64", {3, 3, 29, 29}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"NHWC 3x3 s2 p1, 3 <- 5", {3, 13, 13, 3}, {5, 3, 3, 3}, {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
      {"NHWC 3x3 d2 p2, 1 <- 13", {1, 17, 19, 1}, {13, 1, 3, 3},
       {.padding = {2}, .dilation = {2}, .layout = Layout::NHWC}},
      {"NHWC 5x5 s3 d2 p3, 8 <- 16", {3, 16, 17, 8}, {16, 8, 5, 5},
       {.stride = {3}, .padding = {3}, .dilation = {2}, .layout = Layout::NHWC}},
      {"NHWC stem 7x7 s2 p3, 3 <- 64", {3, 29, 29, 3}, {64, 3, 7, 7},
       {.stride = {2}, .padding = {3}, .layout = Layout::NHWC}},
      {"3d 3x3x3 s2 p1, 1 <- 13", {1, 1, 9, 9, 9}, {13, 1, 3, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"3d anisotropic s(1,2,1) d(2,1,2), 3 <- 5", {3, 3, 7, 9, 7}, {5, 3, 3, 3, 2},
       {.stride = {1, 2, 1}, .padding = {1, 1, 0}, .dilation = {2, 1, 2}}},
      {"3d 3x3x3 p1, 8 <- 12", {1, 8, 5, 7, 5}, {12, 8, 3, 3, 3}, {.padding = {1}}},
      {"NCHW stem 7x7 s2 p3, 3 <- 8, N*P = 196", {4, 3, 13, 13}, {8, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
  };
}

// The products' kernels and tilings, auto and forced.
const Variant kVariants[] = {
    {"auto", {}},
    {"TMA matmul where it applies", {.tile = 128, .splits = 1, .arch = 90}},
    {"TMA matmul, two blocks per SM", {.tile = 128, .splits = 1, .arch = 90, .blocks_per_sm = 2}},
    {"TMA matmul, split 3", {.tile = 128, .splits = 3, .arch = 90}},
    {"TMA matmul, stores through the output map", {.tile = 128, .splits = 1, .arch = 90, .tma_store = -1}},
    {"wgmma, FP32 off the TMA kernel", {.tile = 128, .splits = 1, .arch = 90, .fp32_tma = -1}},
    {"mma.sync 128x128", {.tile = 128, .splits = 1, .arch = 80}},
    {"mma.sync 64x64 split 2", {.tile = 64, .splits = 2, .arch = 80}},
    {"128x16", {.tile = 16, .splits = 1}},
};

TEST(DgradColumns, MatchesF64ReferenceInBothLayoutsAndPrecisions) {
  TG_REQUIRE_GPU();
  for (const ConvCase& c : columns_cases()) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    ASSERT_LE(s.C, 8) << c.name;
    ASSERT_GT(s.kernel_volume(), 1) << c.name;
    ASSERT_TRUE(cuda::engine_conv_can_implement(s, DType::f32)) << c.name;
    Tensor w = random(c.w, DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
    Tensor dx_ref = Tensor::empty(c.x, {.dtype = DType::f64});
    cpu::conv_grad_input(dx_ref, ref_of(dy), ref_of(w), s);
    for (Precision prec : kPrecisions) {
      // The columns pass is not the TMA convolution kernel, whatever its product runs on.
      EXPECT_FALSE(cuda::engine_conv_grad_input_uses_tma(s, dy, prec)) << c.name;
      for (const Variant& v : kVariants) {
        Tensor dx = poisoned_gpu(c.x);
        litter_pool(s);
        cuda::engine_conv_grad_input(dx, dy, w, s, prec, v.policy);
        EXPECT_LE(rel_l2(dx, dx_ref), tolerance(prec)) << c.name << ", " << name_of(prec) << ", " << v.name;
      }
    }
  }
}

// Reductions of 3+ k-tiles split 3 ways (fixed-order partial sums) and the gather's fixed tap
// order: right, and the same bits every run, in both layouts.
TEST(DgradColumns, SplitProductIsDeterministic) {
  TG_REQUIRE_GPU();
  const ConvCase cases[] = {
      {"NCHW stem 7x7 s2 p3, 3 <- 100", {3, 3, 13, 13}, {100, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"NHWC 5x5 s3 d2 p3, 8 <- 97", {3, 16, 17, 8}, {97, 8, 5, 5},
       {.stride = {3}, .padding = {3}, .dilation = {2}, .layout = Layout::NHWC}},
  };
  const cuda::EnginePolicy policies[] = {
      {}, {.tile = 128, .splits = 3, .arch = 90}, {.tile = 64, .splits = 3, .arch = 80}};
  for (const ConvCase& c : cases) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    Tensor w = random(c.w, DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
    Tensor dx_ref = Tensor::empty(c.x, {.dtype = DType::f64});
    cpu::conv_grad_input(dx_ref, ref_of(dy), ref_of(w), s);
    for (Precision prec : kPrecisions)
      for (const cuda::EnginePolicy& policy : policies) {
        const std::string where = std::string(c.name) + ", " + name_of(prec) + ", splits " +
                                  std::to_string(policy.splits) + ", arch " + std::to_string(policy.arch);
        Tensor first = poisoned_gpu(c.x), second = poisoned_gpu(c.x);
        cuda::engine_conv_grad_input(first, dy, w, s, prec, policy);
        cuda::engine_conv_grad_input(second, dy, w, s, prec, policy);
        EXPECT_LE(rel_l2(first, dx_ref), tolerance(prec)) << where;
        EXPECT_EQ(first.to_vector<float>(), second.to_vector<float>()) << where;
      }
  }
}

}  // namespace
