// The 3x3 stride-1 NCHW fast path (ops/cuda/conv3x3/conv3x3.h) against the CPU reference in f64:
// forward (with and without bias), grad-input and grad-weight, in both precisions, through every
// kernel this GPU runs (KernelPolicy::conv3x3: on Hopper the wgmma kernels and the mma.sync ones),
// at shapes that break every tile (odd H, W, C, K; C = 1, K = 1, N = 1; W >> H like workload A),
// pads 0 to 3; outputs poisoned with NaN; the same bits on every run; conv3x3_applies.
#include <array>
#include <string>
#include <vector>

#include "common/conv3x3_cases.h"
#include "common/test_util.h"
#include "ops/conv.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/policy.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::conv3x3;

namespace {

double tolerance(Precision p) { return p == Precision::FP32 ? 1e-5 : 1e-3; }

// The kernels of the 3x3 path this GPU runs in precision p, each as the policy that selects it.
// Off Hopper every policy means the mma.sync kernels: only the default is listed there.
using Data = cuda::Conv3x3Policy::Data;
using Weight = cuda::Conv3x3Policy::Weight;
struct Variant {
  const char* name;
  cuda::Conv3x3Policy policy;
};
// Forward and grad-input: TF32 on Hopper has the shared-operand wgmma kernel (default) and the
// register-A one (FP32's default), then mma.sync.
std::vector<Variant> data_variants(Precision p) {
  std::vector<Variant> v{{"default kernel", {}}};
  if (!cuda::device_runs_wgmma(0)) return v;
  if (p == Precision::TF32) v.push_back({"register-A wgmma", {.data = Data::RegisterA}});
  v.push_back({"mma.sync", {.data = Data::MmaSync}});
  return v;
}
// Grad-weight: TF32 on Hopper has the wgmma kernel (default) and mma.sync; FP32 only mma.sync.
std::vector<Variant> weight_variants(Precision p) {
  std::vector<Variant> v{{"default kernel", {}}};
  if (cuda::device_runs_wgmma(0) && p == Precision::TF32) v.push_back({"mma.sync", {.weight = Weight::MmaSync}});
  return v;
}
cuda::KernelPolicy policy_for(const Variant& v) {
  cuda::KernelPolicy p = cuda::kernel_policy();
  p.conv3x3 = v.policy;
  return p;
}

// FP32 mode takes at most 128 input and output channels (conv3x3_applies); wider cases run in
// TF32 only, and FP32 must decline them.
bool fp32_declines(const Case& c, Precision p) {
  if (p != Precision::FP32 || (c.C <= 128 && c.K <= 128)) return false;
  EXPECT_FALSE(cuda::conv3x3_applies(shape_of(c)));
  return true;
}

void check_forward(const Case& c, Precision precision, bool with_bias) {
  SCOPED_TRACE(name(c) + (with_bias ? " bias" : " no bias"));
  PrecisionGuard guard(precision);
  if (fp32_declines(c, precision)) return;
  const ConvShape s = shape_of(c);
  ASSERT_TRUE(cuda::conv3x3_applies(s));
  Tensor x = random(s.x_shape(), f32), w = random(s.w_shape(), f32);
  Tensor b = with_bias ? random({c.K}, f32) : Tensor();
  Tensor want = Tensor::empty(s.y_shape(), {.dtype = f64});
  cpu::conv_forward(want, x.to(f64), w.to(f64), with_bias ? b.to(f64) : Tensor(), s);
  Tensor gx = x.to(kGpu), gw = w.to(kGpu), gb = with_bias ? b.to(kGpu) : Tensor();
  for (const Variant& v : data_variants(precision)) {
    SCOPED_TRACE(v.name);
    cuda::KernelPolicyGuard policy(policy_for(v));
    Tensor y = run_twice(s.y_shape(), [&](const Tensor& out) { cuda::conv3x3_forward(out, gx, gw, gb, s); });
    EXPECT_LE(rel_l2(y, want), tolerance(precision)) << "forward";
  }
}

void check_grad_input(const Case& c, Precision precision) {
  SCOPED_TRACE(name(c));
  PrecisionGuard guard(precision);
  if (fp32_declines(c, precision)) return;
  const ConvShape s = shape_of(c);
  Tensor dy = random(s.y_shape(), f32), w = random(s.w_shape(), f32);
  Tensor want = Tensor::empty(s.x_shape(), {.dtype = f64});
  cpu::conv_grad_input(want, dy.to(f64), w.to(f64), s);
  Tensor gdy = dy.to(kGpu), gw = w.to(kGpu);
  for (const Variant& v : data_variants(precision)) {
    SCOPED_TRACE(v.name);
    cuda::KernelPolicyGuard policy(policy_for(v));
    Tensor dx = run_twice(s.x_shape(), [&](const Tensor& out) { cuda::conv3x3_grad_input(out, gdy, gw, s); });
    EXPECT_LE(rel_l2(dx, want), tolerance(precision)) << "grad_input";
  }
}

void check_grad_weight(const Case& c, Precision precision) {
  SCOPED_TRACE(name(c));
  PrecisionGuard guard(precision);
  if (fp32_declines(c, precision)) return;
  const ConvShape s = shape_of(c);
  Tensor dy = random(s.y_shape(), f32), x = random(s.x_shape(), f32);
  Tensor want = Tensor::empty(s.w_shape(), {.dtype = f64});
  cpu::conv_grad_weight(want, dy.to(f64), x.to(f64), s);
  Tensor gdy = dy.to(kGpu), gx = x.to(kGpu);
  for (const Variant& v : weight_variants(precision)) {
    SCOPED_TRACE(v.name);
    cuda::KernelPolicyGuard policy(policy_for(v));
    Tensor dw = run_twice(s.w_shape(), [&](const Tensor& out) { cuda::conv3x3_grad_weight(out, gdy, gx, s); });
    EXPECT_LE(rel_l2(dw, want), tolerance(precision)) << "grad_weight";
  }
}

// Shapes chosen against the tiles: forward/grad-input blocks are 2x128 pixels x 128 channels
// (more than 64 output channels) or 4x128 x 64, 8 input channels per stage; grad-weight
// tiles are 128 (TF32) or 64 (FP32) x 32 channels over strips of 2x32 pixels. Odd W means 4-byte copies, W = 2
// (mod 4) 8-byte ones, W = 0 (mod 4) 16-byte ones.
const std::vector<Case> kCases = {
    {1, 13, 7, 21, 9, 1, 1},     // two channel chunks, the last partial; odd W
    {2, 3, 6, 18, 130, 0, 2},    // two output-channel tiles, the last with 2; asymmetric pad (TF32 only)
    {1, 9, 5, 136, 70, 2, 0},    // the wide tile just past 64 channels; two column tiles
    {1, 1, 4, 8, 1, 0, 0},       // C = 1, K = 1
    {1, 16, 9, 12, 64, 1, 1},    // exactly 64 output channels and two full chunks
    {3, 70, 11, 37, 5, 1, 0},    // grad-input through the wide tile (70 input channels)
    {1, 35, 4, 10, 5, 1, 0},     // grad-weight: two input-channel tiles
    {1, 5, 4, 9, 7, 3, 3},       // pad 3: border outputs see only padding; grad-input pad -1
    {1, 64, 5, 1030, 128, 0, 0}, // W >> H, workload A's channels
};

}  // namespace

