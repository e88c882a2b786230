// The 1x1 convolution fast path (ops/cuda/conv1x1/conv1x1.h) against the f64 CPU reference, at shapes
// that break its tiles: channel counts that are not multiples of 4, 8 or 16, more than 64 or
// 128 channels (reduction groups, output-channel blocks, dw blocks), pixel counts that are odd
// or not multiples of 128, one image, one pixel. Both layouts (NHWC also against NCHW), both
// precisions, every pass (forward with and without bias, grad-input, grad-weight, the fused
// backward), every variant this GPU runs (on Hopper the TMA forward and, through
// KernelPolicy::conv1x1, the cp.async kernels at the same shapes); outputs poisoned with NaN;
// the same bits on every run.
#include <vector>

#include "common/test_util.h"
#include "core/cuda_context.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/conv1x1/conv1x1.h"
#include "ops/cuda/conv1x1/fprop_sm90.h"
#include "ops/cuda/policy.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

struct Case {
  int64_t N, C, K, H, W;
  bool bias;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "N=" << c.N << " C=" << c.C << " K=" << c.K << " H=" << c.H << " W=" << c.W << " bias=" << c.bias;
}

double tolerance(Precision p) { return p == Precision::FP32 ? 1e-5 : 1e-3; }
const char* name(Precision p) { return p == Precision::FP32 ? "FP32" : "TF32"; }
const char* name(Layout l) { return l == Layout::NHWC ? "NHWC" : "NCHW"; }

// The variants of the 1x1 path this GPU runs, each as the policy that selects it: the default
// (on Hopper the TMA kernels wherever they apply: conv1x1/fprop_sm90.cu, and past 64 reduction
// channels channels-first conv1x1/fprop_streamed_sm90.cu) and, where that differs, the cp.async
// kernels for every shape, and the streamed-weight kernel for every channels-first product.
struct Variant {
  const char* name;
  cuda::Conv1x1Policy policy;
};
std::vector<Variant> variants() {
  std::vector<Variant> v{{"default kernels", {}}};
  if (cuda::device_runs_wgmma(0)) {
    v.push_back({"cp.async kernels (TMA off)", {.tma = false}});
    v.push_back({"streamed weight for every channels-first product", {.stream_weight = true}});
  }
  return v;
}
cuda::KernelPolicy policy_for(const Variant& v) {
  cuda::KernelPolicy p = cuda::kernel_policy();
  p.conv1x1 = v.policy;
  return p;
}

ConvShape shape_of(const Case& c, Layout layout) {
  ConvParams params;
  params.layout = layout;
  const Shape xs = layout == Layout::NHWC ? Shape{c.N, c.H, c.W, c.C} : Shape{c.N, c.C, c.H, c.W};
  return make_conv_shape("test_conv1x1", xs, Shape{c.K, c.C, 1, 1}, params);
}

// (N, C, H, W) <-> the layout's order (host tensors).
Tensor to_layout(const Tensor& t, Layout l) { return l == Layout::NHWC ? t.permute({0, 2, 3, 1}) : t; }
Tensor from_layout(const Tensor& t, Layout l) { return l == Layout::NHWC ? t.permute({0, 3, 1, 2}) : t; }

Tensor poisoned(const Shape& s) {
  Tensor t = Tensor::empty(s, {.device = kGpu});
  poison(t);
  return t;
}

// Inputs (f32, NCHW) and the f64 reference results of one problem.
struct Problem {
  Case c;
  Tensor x, w, b, dy;         // f32 on the host, NCHW
  Tensor y, dx, dw;           // f64 references, NCHW
  explicit Problem(const Case& cs) : c(cs) {
    x = random({c.N, c.C, c.H, c.W}, f32);
    w = random({c.K, c.C, 1, 1}, f32);
    b = c.bias ? random({c.K}, f32) : Tensor();
    dy = random({c.N, c.K, c.H, c.W}, f32);
    const ConvShape s = shape_of(c, Layout::NCHW);
    const Tensor x64 = x.to(f64), w64 = w.to(f64), dy64 = dy.to(f64);
    y = Tensor::empty(s.y_shape(), {.dtype = f64});
    dx = Tensor::empty(s.x_shape(), {.dtype = f64});
    dw = Tensor::empty(s.w_shape(), {.dtype = f64});
    cpu::conv_forward(y, x64, w64, c.bias ? b.to(f64) : Tensor(), s);
    cpu::conv_grad_input(dx, dy64, w64, s);
    cpu::conv_grad_weight(dw, dy64, x64, s);
  }
};

