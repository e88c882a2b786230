// Every row of the convolution dispatcher's table (ops/cuda/conv_variants.h) on every case it can
// implement on this GPU, forced through KernelPolicy::conv_variant, against the CPU reference:
// forward, grad-input and grad-weight into NaN-poisoned outputs, FP32 (relative L2 <= 1e-5) and
// TF32 (<= 2e-3: common/variant_rows.h says why).
// Also: the default order picks the first row that prefers a problem, a forced row that cannot
// implement a problem is an UnsupportedError, and each case is implemented by at least the engine
// or the direct kernels.
#include <set>
#include <string>

#include "common/cuda_compare.h"
#include "common/test_util.h"
#include "common/variant_rows.h"
#include "core/precision.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv_few_channels.h"
#include "ops/cuda/conv_variants.h"
#include "ops/cuda/policy.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

struct Case {
  const char* name;
  Shape x, w;  // x in the layout of p
  ConvParams p;
};

// Shapes that reach every row: 1x1 (pointwise), 3x3 stride 1 (conv3x3), the engine's TMA and
// cp.async paths (16+ channels, ragged channel counts, strides, dilation, 3-D), tiny channels.
std::vector<Case> cases() {
  const Layout NHWC = Layout::NHWC;
  return {
      {"1x1 NCHW C 40", {2, 40, 9, 12}, {24, 40, 1, 1}, {}},
      {"1x1 NCHW C 136", {2, 136, 6, 8}, {20, 136, 1, 1}, {}},
      {"1x1 NHWC C 36", {2, 7, 9, 36}, {18, 36, 1, 1}, {.layout = NHWC}},
      {"3x3 s1 C 32", {2, 32, 12, 14}, {40, 32, 3, 3}, {.padding = {1}}},
      {"3x3 s1 C 20 K 9", {2, 20, 9, 11}, {9, 20, 3, 3}, {.padding = {1}}},
      {"3x3 s1 NHWC C 24", {2, 10, 12, 24}, {32, 24, 3, 3}, {.padding = {1}, .layout = NHWC}},
      {"3x3 s2 C 18", {2, 18, 15, 13}, {34, 18, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"5x5 d2 C 16", {1, 16, 17, 15}, {12, 16, 5, 5}, {.padding = {4}, .dilation = {2}}},
      {"7x7 s2 C 3", {2, 3, 23, 21}, {16, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"3x3x3 C 16", {1, 16, 6, 7, 8}, {20, 16, 3, 3, 3}, {.padding = {1}}},
      {"3x3x3 s2 C 5", {2, 5, 7, 6, 9}, {6, 5, 3, 3, 3}, {.stride = {2}, .padding = {1}}},
      // The few-tap forward: output channels past one 32-wide chunk and a ragged last one,
      // channels-last, fewer than 16 (its narrow chunk) with stride and dilation.
      {"3x3x3 C 1 K 70", {2, 1, 5, 6, 7}, {70, 1, 3, 3, 3}, {.padding = {1}}},
      {"3x3 NHWC C 3 K 17", {2, 9, 11, 3}, {17, 3, 3, 3}, {.padding = {1}, .layout = NHWC}},
      {"5x5 s2 d2 C 2 K 8", {3, 2, 13, 10}, {8, 2, 5, 5}, {.stride = {2}, .padding = {3}, .dilation = {2}}},
  };
}

ConvShape shape_of(const Case& c) { return make_conv_shape("test", c.x, c.w, c.p); }

struct Reference {
  Tensor x, w, b, dy;           // CPU inputs
  Tensor xg, wg, bg, dyg;       // the same on the GPU
  Tensor y, dx, dw;             // CPU results
};

Reference reference(const Case& c) {
  const ConvShape s = shape_of(c);
  Reference r;
  r.x = random(c.x, f32);
  r.w = random(c.w, f32);
  r.b = random({s.K}, f32);
  r.dy = random(s.y_shape(), f32);
  r.xg = r.x.to(kGpu);
  r.wg = r.w.to(kGpu);
  r.bg = r.b.to(kGpu);
  r.dyg = r.dy.to(kGpu);
  r.y = Tensor::empty(s.y_shape(), {.dtype = f32});
  r.dx = Tensor::empty(c.x, {.dtype = f32});
  r.dw = Tensor::empty(c.w, {.dtype = f32});
  cpu::conv_forward(r.y, r.x, r.w, r.b, s);
  cpu::conv_grad_input(r.dx, r.dy, r.w, s);
  cpu::conv_grad_weight(r.dw, r.dy, r.x, s);
  return r;
}

}  // namespace

TEST(CudaConvVariants, EveryRowOnEveryCaseItCanImplement) {
  TG_REQUIRE_GPU();
  std::set<std::string> rows_run;
  for (const Precision mode : {Precision::FP32, Precision::TF32}) {
    PrecisionGuard guard(mode);
    const double tol = row_tolerance(mode);
    for (const Case& c : cases()) {
      const ConvShape s = shape_of(c);
      const Reference r = reference(c);
      for (const cuda::ConvVariant& v : cuda::conv_variants()) {
        cuda::KernelPolicyGuard forced(forcing_conv_row(v.name));
        const std::string what = std::string(c.name) + " on " + std::string(v.name) + (mode == Precision::TF32 ? " tf32" : " fp32");
        const Tensor y = poisoned_gpu(s.y_shape(), f32), dx = poisoned_gpu(c.x, f32), dw = poisoned_gpu(c.w, f32);
        const cuda::ConvOperands fwd{.out = y, .x = r.xg, .w = r.wg, .b = r.bg};
        const cuda::ConvOperands gi{.out = dx, .w = r.wg, .dy = r.dyg}, gw{.out = dw, .x = r.xg, .dy = r.dyg};
        bool any = false;
        if (v.can_implement(cuda::conv_problem(s, f32, cuda::ConvPass::Forward), fwd)) {
          cuda::conv_forward(y, r.xg, r.wg, r.bg, s);
          EXPECT_LE(rel_l2(y, r.y), tol) << what << ": forward";
          any = true;
        }
        if (v.can_implement(cuda::conv_problem(s, f32, cuda::ConvPass::GradInput), gi)) {
          cuda::conv_grad_input(dx, r.dyg, r.wg, s);
          EXPECT_LE(rel_l2(dx, r.dx), tol) << what << ": grad-input";
          any = true;
        }
        if (v.can_implement(cuda::conv_problem(s, f32, cuda::ConvPass::GradWeight), gw)) {
          cuda::conv_grad_weight(dw, r.dyg, r.xg, s);
          EXPECT_LE(rel_l2(dw, r.dw), tol) << what << ": grad-weight";
          any = true;
        }
        if (any) rows_run.insert(std::string(v.name));
      }
    }
  }
  expect_every_row_ran(cuda::conv_variants(), rows_run);
}

TEST(CudaConvVariants, BothGradientsAtOnceOnEveryRow) {
  TG_REQUIRE_GPU();
  // conv_grad_input_weight takes the 1x1 kernels' fused backward when both passes route there.
  for (const Case& c : {cases()[0], cases()[2], cases()[3]}) {
    const ConvShape s = shape_of(c);
    const Reference r = reference(c);
    for (const cuda::ConvVariant& v : cuda::conv_variants()) {
      const cuda::ConvOperands gi{.out = poisoned_gpu(c.x, f32), .w = r.wg, .dy = r.dyg};
      if (!v.can_implement(cuda::conv_problem(s, f32, cuda::ConvPass::GradInput), gi)) continue;
      cuda::KernelPolicyGuard forced(forcing_conv_row(v.name));
      const Tensor dx = poisoned_gpu(c.x, f32), dw = poisoned_gpu(c.w, f32);
      cuda::conv_grad_input_weight(dx, dw, r.dyg, r.xg, r.wg, s);
      EXPECT_LE(rel_l2(dx, r.dx), 1e-5) << c.name << " on " << v.name << ": dx";
      EXPECT_LE(rel_l2(dw, r.dw), 1e-5) << c.name << " on " << v.name << ": dw";
    }
  }
}

TEST(CudaConvVariants, DefaultOrderTakesTheFirstPreferredRow) {
  TG_REQUIRE_GPU();
  cuda::KernelPolicyGuard automatic(cuda::KernelPolicy{});
  for (const Precision mode : {Precision::FP32, Precision::TF32}) {
    PrecisionGuard guard(mode);
    for (const Case& c : cases()) {
      const ConvShape s = shape_of(c);
      const Tensor x = random(c.x, f32).to(kGpu), y = poisoned_gpu(s.y_shape(), f32);
      const cuda::ConvProblem p = cuda::conv_problem(s, f32, cuda::ConvPass::Forward);
      const cuda::ConvOperands o{.out = y, .x = x};
      std::string_view first;
      for (const cuda::ConvVariant& v : cuda::conv_variants()) {
        if (v.preferred(p, o)) {
          EXPECT_TRUE(v.can_implement(p, o)) << c.name << ": row " << v.name << " prefers what it cannot implement";
          if (first.empty()) first = v.name;
        }
      }
      EXPECT_EQ(cuda::choose_conv_variant(p, o).name, first) << c.name;
      EXPECT_EQ(p.precision, mode);
    }
  }
  // f64 has only the direct kernels.
  const std::vector<Case> all = cases();
  const Case& c = all[3];
  const ConvShape s = shape_of(c);
  const cuda::ConvOperands o{.out = poisoned_gpu(s.y_shape(), f64), .x = random(c.x, f64).to(kGpu)};
  EXPECT_EQ(cuda::choose_conv_variant(cuda::conv_problem(s, f64, cuda::ConvPass::Forward), o).name, "direct");
}

TEST(CudaConvVariants, ForcedRowThatCannotImplementThrows) {
  TG_REQUIRE_GPU();
  const Case c{"5x5 d2", {1, 16, 17, 15}, {12, 16, 5, 5}, {.padding = {4}, .dilation = {2}}};
  const ConvShape s = shape_of(c);
  const Tensor x = random(c.x, f32).to(kGpu), w = random(c.w, f32).to(kGpu), y = poisoned_gpu(s.y_shape(), f32);
  for (const char* name : {"pointwise", "few_channels", "conv3x3", "no_such_kernels"}) {
    cuda::KernelPolicyGuard forced(forcing_conv_row(name));
    try {
      cuda::conv_forward(y, x, w, Tensor(), s);
      ADD_FAILURE() << name << ": expected UnsupportedError";
    } catch (const UnsupportedError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("conv_forward"), std::string::npos) << msg;
      EXPECT_NE(msg.find(name), std::string::npos) << msg;
    }
  }
}