TEST(CudaConv3x3, ForwardMatchesReferenceFp32) {
  TG_REQUIRE_GPU();
  for (const Case& c : kCases) {
    check_forward(c, Precision::FP32, /*with_bias=*/false);
    check_forward(c, Precision::FP32, /*with_bias=*/true);
  }
}

TEST(CudaConv3x3, ForwardMatchesReferenceTf32) {
  TG_REQUIRE_GPU();
  for (const Case& c : kCases) {
    check_forward(c, Precision::TF32, /*with_bias=*/false);
    check_forward(c, Precision::TF32, /*with_bias=*/true);
  }
}

TEST(CudaConv3x3, GradInputMatchesReference) {
  TG_REQUIRE_GPU();
  for (Precision p : {Precision::FP32, Precision::TF32})
    for (const Case& c : kCases) check_grad_input(c, p);
}

TEST(CudaConv3x3, GradWeightMatchesReference) {
  TG_REQUIRE_GPU();
  for (Precision p : {Precision::FP32, Precision::TF32})
    for (const Case& c : kCases) check_grad_weight(c, p);
}

TEST(CudaConv3x3, GradWeightLongReductionIsAccurateAndDeterministic) {
  TG_REQUIRE_GPU();
  // ~35k output pixels: the reduction is split over many blocks and summed in a fixed order.
  const Case c{4, 5, 67, 130, 6, 1, 1};
  check_grad_weight(c, Precision::FP32);
  check_grad_weight(c, Precision::TF32);
  check_forward(c, Precision::FP32, /*with_bias=*/true);
  check_grad_input(c, Precision::FP32);
}