// Every pass of the fast path in one layout and precision, checked against the reference;
// returns the results (NCHW, host) for cross-layout comparison.
struct Results {
  Tensor y, dx, dw;
};
Results check_all_passes(const Problem& pb, Layout layout, Precision precision) {
  SCOPED_TRACE(::testing::Message() << pb.c << " " << name(layout) << " " << name(precision));
  PrecisionGuard guard(precision);
  const double tol = tolerance(precision);
  const ConvShape s = shape_of(pb.c, layout);
  EXPECT_TRUE(cuda::conv1x1_applies(s));
  EXPECT_TRUE(cuda::conv1x1_applies(s, f32));
  const Tensor x = to_layout(pb.x, layout).to(kGpu), dy = to_layout(pb.dy, layout).to(kGpu);
  const Tensor w = pb.w.to(kGpu), b = pb.c.bias ? pb.b.to(kGpu) : Tensor();

  Results r;
  Tensor y = poisoned(s.y_shape());
  cuda::conv1x1_forward(y, x, w, b, s);
  r.y = from_layout(y.cpu(), layout);
  EXPECT_LE(rel_l2(r.y, pb.y), tol) << "forward";

  Tensor dx = poisoned(s.x_shape());
  cuda::conv1x1_grad_input(dx, dy, w, s);
  r.dx = from_layout(dx.cpu(), layout);
  EXPECT_LE(rel_l2(r.dx, pb.dx), tol) << "grad_input";

  Tensor dw = poisoned(s.w_shape());
  cuda::conv1x1_grad_weight(dw, dy, x, s);
  r.dw = dw.cpu();
  EXPECT_LE(rel_l2(r.dw, pb.dw), tol) << "grad_weight";

  // Both gradients at once (the fused kernel where the shape allows it).
  Tensor dx2 = poisoned(s.x_shape()), dw2 = poisoned(s.w_shape());
  cuda::conv1x1_backward(dx2, dw2, dy, x, w, s);
  EXPECT_LE(rel_l2(from_layout(dx2.cpu(), layout), pb.dx), tol) << "backward dx";
  EXPECT_LE(rel_l2(dw2.cpu(), pb.dw), tol) << "backward dw";

  // One gradient through conv1x1_backward.
  Tensor dx3 = poisoned(s.x_shape()), dw3 = poisoned(s.w_shape());
  cuda::conv1x1_backward(dx3, Tensor(), dy, x, w, s);
  cuda::conv1x1_backward(Tensor(), dw3, dy, x, w, s);
  EXPECT_LE(rel_l2(from_layout(dx3.cpu(), layout), pb.dx), tol) << "backward dx only";
  EXPECT_LE(rel_l2(dw3.cpu(), pb.dw), tol) << "backward dw only";
  return r;
}

void check_case(const Case& c) {
  const Problem pb(c);
  for (const Variant& variant : variants()) {
    SCOPED_TRACE(variant.name);
    cuda::KernelPolicyGuard policy(policy_for(variant));
    for (Precision precision : {Precision::FP32, Precision::TF32}) {
      const Results nchw = check_all_passes(pb, Layout::NCHW, precision);
      const Results nhwc = check_all_passes(pb, Layout::NHWC, precision);
      // The two layouts compute the same sums: their results agree far more closely than
      // either agrees with the f64 reference in TF32.
      SCOPED_TRACE(::testing::Message() << c << " NHWC vs NCHW " << name(precision));
      EXPECT_LE(rel_l2(nhwc.y, nchw.y), 1e-5);
      EXPECT_LE(rel_l2(nhwc.dx, nchw.dx), 1e-5);
      EXPECT_LE(rel_l2(nhwc.dw, nchw.dw), 1e-5);
    }
  }
}

}  // namespace

