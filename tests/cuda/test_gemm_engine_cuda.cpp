// The implicit-GEMM engine (ops/cuda/gemm/) against the f64 CPU reference: every convolution
// pass and every matrix-product transpose, at shapes that break its tiles (odd sizes, 1 and 3
// channels, kernels larger than the input, stride > kernel, dilation with padding, N = 1),
// every tile configuration (on Hopper, arch 90 runs TF32 128x128 tiles on the wgmma kernels,
// for products with both operands k-contiguous the TMA one, also at 128x256; arch 80 on
// mma.sync), split and unsplit reductions, strided grad-input by phases (or, for
// up to 8 input channels, by columns and a gather), FP32 (three TF32 products) and TF32.
// Outputs are NaN-poisoned before each launch; split reductions must be bit-reproducible.
#include <cmath>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "ops/cpu/conv.h"
#include "ops/unary.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/gemm/engine.h"
#include "ops/cuda/policy.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

double tolerance(Precision p) { return p == Precision::FP32 ? 1e-5 : 1e-3; }

struct ConvCase {
  const char* name;
  Shape x, w;  // x in the layout of p
  ConvParams p;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"3x3 s1 p1 odd", {2, 5, 9, 13}, {7, 5, 3, 3}, {.stride = {1}, .padding = {1}}},
      {"3x3 s2 p1", {3, 33, 15, 11}, {67, 33, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"1 channel 5x5 p2", {1, 1, 17, 19}, {3, 1, 5, 5}, {.padding = {2}}},
      {"stem 7x7 s2 p3 C3", {2, 3, 29, 23}, {16, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"kernel > input, padded", {2, 4, 3, 2}, {5, 4, 5, 5}, {.padding = {2}}},
      {"stride > kernel", {2, 6, 13, 14}, {9, 6, 2, 2}, {.stride = {3}}},
      {"dilated 3x3 d2 p2", {2, 8, 12, 10}, {8, 8, 3, 3}, {.padding = {2}, .dilation = {2}}},
      {"s2 d2 p2 (stride and dilation share a factor)", {2, 5, 13, 11}, {6, 5, 3, 3},
       {.stride = {2}, .padding = {2}, .dilation = {2}}},
      {"s3 d2 p1", {1, 4, 14, 15}, {5, 4, 3, 3}, {.stride = {3}, .padding = {1}, .dilation = {2}}},
      {"s2 k4 p1, 20 channels", {2, 20, 16, 17}, {24, 20, 4, 4}, {.stride = {2}, .padding = {1}}},
      {"rect kernel, per-dim params", {1, 7, 16, 9}, {5, 7, 3, 1},
       {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 3}}},
      {"1x1 s2", {2, 40, 9, 9}, {130, 40, 1, 1}, {.stride = {2}}},
      {"wide K, N=1", {1, 70, 6, 7}, {150, 70, 3, 3}, {.padding = {1}}},
      {"NHWC 3x3 s1 p1", {2, 9, 11, 36}, {20, 36, 3, 3}, {.padding = {1}, .layout = Layout::NHWC}},
      {"NHWC 3x3 s2 odd C", {3, 13, 10, 5}, {11, 5, 3, 3},
       {.stride = {2}, .padding = {1}, .layout = Layout::NHWC}},
      {"NHWC dilated 1 channel", {2, 12, 12, 1}, {4, 1, 3, 3},
       {.padding = {2}, .dilation = {2}, .layout = Layout::NHWC}},
      {"3d 3x3x3 p1", {2, 5, 6, 7, 5}, {9, 5, 3, 3, 3}, {.padding = {1}}},
      {"3d s2 C1", {1, 1, 9, 8, 7}, {6, 1, 3, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"3d anisotropic", {2, 3, 5, 9, 6}, {4, 3, 1, 3, 2},
       {.stride = {1, 2, 1}, .padding = {0, 1, 1}, .dilation = {1, 1, 2}}},
      // Up to 8 input channels grad-input runs as columns + gather (above); 9-16 by phases
      // on the narrow tile.
      {"12 channels s2 (phases, narrow tile)", {2, 12, 15, 14}, {10, 12, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"NHWC 16 channels 5x5 s2 d2", {2, 17, 13, 16}, {7, 16, 5, 5},
       {.stride = {2}, .padding = {3}, .dilation = {2}, .layout = Layout::NHWC}},
  };
}

Tensor poisoned(const Shape& s) {
  Tensor t = Tensor::empty(s, {.dtype = DType::f32, .device = kGpu});
  poison(t);
  return t;
}

Tensor ref(const Tensor& t) { return t.detach().cpu().to(DType::f64); }

struct Variant {
  const char* name;
  cuda::EnginePolicy policy;
};
const Variant kVariants[] = {
    {"auto", {}},
    {"128x128", {.tile = 128, .splits = 1}},
    {"64x64", {.tile = 64, .splits = 1}},
    {"64x64 split 3", {.tile = 64, .splits = 3}},
    {"128x128 split 2", {.tile = 128, .splits = 2}},
    {"128x16 where it applies", {.tile = 16, .splits = 1}},
    {"128x128 mma.sync only", {.tile = 128, .splits = 1, .arch = 80}},
    {"128x128 wgmma where it applies", {.tile = 128, .splits = 1, .arch = 90}},
    {"128x128 wgmma split 3", {.tile = 128, .splits = 3, .arch = 90}},
    // FP32 mode runs on the TMA kernel (split TF32) wherever TF32 would; this keeps the
    // cp.async wgmma kernel's FP32 mode under test on the same problems.
    {"128x128 wgmma, FP32 off the TMA kernel", {.tile = 128, .splits = 1, .arch = 90, .fp32_tma = -1}},
};
// Matrix products also take the TMA kernel's 128 x 256 tile and its two-blocks-per-SM 128 x 128
// configuration (TF32, both operands k-contiguous).
const Variant kWideVariants[] = {
    {"128x256 where the TMA kernel applies", {.tile = 256, .splits = 1}},
    {"128x256 split 3", {.tile = 256, .splits = 3}},
    {"128x128 TMA, two blocks per SM", {.tile = 128, .splits = 1, .arch = 90, .blocks_per_sm = 2}},
    {"128x128 TMA, two blocks per SM, split 2", {.tile = 128, .splits = 2, .arch = 90, .blocks_per_sm = 2}},
    {"128x128 TMA, stores through the output map", {.tile = 128, .splits = 1, .arch = 90, .tma_store = -1}},
};
const Precision kPrecisions[] = {Precision::FP32, Precision::TF32};
const char* name_of(Precision p) { return p == Precision::FP32 ? "fp32" : "tf32"; }

TEST(GemmEngineConv, EveryPassMatchesF64Reference) {
  TG_REQUIRE_GPU();
  for (const ConvCase& c : conv_cases()) {
    const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
    ASSERT_TRUE(cuda::engine_conv_can_implement(s, DType::f32)) << c.name;
    Tensor x = random(c.x, DType::f32, kGpu), w = random(c.w, DType::f32, kGpu);
    Tensor b = random({s.K}, DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
    Tensor y_ref = Tensor::empty(s.y_shape(), {.dtype = DType::f64});
    Tensor dx_ref = Tensor::empty(c.x, {.dtype = DType::f64}), dw_ref = Tensor::empty(c.w, {.dtype = DType::f64});
    cpu::conv_forward(y_ref, ref(x), ref(w), ref(b), s);
    cpu::conv_grad_input(dx_ref, ref(dy), ref(w), s);
    cpu::conv_grad_weight(dw_ref, ref(dy), ref(x), s);
    for (Precision prec : kPrecisions) {
      for (const Variant& v : kVariants) {
        const std::string where = std::string(c.name) + ", " + name_of(prec) + ", " + v.name;
        Tensor y = poisoned(s.y_shape()), dx = poisoned(c.x), dw = poisoned(c.w);
        cuda::engine_conv_forward(y, x, w, b, s, prec, v.policy);
        cuda::engine_conv_grad_input(dx, dy, w, s, prec, v.policy);
        cuda::engine_conv_grad_weight(dw, dy, x, s, prec, v.policy);
        EXPECT_LE(rel_l2(y, y_ref), tolerance(prec)) << where << ": forward";
        EXPECT_LE(rel_l2(dx, dx_ref), tolerance(prec)) << where << ": grad-input";
        EXPECT_LE(rel_l2(dw, dw_ref), tolerance(prec)) << where << ": grad-weight";
      }
    }
  }
}

// A long reduction split many ways: the fixed-order partial sums give the same bits every run.
TEST(GemmEngineConv, SplitWeightGradientIsDeterministic) {
  TG_REQUIRE_GPU();
  const ConvCase c{"wgrad split", {8, 16, 40, 40}, {24, 16, 3, 3}, {.padding = {1}}};
  const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
  Tensor x = random(c.x, DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
  Tensor dw_ref = Tensor::empty(c.w, {.dtype = DType::f64});
  cpu::conv_grad_weight(dw_ref, ref(dy), ref(x), s);
  for (int splits : {0, 7, 64}) {
    Tensor first = poisoned(c.w), second = poisoned(c.w);
    cuda::engine_conv_grad_weight(first, dy, x, s, Precision::FP32, {.splits = splits});
    cuda::engine_conv_grad_weight(second, dy, x, s, Precision::FP32, {.splits = splits});
    EXPECT_LE(rel_l2(first, dw_ref), 1e-5) << "splits " << splits;
    EXPECT_EQ(first.to_vector<float>(), second.to_vector<float>()) << "splits " << splits;
  }
}

// The public ops with the engine forced, through the tape: forward, dx, dw and the bias.
TEST(GemmEngineConv, PublicOpsThroughTapeUseTheEngine) {
  TG_REQUIRE_GPU();
  cuda::KernelPolicy engine_only;
  engine_only.conv = cuda::KernelPath::Engine;
  cuda::KernelPolicyGuard guard(engine_only);
  PrecisionGuard fp32(Precision::FP32);
  // 3x3 stride 1 NCHW and 1x1: shapes the specialised kernels would otherwise take.
  const ConvCase cases[] = {
      {"3x3 s1", {2, 6, 10, 9}, {5, 6, 3, 3}, {.padding = {1}}},
      {"1x1", {2, 10, 7, 5}, {12, 10, 1, 1}, {}},
  };
  for (const ConvCase& c : cases) {
    Tensor x = random(c.x, DType::f32, kGpu).requires_grad_(), w = random(c.w, DType::f32, kGpu).requires_grad_();
    Tensor b = random({c.w[0]}, DType::f32, kGpu).requires_grad_();
    Tensor xr = ref(x).requires_grad_(), wr = ref(w).requires_grad_(), br = ref(b).requires_grad_();
    Tensor y, yr;
    Tensor seed = random(make_conv_shape("test", c.x, c.w, c.p).y_shape(), DType::f32, kGpu);
    {
      Tape tape;
      y = conv2d(x, w, b, c.p);
      tape.backward(y, seed);
    }
    {
      Tape tape;
      yr = conv2d(xr, wr, br, c.p);
      tape.backward(yr, ref(seed));
    }
    EXPECT_LE(rel_l2(y, yr), 1e-5) << c.name;
    EXPECT_LE(rel_l2(x.grad(), xr.grad()), 1e-5) << c.name;
    EXPECT_LE(rel_l2(w.grad(), wr.grad()), 1e-5) << c.name;
    EXPECT_LE(rel_l2(b.grad(), br.grad()), 1e-5) << c.name;
  }
}

// Reductions of at least 8 terms: the relative L2 error, within tolerance(). Shorter ones have
// no averaging: one result may cancel (1x1x1 plus a bias), and its relative error measures the
// inputs' conditioning. There each element's error is held to the rounding bound itself, in
// units of its magnitude |a| |b| + |bias|: TF32 operands lose under 2^-10 each when truncated
// (wgmma) and half that when rounded, so under 2 * 2^-10 in all; FP32 mode (three products) far
// under 1e-5.
double short_reduction_bound(Precision p) {
  return p == Precision::FP32 ? 1e-5 : 2.0 * std::ldexp(1.0, -10) + 1e-6;  // + the FP32 rounding of the sum
}

double elementwise_error(const Tensor& got, const Tensor& want, const Tensor& magnitude) {
  const auto g = got.cpu().to(DType::f64).to_vector<double>(), w = want.to_vector<double>();
  const auto m = magnitude.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double e = std::abs(g[i] - w[i]) / (m[i] > 0 ? m[i] : 1.0);
    if (!(e <= worst)) worst = e;  // NaN sticks
  }
  return worst;
}

struct GemmCase {
  int64_t M, N, K;
  bool transA, transB, bias;
};

TEST(GemmEngineMatmul, EveryTransposeMatchesF64Reference) {
  TG_REQUIRE_GPU();
  const GemmCase cases[] = {
      {1, 1, 1, false, false, true},    {7, 9, 13, false, true, true},  {130, 67, 257, true, false, false},
      {257, 130, 33, true, true, true}, {64, 300, 1000, false, true, false}, {5, 513, 8, false, false, true},
      {200, 3, 4097, true, false, false}, {33, 129, 0, false, true, true},
      // Both operands k-contiguous with 16-byte rows (TF32 on Hopper: the TMA kernel, forced by
      // the arch-90 variants, chosen by "auto" from a reduction of 2048): ragged tiles, one
      // column, a reduction shorter than one box, enough k-tiles to wrap the stage ring.
      {300, 260, 512, false, true, true}, {129, 1, 36, false, true, false}, {3, 7, 4, false, true, true},
      {130, 257, 1028, false, true, false}, {70, 150, 2052, false, true, true}, {260, 520, 96, false, true, true},
      // Operands stored with the reduction strided and a reduction of 16-byte rows: at TF32 on
      // Hopper the arch-90 variants (and "auto" where it pays) transpose them for the TMA kernel.
      {300, 260, 512, true, false, true}, {130, 257, 1028, true, true, false}, {70, 150, 2052, false, false, true},
      {260, 520, 96, true, false, false}, {33, 65, 36, true, false, true}, {512, 520, 2048, false, false, true},
  };
  for (const GemmCase& c : cases) {
    const GemmProblem p{.M = c.M, .N = c.N, .K = c.K, .transA = c.transA, .transB = c.transB};
    Tensor a = random({p.a_rows(), p.a_cols()}, DType::f32, kGpu);
    Tensor b = random({p.b_rows(), p.b_cols()}, DType::f32, kGpu);
    Tensor bias = c.bias ? random({c.N}, DType::f32, kGpu) : Tensor();
    Tensor c_ref = Tensor::empty({c.M, c.N}, {.dtype = DType::f64});
    cpu::gemm(c_ref, ref(a), ref(b), c.bias ? ref(bias) : Tensor(), p);
    // The scale of the rounding errors, for short reductions (elementwise_error).
    Tensor c_abs = Tensor::empty({c.M, c.N}, {.dtype = DType::f64});
    cpu::gemm(c_abs, abs(ref(a)), abs(ref(b)), c.bias ? abs(ref(bias)) : Tensor(), p);
    std::vector<Variant> variants(std::begin(kVariants), std::end(kVariants));
    variants.insert(variants.end(), std::begin(kWideVariants), std::end(kWideVariants));
    for (Precision prec : kPrecisions) {
      for (const Variant& v : variants) {
        Tensor out = poisoned({c.M, c.N});
        cuda::engine_gemm(out, a, b, bias, p, prec, v.policy);
        const double error = c.K >= 8 ? rel_l2(out, c_ref) : elementwise_error(out, c_ref, c_abs);
        EXPECT_LE(error, c.K >= 8 ? tolerance(prec) : short_reduction_bound(prec))
            << c.M << "x" << c.N << "x" << c.K << " tA " << c.transA << " tB " << c.transB << ", " << name_of(prec)
            << ", " << v.name;
      }
    }
  }
}

// The TMA kernel's epilogue that hands row-major tiles to the TMA unit (the bias added as the
// tile is staged; split partial sums as planes) against the one that stores element by element:
// the same bits, with ragged rows and columns, every tile width, split or not.
TEST(GemmEngineMatmul, TmaStoreEpilogueMatchesTheElementwiseOne) {
  TG_REQUIRE_GPU();
  struct Case {
    int64_t M, N, K;
    bool bias;
  };
  const Case cases[] = {{300, 260, 512, true}, {130, 36, 1028, false}, {513, 520, 2048, true}, {70, 4, 96, true}};
  const cuda::EnginePolicy layouts[] = {{.tile = 128, .splits = 1, .arch = 90},
                                        {.tile = 128, .splits = 3, .arch = 90},
                                        {.tile = 256, .splits = 1, .arch = 90},
                                        {.tile = 128, .splits = 2, .arch = 90, .blocks_per_sm = 2},
                                        {}};
  for (const Case& c : cases) {
    const GemmProblem p{.M = c.M, .N = c.N, .K = c.K};
    Tensor a = random({p.a_rows(), p.a_cols()}, DType::f32, kGpu), b = random({p.b_rows(), p.b_cols()}, DType::f32, kGpu);
    Tensor bias = c.bias ? random({c.N}, DType::f32, kGpu) : Tensor();
    for (Precision prec : kPrecisions)
      for (const cuda::EnginePolicy& base : layouts) {
        cuda::EnginePolicy elementwise = base;
        elementwise.tma_store = -1;
        Tensor with_tma = poisoned({c.M, c.N}), with_map = poisoned({c.M, c.N});
        cuda::engine_gemm(with_tma, a, b, bias, p, prec, base);
        cuda::engine_gemm(with_map, a, b, bias, p, prec, elementwise);
        EXPECT_EQ(with_tma.to_vector<float>(), with_map.to_vector<float>())
            << c.M << "x" << c.N << "x" << c.K << " bias " << c.bias << ", " << name_of(prec) << ", tile "
            << base.tile << ", splits " << base.splits << ", blocks per SM " << base.blocks_per_sm;
      }
  }
}

TEST(GemmEngineMatmul, LinearRoutesLargeShapesToTheEngine) {
  TG_REQUIRE_GPU();
  PrecisionGuard fp32(Precision::FP32);
  // Reduction 300 > the 1x1 kernels' limit: the dispatcher's engine path.
  Tensor x = random({70, 300}, DType::f32, kGpu).requires_grad_();
  Tensor w = random({90, 300}, DType::f32, kGpu).requires_grad_();
  Tensor b = random({90}, DType::f32, kGpu).requires_grad_();
  Tensor xr = ref(x).requires_grad_(), wr = ref(w).requires_grad_(), br = ref(b).requires_grad_();
  Tensor y, yr;
  Tensor seed = random({70, 90}, DType::f32, kGpu);
  {
    Tape tape;
    y = linear(x, w, b);
    tape.backward(y, seed);
  }
  {
    Tape tape;
    yr = linear(xr, wr, br);
    tape.backward(yr, ref(seed));
  }
  EXPECT_LE(rel_l2(y, yr), 1e-5);
  EXPECT_LE(rel_l2(x.grad(), xr.grad()), 1e-5);
  EXPECT_LE(rel_l2(w.grad(), wr.grad()), 1e-5);
  EXPECT_LE(rel_l2(b.grad(), br.grad()), 1e-5);
}

TEST(GemmEngine, RejectsWhatItCannotIndex) {
  ConvShape s = make_conv_shape("test", {1, 1, 4, 4}, {1, 1, 3, 3}, {});
  EXPECT_FALSE(cuda::engine_conv_can_implement(s, DType::f64));
  s.N = int64_t{1} << 32;
  EXPECT_FALSE(cuda::engine_conv_can_implement(s, DType::f32));
  EXPECT_FALSE(cuda::engine_gemm_can_implement({.M = int64_t{1} << 31, .N = 4, .K = 4}, DType::f32));
  EXPECT_TRUE(cuda::engine_gemm_can_implement({.M = 3, .N = 4, .K = 5}, DType::f32));
}

}  // namespace