TEST(CudaConv3x3, GradWeightFullLengthSlicesStayFp32Accurate) {
  TG_REQUIRE_GPU();
  // 1.06M output pixels: on a 132-SM GPU each slice sums ~8k pixels, the longest the planner
  // allows (workload A's slices are as long). The tensor cores accumulate with truncation, so
  // one mma chain over a whole slice was 3.75e-5 off on an H200: FP32 mode restarts the chain
  // every strip and keeps round-to-nearest fp32 side sums.
  const Case c{2, 3, 730, 730, 5, 0, 0};
  check_grad_weight(c, Precision::FP32);
  check_grad_weight(c, Precision::TF32);
}

TEST(CudaConv3x3, AppliesOnlyToThreeByThreeStrideOneNchw2d) {
  const auto shape = [](Shape x, Shape w, ConvParams p) { return make_conv_shape("test", x, w, p); };
  EXPECT_TRUE(cuda::conv3x3_applies(shape({2, 3, 9, 9}, {4, 3, 3, 3}, {})));
  EXPECT_TRUE(cuda::conv3x3_applies(shape({2, 3, 9, 9}, {4, 3, 3, 3}, {.padding = {2, 1}})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({2, 3, 9, 9}, {4, 3, 3, 3}, {.stride = {2}})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({2, 3, 9, 9}, {4, 3, 3, 3}, {.stride = {1, 2}})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({2, 3, 9, 9}, {4, 3, 3, 3}, {.dilation = {2}})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({2, 3, 9, 9}, {4, 3, 5, 5}, {})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({2, 3, 9, 9}, {4, 3, 3, 1}, {})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({2, 3, 9, 9}, {4, 3, 1, 3}, {})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({2, 9, 9, 3}, {4, 3, 3, 3}, {.layout = Layout::NHWC})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({2, 3, 5, 9, 9}, {4, 3, 3, 3, 3}, {})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({2, 3, 1, 9, 9}, {4, 3, 1, 3, 3}, {})));  // conv3d, even if 2-D-like
  // Rows wider than 2^28 (32-bit in-tile offsets) go to the general kernels.
  EXPECT_TRUE(cuda::conv3x3_applies(shape({1, 1, 3, int64_t{1} << 27}, {1, 1, 3, 3}, {})));
  EXPECT_FALSE(cuda::conv3x3_applies(shape({1, 1, 3, (int64_t{1} << 28) + 1}, {1, 1, 3, 3}, {})));
}

TEST(CudaConv3x3, AppliesToWideChannelCountsOnlyInTf32) {
  // FP32 mode keeps every tensor-core accumulation chain within 128 input channels (the
  // hardware's truncating adds would exceed 1e-5 beyond); TF32 takes any channel count.
  const auto shape = [](int64_t c, int64_t k) { return make_conv_shape("test", {1, c, 9, 9}, {k, c, 3, 3}, {}); };
  {
    PrecisionGuard guard(Precision::FP32);
    EXPECT_TRUE(cuda::conv3x3_applies(shape(128, 128)));
    EXPECT_FALSE(cuda::conv3x3_applies(shape(129, 64)));
    EXPECT_FALSE(cuda::conv3x3_applies(shape(64, 129)));
    EXPECT_FALSE(cuda::conv3x3_applies(shape(512, 512)));
  }
  PrecisionGuard guard(Precision::TF32);
  EXPECT_TRUE(cuda::conv3x3_applies(shape(512, 512)));
  EXPECT_TRUE(cuda::conv3x3_applies(shape(129, 64)));
}

TEST(CudaConv3x3, RejectsTensorsThatDoNotMatchTheProblem) {
  TG_REQUIRE_GPU();
  const ConvShape s = shape_of({1, 3, 7, 9, 4, 1, 1});
  Tensor x = random(s.x_shape(), f32, kGpu), w = random(s.w_shape(), f32, kGpu);
  Tensor wrong = Tensor::empty({1, 4, 7, 8}, {.dtype = f32, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_forward(wrong, x, w, Tensor(), s), "conv3x3_forward", "does not match");
  Tensor y64 = Tensor::empty(s.y_shape(), {.dtype = f64, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_forward(y64, x, w, Tensor(), s), "conv3x3_forward", "f32");
  Tensor dy = random(s.y_shape(), f32, kGpu);
  TG_EXPECT_ERROR(cuda::conv3x3_grad_weight(wrong, dy, x, s), "conv3x3_grad_weight", "does not match");
  const ConvShape strided = make_conv_shape("test", {1, 3, 7, 9}, {4, 3, 3, 3}, ConvParams{.stride = {2}});
  Tensor ys = Tensor::empty(strided.y_shape(), {.dtype = f32, .device = kGpu});
  TG_EXPECT_ERROR(cuda::conv3x3_forward(ys, x, w, Tensor(), strided), "conv3x3_forward", "3x3 stride-1");
}