TEST(CudaConv1x1, OddChannelsAndPixels) {
  TG_REQUIRE_GPU();
  check_case({1, 3, 5, 7, 9, true});    // P = 63: 4-byte copies, scalar stores, one image
  check_case({2, 13, 17, 5, 7, false});  // P = 35
  check_case({3, 8, 8, 1, 1, true});     // one pixel per image
  check_case({1, 4, 4, 2, 2, true});     // NHWC rows 16-byte aligned, tiny
  // 32 reduction channels, rows not 16-byte aligned, K = 37: the NHWC TF32 forward stays on the
  // cp.async kernel (the TMA kernel needs 16-byte rows), 4-byte copies and edge stores.
  check_case({1, 30, 37, 9, 11, true});
}

TEST(CudaConv1x1, WorkloadBChannelsAlignedAndUnaligned) {
  TG_REQUIRE_GPU();
  check_case({1, 64, 128, 16, 16, false});  // B's channels, P = 256: 16-byte paths, fused backward
  check_case({2, 64, 128, 16, 16, true});   // the same with bias: staged stores add it per row / column
  check_case({2, 64, 128, 33, 31, true});   // P = 1023: unaligned rows, partial last tile
  check_case({2, 32, 128, 54, 38, true});   // P = 2052: staged full tiles, then a 4-pixel tile; 32 reduction channels
}

// The Hopper forward through the TMA unit (conv1x1/fprop_sm90.cu) where it applies (both precisions:
// check_case runs FP32 and TF32). NHWC: reduction channels that fill one 32-channel box, part of
// a second, or a sliver of one; output channels in three launches, the last 4 wide; partial last
// tiles, one whose second half (the second warpgroup's rows) lies wholly past the matrix.
TEST(CudaConv1x1, NhwcTmaBoxesAndEdges) {
  TG_REQUIRE_GPU();
  check_case({1, 36, 260, 7, 9, true});    // 63 rows: one partial tile; K = 128 + 128 + 4
  check_case({3, 4, 12, 5, 13, false});    // C = 4: one box, mostly zeros past the matrix
  check_case({2, 60, 44, 30, 33, true});   // 1980 rows = 15 x 128 + 60; K = 44: 2 store boxes, one partial
}

// NCHW: images whose pixel counts (multiples of 4) end in partial tiles: input boxes of 32 pixels
// wholly past the image, the first warpgroup's 64-pixel store box cut short, the second's skipped;
// one channel each way (the channel box is mostly zeros past the image's channels, never the next
// image's); output channels in three launches; 33 reduction channels (a second k-step group of
// one channel).
TEST(CudaConv1x1, NchwTmaBoxesAndEdges) {
  TG_REQUIRE_GPU();
  check_case({3, 1, 1, 4, 5, true});       // 20 pixels, C = K = 1
  check_case({2, 36, 260, 6, 22, true});   // 132 pixels = 128 + 4; K = 128 + 128 + 4
  check_case({2, 33, 40, 8, 20, false});   // 160 pixels: the last tile stores 32 of its first half's 64
  check_case({1, 64, 128, 1, 4, true});    // 4 pixels: B's channels, one nearly empty tile
  check_case({2, 60, 44, 30, 32, true});   // 960 pixels = 7.5 tiles
}