// The few-tap forward refuses what it cannot index: more taps than its shared memory holds,
// coordinates past 32 bits, more output-channel chunks than the grid's y extent.
TEST(CudaConvVariants, FewChannelsRowRefusesWhatItCannotIndex) {
  const ConvShape ok = make_conv_shape("test", {2, 3, 30, 30}, {64, 3, 7, 7}, {.padding = {3}});
  EXPECT_TRUE(cuda::few_channels_forward_applies(ok));
  EXPECT_FALSE(cuda::few_channels_forward_applies(make_conv_shape("test", {2, 4, 30, 30}, {64, 4, 7, 7}, {})));
  EXPECT_FALSE(cuda::few_channels_forward_applies(make_conv_shape("test", {1, 1, 4, int64_t{1} << 31}, {8, 1, 3, 3}, {})));
  EXPECT_FALSE(cuda::few_channels_forward_applies(make_conv_shape("test", {1, 1, 8, 8}, {65536 * 32 + 1, 1, 3, 3}, {})));
  ConvShape far = ok;
  far.pad[2] = int64_t{1} << 40;
  EXPECT_FALSE(cuda::few_channels_forward_applies(far));
}

// Tiny passes (a few MFLOPs: a small model's layers) take the direct kernels: strided forwards
// and grad-inputs up to 2^25 FLOPs (FP32 grad-input 2^26), grad-weights under 2^20; 1x1 kernels
// and f64 keep their rows, larger problems the tensor-core ones, and the engine path the engine.
TEST(CudaConvVariants, TinyProblemsTakeTheDirectKernels) {
  TG_REQUIRE_GPU();
  cuda::KernelPolicyGuard automatic(cuda::KernelPolicy{});
  auto row = [](const Shape& x, const Shape& w, const ConvParams& p, cuda::ConvPass pass, Precision precision) {
    const ConvShape s = make_conv_shape("test", x, w, p);
    const Shape out = pass == cuda::ConvPass::Forward ? s.y_shape() : pass == cuda::ConvPass::GradInput ? x : w;
    const cuda::ConvOperands o{.out = poisoned_gpu(out, f32), .x = random(x, f32).to(kGpu),
                               .w = random(w, f32).to(kGpu), .dy = random(s.y_shape(), f32).to(kGpu)};
    return std::string(cuda::choose_conv_variant(cuda::conv_problem(s, f32, pass, precision), o).name);
  };
  using P = cuda::ConvPass;
  const Precision tf32 = Precision::TF32, fp32 = Precision::FP32;
  const ConvParams s2{.stride = {2}, .padding = {1}}, p1{.padding = {1}};
  // The cnn example's second convolution, 16 -> 32 stride 2 at 16x16: 4.7 MFLOP at batch 8.
  EXPECT_EQ(row({8, 16, 16, 16}, {32, 16, 3, 3}, s2, P::Forward, tf32), "direct");
  EXPECT_EQ(row({8, 16, 16, 16}, {32, 16, 3, 3}, s2, P::GradInput, tf32), "direct");
  EXPECT_EQ(row({8, 16, 16, 16}, {32, 16, 3, 3}, s2, P::GradInput, fp32), "direct");
  EXPECT_NE(row({8, 16, 16, 16}, {32, 16, 3, 3}, s2, P::GradWeight, tf32), "direct");
  // Its first, 1 -> 16 at 16x16: 0.6 MFLOP at batch 8, 2.4 at 32.
  EXPECT_EQ(row({8, 1, 16, 16}, {16, 1, 3, 3}, p1, P::GradWeight, tf32), "direct");
  EXPECT_NE(row({32, 1, 16, 16}, {16, 1, 3, 3}, p1, P::GradWeight, tf32), "direct");
  // Stride-1 forwards keep their rows; 64 -> 64 at 8x8, batch 8 (38 MFLOP) is tiny for an FP32
  // grad-input only.
  EXPECT_NE(row({8, 32, 8, 8}, {32, 32, 3, 3}, p1, P::Forward, tf32), "direct");
  EXPECT_EQ(row({8, 64, 8, 8}, {64, 64, 3, 3}, p1, P::GradInput, fp32), "direct");
  EXPECT_NE(row({8, 64, 8, 8}, {64, 64, 3, 3}, p1, P::GradInput, tf32), "direct");
  // Past the limits, and 1x1.
  EXPECT_NE(row({128, 16, 16, 16}, {32, 16, 3, 3}, s2, P::GradInput, tf32), "direct");
  EXPECT_NE(row({8, 16, 16, 16}, {32, 16, 1, 1}, {}, P::GradInput, tf32), "direct");
  // The engine path keeps the engine.
  cuda::KernelPolicy engine_path;
  engine_path.conv = cuda::KernelPath::Engine;
  cuda::KernelPolicyGuard engine(engine_path);
  EXPECT_EQ(row({8, 16, 16, 16}, {32, 16, 3, 3}, s2, P::GradInput, tf32), "engine");
}