TEST(CudaConv1x1, TmaServesTheShapesItShould) {
  TG_REQUIRE_GPU();
  if (!cuda::device_runs_wgmma(0)) GTEST_SKIP() << "the TMA kernel needs sm_90a code on an H100 / H200";
  const Tensor buf = Tensor::empty({4096}, {.device = kGpu});
  float* p = const_cast<float*>(buf.data<float>());
  auto problem = [&](bool nchw, int64_t images, int64_t pixels, int64_t M, int64_t R, int x_offset = 0,
                     int y_offset = 0) {
    return cuda::PointwiseTmaProblem{p + y_offset, p + x_offset, p, 1, 1, nullptr, images, pixels, M, R, nchw, false};
  };
  for (bool nchw : {false, true}) {
    SCOPED_TRACE(nchw ? "NCHW" : "NHWC");
    EXPECT_TRUE(cuda::pointwise_tma_applies(problem(nchw, 16, int64_t(1) << 20, 128, 64), 0));  // workload B
    EXPECT_TRUE(cuda::pointwise_tma_applies(problem(nchw, 1, 8, 260, 4), 0));
    EXPECT_FALSE(cuda::pointwise_tma_applies(problem(nchw, 1, 100, 128, 64, 0, 1), 0));  // y not 16-byte aligned
    EXPECT_FALSE(cuda::pointwise_tma_applies(problem(nchw, 1, 100, 128, 64, 2), 0));     // x not 16-byte aligned
    EXPECT_FALSE(cuda::pointwise_tma_applies(problem(nchw, 1, 100, 128, 0), 0));
  }
  // Past 64 reduction channels only channels-first (the streamed weight), at any R and M.
  EXPECT_FALSE(cuda::pointwise_tma_applies(problem(false, 1, 100, 128, 68), 0));
  EXPECT_TRUE(cuda::pointwise_tma_applies(problem(true, 1, 100, 128, 68), 0));
  EXPECT_TRUE(cuda::pointwise_tma_applies(problem(true, 3, 100, 2051, 4099), 0));
  EXPECT_TRUE(cuda::pointwise_tma_streamed_applies(problem(true, 1, 100, 5, 3), 0));
  EXPECT_FALSE(cuda::pointwise_tma_streamed_applies(problem(false, 1, 100, 128, 64), 0));
  EXPECT_FALSE(cuda::pointwise_tma_streamed_applies(problem(true, 1, 102, 128, 68), 0));  // rows of 102 pixels
  EXPECT_FALSE(cuda::pointwise_tma_streamed_applies(problem(true, 1, 100, 128, 68, 1), 0));
  EXPECT_FALSE(cuda::pointwise_tma_streamed_applies(problem(true, 1, 100, 128, 68, 0, 2), 0));
  EXPECT_FALSE(cuda::pointwise_tma_streamed_applies(problem(true, 0, 100, 128, 68), 0));
  // NHWC rows are channels: R and M must be multiples of 4; NCHW rows are pixels.
  EXPECT_FALSE(cuda::pointwise_tma_applies(problem(false, 1, 100, 128, 30), 0));
  EXPECT_FALSE(cuda::pointwise_tma_applies(problem(false, 1, 100, 37, 64), 0));
  EXPECT_TRUE(cuda::pointwise_tma_applies(problem(true, 1, 100, 37, 30), 0));
  EXPECT_FALSE(cuda::pointwise_tma_applies(problem(true, 1, 102, 128, 64), 0));
  // TMA coordinates are 32-bit: NHWC counts rows over all images, NCHW pixels per image.
  EXPECT_FALSE(cuda::pointwise_tma_applies(problem(false, 2, int64_t(1) << 30, 128, 64), 0));
  EXPECT_TRUE(cuda::pointwise_tma_applies(problem(true, 2, int64_t(1) << 30, 128, 64), 0));
  EXPECT_FALSE(cuda::pointwise_tma_applies(problem(true, 1, int64_t(1) << 31, 128, 64), 0));
  EXPECT_THROW(cuda::pointwise_tma(problem(false, 1, 100, 128, 68), 0, nullptr), Error);
  EXPECT_THROW(cuda::pointwise_tma_streamed(problem(true, 1, 102, 128, 68), 0, nullptr), Error);
}

namespace {

// The routed conv1x1_forward of case c (NCHW) against the Hopper kernel the default policy should
// take, called directly on the same problem (streamed: the streamed-weight kernel, else the
// resident one): the same bits at both precisions.
void expect_forward_routed_to_tma(const Case& c, bool streamed) {
  const ConvShape s = shape_of(c, Layout::NCHW);
  const Tensor x = random(s.x_shape(), f32, kGpu), w = random(s.w_shape(), f32, kGpu), b = random({c.K}, f32, kGpu);
  for (Precision precision : {Precision::FP32, Precision::TF32}) {
    SCOPED_TRACE(::testing::Message() << c << " " << name(precision) << (streamed ? " streamed" : " resident"));
    PrecisionGuard guard(precision);
    Tensor direct = poisoned(s.y_shape()), routed = poisoned(s.y_shape());
    const cuda::PointwiseTmaProblem q{const_cast<float*>(direct.data<float>()), x.data<float>(), w.data<float>(),
                                      /*w_stride_m=*/c.C, /*w_stride_r=*/1, b.data<float>(), c.N, c.H * c.W,
                                      /*M=*/c.K, /*R=*/c.C, /*nchw=*/true, precision == Precision::FP32};
    if (streamed) {
      ASSERT_TRUE(cuda::pointwise_tma_streamed_applies(q, 0));
      cuda::pointwise_tma_streamed(q, 0, cuda::stream(0));
    } else {
      ASSERT_TRUE(cuda::pointwise_tma_applies(q, 0));
      cuda::pointwise_tma(q, 0, cuda::stream(0));
    }
    cuda::conv1x1_forward(routed, x, w, b, s);
    EXPECT_EQ(routed.to_vector<float>(), direct.to_vector<float>()) << "conv1x1_forward took another kernel";
  }
}

}  // namespace

// The default policy sends the Hopper forward to the TMA kernels where they apply: up to 64
// reduction channels the resident one, past that (channels-first) the streamed one. (check_case
// runs the cp.async kernels at the same shapes with KernelPolicy::conv1x1.tma = false.)
TEST(CudaConv1x1, DefaultPolicyRoutesTheForwardToTma) {
  TG_REQUIRE_GPU();
  if (!cuda::device_runs_wgmma(0)) GTEST_SKIP() << "the TMA kernels need sm_90a code on an H100 / H200";
  expect_forward_routed_to_tma({2, 64, 128, 16, 16, true}, /*streamed=*/false);
  expect_forward_routed_to_tma({2, 200, 72, 8, 12, true}, /*streamed=*/true);
}

// The streamed-weight kernel past 64 reduction channels (the default on Hopper, channels-first):
// reductions that end inside a 32-channel k-tile and inside an 8-channel group, several
// 128-channel output blocks with a ragged last one, tiles that end inside an image, and more work
// items than SMs (each block loops, the stage ring wraps across items), and FP32-accurate sums over
// 2048 channels.
TEST(CudaConv1x1, StreamedWeightLongReductions) {
  TG_REQUIRE_GPU();
  check_case({2, 300, 96, 12, 12, true});   // R = 300 (10 k-tiles, the last 12 channels); grad-input R = 96
  check_case({1, 67, 260, 10, 14, false});  // R = 67 (67 % 8 = 3); 3 output blocks, the last 4 wide; 140 pixels
  check_case({3, 520, 136, 4, 4, true});    // 16 pixels per image: one nearly empty tile each; R = 520
  check_case({70, 72, 260, 8, 16, true});   // 70 tiles x 3 output blocks = 210 items on fewer SMs
  // 2048-channel reductions: FP32 mode must not drift over 64 k-tiles (forward, then grad-input).
  check_case({1, 2048, 40, 4, 8, false});
  check_case({1, 40, 2048, 4, 8, true});
}

TEST(CudaConv1x1, ReductionLengthsOffTheUnrolledPaths) {
  TG_REQUIRE_GPU();
  check_case({1, 40, 64, 12, 11, false});  // 48 reduction channels: NHWC forward without ldmatrix
  check_case({1, 64, 40, 12, 12, true});   // K = 40: fused dx over 48 (NHWC without ldmatrix), full C
  check_case({1, 64, 96, 8, 16, false});   // K = 96: fused dx over 12 k-steps (NHWC: 3 ldmatrix groups)
}

TEST(CudaConv1x1, ManyChannelsGroupsAndBlocks) {
  TG_REQUIRE_GPU();
  check_case({2, 70, 33, 9, 13, true});    // C > 64: wide forward; backward not fused
  check_case({1, 130, 20, 5, 5, false});   // C > 128: forward accumulates 2 reduction groups; 3 dw blocks
  check_case({1, 20, 150, 3, 7, true});    // K > 128: 2 forward channel blocks; grad-input groups
}

TEST(CudaConv1x1, ManyTilesPerBlock) {
  TG_REQUIRE_GPU();
  check_case({2, 16, 24, 160, 240, false});  // 600 tiles: every block loops; dw partials summed
  check_case({3, 64, 128, 96, 128, true});   // 288 tiles of B's channels: more than 2 blocks per SM take
}

TEST(CudaConv1x1, ThreeDimensional) {
  TG_REQUIRE_GPU();
  const int64_t N = 2, C = 11, K = 9, D = 3, H = 5, W = 7;
  const ConvShape s = make_conv_shape("test_conv1x1", Shape{N, C, D, H, W}, Shape{K, C, 1, 1, 1}, ConvParams{});
  ASSERT_TRUE(cuda::conv1x1_applies(s, f32));
  const Tensor x = random({N, C, D, H, W}, f32), w = random({K, C, 1, 1, 1}, f32), b = random({K}, f32);
  const Tensor dy = random({N, K, D, H, W}, f32);
  Tensor y64 = Tensor::empty(s.y_shape(), {.dtype = f64}), dx64 = Tensor::empty(s.x_shape(), {.dtype = f64});
  Tensor dw64 = Tensor::empty(s.w_shape(), {.dtype = f64});
  cpu::conv_forward(y64, x.to(f64), w.to(f64), b.to(f64), s);
  cpu::conv_grad_input(dx64, dy.to(f64), w.to(f64), s);
  cpu::conv_grad_weight(dw64, dy.to(f64), x.to(f64), s);
  for (const Variant& variant : variants()) {
    cuda::KernelPolicyGuard policy(policy_for(variant));
    for (Precision precision : {Precision::FP32, Precision::TF32}) {
      SCOPED_TRACE(::testing::Message() << variant.name << " " << name(precision));
      PrecisionGuard guard(precision);
      Tensor y = poisoned(s.y_shape()), dx = poisoned(s.x_shape()), dw = poisoned(s.w_shape());
      cuda::conv1x1_forward(y, x.to(kGpu), w.to(kGpu), b.to(kGpu), s);
      cuda::conv1x1_backward(dx, dw, dy.to(kGpu), x.to(kGpu), w.to(kGpu), s);
      EXPECT_LE(rel_l2(y, y64), tolerance(precision));
      EXPECT_LE(rel_l2(dx, dx64), tolerance(precision));
      EXPECT_LE(rel_l2(dw, dw64), tolerance(precision));
    }
  }
}

TEST(CudaConv1x1, SameBitsEveryRun) {
  TG_REQUIRE_GPU();
  // Small channel counts (edge stores), and B's channels (staged stores, fused 16-warp backward).
  for (const Variant& variant : variants()) {
    cuda::KernelPolicyGuard policy(policy_for(variant));
    for (const Case& c : {Case{2, 16, 24, 160, 240, true}, Case{2, 64, 128, 64, 96, true}}) {
      for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
        for (Precision precision : {Precision::FP32, Precision::TF32}) {
          SCOPED_TRACE(::testing::Message() << variant.name << " " << c << " " << name(layout) << " "
                                            << name(precision));
          PrecisionGuard guard(precision);
          const ConvShape s = shape_of(c, layout);
          const Tensor x = random(s.x_shape(), f32, kGpu), w = random(s.w_shape(), f32, kGpu);
          const Tensor b = random({c.K}, f32, kGpu), dy = random(s.y_shape(), f32, kGpu);
          std::vector<std::vector<float>> runs[3];
          for (int run = 0; run < 2; ++run) {
            Tensor y = poisoned(s.y_shape()), dx = poisoned(s.x_shape()), dw = poisoned(s.w_shape());
            Tensor dw_alone = poisoned(s.w_shape());
            cuda::conv1x1_forward(y, x, w, b, s);
            cuda::conv1x1_backward(dx, dw, dy, x, w, s);
            cuda::conv1x1_grad_weight(dw_alone, dy, x, s);
            runs[0].push_back(y.to_vector<float>());
            runs[1].push_back(dx.to_vector<float>());
            runs[2].push_back(dw.to_vector<float>());
            runs[2].push_back(dw_alone.to_vector<float>());
          }
          EXPECT_EQ(runs[0][0], runs[0][1]) << "forward not deterministic";
          EXPECT_EQ(runs[1][0], runs[1][1]) << "dx not deterministic";
          EXPECT_EQ(runs[2][0], runs[2][2]) << "fused dw not deterministic";
          EXPECT_EQ(runs[2][1], runs[2][3]) << "grad_weight not deterministic";
        }
      }
    }
  }
}

TEST(CudaConv1x1, AppliesOnlyToPointwiseF32) {
  TG_REQUIRE_GPU();
  const Shape x{2, 8, 9, 9};
  auto shape = [&](const Shape& w, ConvParams p) { return make_conv_shape("test_conv1x1", x, w, p); };
  EXPECT_TRUE(cuda::conv1x1_applies(shape({4, 8, 1, 1}, {}), f32));
  EXPECT_FALSE(cuda::conv1x1_applies(shape({4, 8, 1, 1}, {}), f64));
  EXPECT_FALSE(cuda::conv1x1_applies(shape({4, 8, 3, 3}, {})));
  EXPECT_FALSE(cuda::conv1x1_applies(shape({4, 8, 1, 3}, {})));
  EXPECT_FALSE(cuda::conv1x1_applies(shape({4, 8, 1, 1}, {.stride = {2}})));
  EXPECT_FALSE(cuda::conv1x1_applies(shape({4, 8, 1, 1}, {.padding = {1}})));
  EXPECT_FALSE(cuda::conv1x1_applies(shape({4, 8, 1, 1}, {.dilation = {2}})));
}

TEST(CudaConv1x1, LauncherRejectsWhatItDoesNotServe) {
  TG_REQUIRE_GPU();
  const ConvShape s3 = make_conv_shape("test_conv1x1", Shape{1, 2, 5, 5}, Shape{3, 2, 3, 3}, ConvParams{});
  Tensor y = Tensor::empty(s3.y_shape(), {.device = kGpu});
  const Tensor x = random({1, 2, 5, 5}, f32, kGpu), w = random({3, 2, 3, 3}, f32, kGpu);
  TG_EXPECT_ERROR(cuda::conv1x1_forward(y, x, w, Tensor(), s3), "conv1x1_forward", "not a 1x1");

  const ConvShape s = make_conv_shape("test_conv1x1", Shape{1, 2, 5, 5}, Shape{3, 2, 1, 1}, ConvParams{});
  Tensor y64 = Tensor::empty(s.y_shape(), {.dtype = f64, .device = kGpu});
  const Tensor x64 = random({1, 2, 5, 5}, f64, kGpu), w64 = random({3, 2, 1, 1}, f64, kGpu);
  TG_EXPECT_ERROR(cuda::conv1x1_forward(y64, x64, w64, Tensor(), s), "conv1x1_forward", "expected f32");

  Tensor wrong = Tensor::empty({1, 3, 5, 4}, {.device = kGpu});
  const Tensor w1 = random({3, 2, 1, 1}, f32, kGpu);
  TG_EXPECT_ERROR(cuda::conv1x1_forward(wrong, x, w1, Tensor(), s), "conv1x1_forward", "does not match");
}
