// Which kernel the CUDA convolution dispatcher picks (ops/cuda/conv.cu): each routed result must
// be bit-identical to the kernel the rule names, called directly on the same inputs. The rules
// (measured by dev/conv_routing_probe.cu; ops/cuda/conv.cu gives the numbers):
// - 1x1 forward and grad-input: the engine's TMA kernel from 96 channels on both sides
//   channels-last (at TF32 also from 64 where the pass reduces over 256+) and channels-first on
//   images of 64 pixels or fewer (their grad-weight too, from C K >= 36864). Other
//   channels-first images on Hopper: the 1x1 TMA kernels at any channel count (the weight
//   streamed past 64 reduction channels); without them at TF32 the engine from C K >= 36864
//   (both sides 96+), at FP32 where the pass reduces over more than 128 channels and writes 96+.
//   Grad-weight and everything narrower on the 1x1 kernels; past 512 channels the engine.
// - 3x3 NCHW forward and grad-input, by the channels the pass writes: TF32 the engine up to
//   128x128 (under 8192 pixels with 64 or fewer channels), FP32 the engine under 8192 pixels
//   (under 2048 with 64 or fewer); without the TMA kernel TF32 takes the engine under 512
//   pixels and FP32 stays.
// - 3x3 FP32 grad-input of 8 or fewer input channels on Hopper: the engine (its columns pass)
//   where 64+ output channels or images of 64x64 or fewer.
// - 3x3 grad-weight: the engine's TMA product on images under 128 pixels from C K >= 9216
//   (FP32 4096) and under 512 pixels from 36864 (FP32 9216), where 2 K >= C.
// Cases whose rule names the engine's TMA kernel are skipped on GPUs without it.
#include "common/test_util.h"
#include "core/precision.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv_variants.h"
#include "ops/cuda/conv1x1/conv1x1.h"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/gemm/engine.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

enum class Kernel { Pointwise, Conv3x3, Engine };
const char* name_of(Kernel k) {
  return k == Kernel::Pointwise ? "1x1 kernel" : k == Kernel::Conv3x3 ? "3x3 kernel" : "engine";
}
const char* name_of(cuda::ConvPass p) {
  return p == cuda::ConvPass::Forward ? "forward" : p == cuda::ConvPass::GradInput ? "grad-input" : "grad-weight";
}

struct Case {
  const char* why;
  Precision mode;
  cuda::ConvPass pass;
  Shape x, w;  // x in the layout's order
  Layout layout;
  Kernel want;
  bool hopper_only = false;  // the rule names this kernel only where Hopper's TMA kernels run
};

Tensor out(const Shape& shape) {
  Tensor t = Tensor::empty(shape, {.dtype = f32, .device = kGpu});
  poison(t);
  return t;
}

// Runs `pass` through the dispatcher (kernel == nullopt) or on the named kernel.
std::vector<float> run(const Case& c, const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor& dy,
                       const Kernel* kernel) {
  using cuda::ConvPass;
  const Shape shape = c.pass == ConvPass::Forward     ? s.y_shape()
                      : c.pass == ConvPass::GradInput ? s.x_shape()
                                                      : s.w_shape();
  Tensor t = out(shape);
  if (kernel == nullptr) {
    if (c.pass == ConvPass::Forward) cuda::conv_forward(t, x, w, Tensor(), s);
    else if (c.pass == ConvPass::GradInput) cuda::conv_grad_input(t, dy, w, s);
    else cuda::conv_grad_weight(t, dy, x, s);
  } else if (*kernel == Kernel::Engine) {
    if (c.pass == ConvPass::Forward) cuda::engine_conv_forward(t, x, w, Tensor(), s, c.mode);
    else if (c.pass == ConvPass::GradInput) cuda::engine_conv_grad_input(t, dy, w, s, c.mode);
    else cuda::engine_conv_grad_weight(t, dy, x, s, c.mode);
  } else if (*kernel == Kernel::Conv3x3) {
    if (c.pass == ConvPass::Forward) cuda::conv3x3_forward(t, x, w, Tensor(), s);
    else if (c.pass == ConvPass::GradInput) cuda::conv3x3_grad_input(t, dy, w, s);
    else cuda::conv3x3_grad_weight(t, dy, x, s);
  } else {
    if (c.pass == ConvPass::Forward) cuda::conv1x1_forward(t, x, w, Tensor(), s);
    else if (c.pass == ConvPass::GradInput) cuda::conv1x1_grad_input(t, dy, w, s);
    else cuda::conv1x1_grad_weight(t, dy, x, s);
  }
  return t.to_vector<float>();
}

// Whether the engine runs this case's pass on its TMA kernel on this GPU.
bool engine_tma(const Case& c, const ConvShape& s, const Tensor& x, const Tensor& dy) {
  switch (c.pass) {
    case cuda::ConvPass::Forward: return cuda::engine_conv_forward_uses_tma(s, x, c.mode);
    case cuda::ConvPass::GradInput: return cuda::engine_conv_grad_input_uses_tma(s, dy, c.mode);
    case cuda::ConvPass::GradWeight: return cuda::engine_conv_grad_weight_uses_tma(s, out(s.w_shape()), c.mode);
  }
  return false;
}

void check_routes(const Case* cases, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const Case& c = cases[i];
    PrecisionGuard guard(c.mode);
    const int64_t k = c.w[2];
    const ConvShape s = make_conv_shape("conv2d", c.x, c.w, {.padding = {k / 2}, .layout = c.layout});
    const Tensor x = random(c.x, f32).to(kGpu), w = random(c.w, f32).to(kGpu);
    const Tensor dy = random(s.y_shape(), f32).to(kGpu);
    const char* mode = c.mode == Precision::FP32 ? ", fp32" : ", tf32";
    const std::string where = detail::concat(c.why, ": ", name_of(c.pass), mode, ", x ", c.x, ", w ", c.w,
                                             ", want the ", name_of(c.want));
    if (c.hopper_only && !cuda::device_runs_wgmma(0)) {
      std::printf("skipped (a Hopper rule): %s\n", where.c_str());
      continue;
    }
    if (c.want == Kernel::Engine && !c.hopper_only && !engine_tma(c, s, x, dy)) {
      std::printf("skipped (no TMA kernel for it on this GPU): %s\n", where.c_str());
      continue;
    }
    EXPECT_EQ(run(c, s, x, w, dy, nullptr), run(c, s, x, w, dy, &c.want)) << where;
  }
}

using Pass = cuda::ConvPass;
constexpr Precision kTf32 = Precision::TF32, kFp32 = Precision::FP32;

}  // namespace

TEST(CudaConvDispatch, Pointwise1x1AgainstTheEngine) {
  TG_REQUIRE_GPU();
  const Case cases[] = {
      // Channels-first on 12x10 images: above the tiny-image rule (64 pixels), tested below.
      {"NCHW 384 -> 96: C K = 36864", kTf32, Pass::Forward, {2, 384, 12, 10}, {96, 384, 1, 1}, Layout::NCHW,
       Kernel::Pointwise, true},
      {"NCHW 128 -> 128: C K under 36864", kTf32, Pass::Forward, {2, 128, 12, 10}, {128, 128, 1, 1}, Layout::NCHW,
       Kernel::Pointwise},
      {"NCHW 384 -> 40: a narrow side", kTf32, Pass::Forward, {2, 384, 12, 10}, {40, 384, 1, 1}, Layout::NCHW,
       Kernel::Pointwise},
      {"NCHW 192 -> 192", kTf32, Pass::GradInput, {2, 192, 12, 10}, {192, 192, 1, 1}, Layout::NCHW,
       Kernel::Pointwise, true},
      {"grad-weight stays", kTf32, Pass::GradWeight, {2, 384, 12, 10}, {96, 384, 1, 1}, Layout::NCHW,
       Kernel::Pointwise},
      {"NCHW FP32 256 -> 256", kFp32, Pass::Forward, {2, 256, 12, 10}, {256, 256, 1, 1}, Layout::NCHW,
       Kernel::Pointwise, true},
      {"NCHW FP32 384 -> 96: reduces over 384, writes 96", kFp32, Pass::Forward, {2, 384, 12, 10}, {96, 384, 1, 1},
       Layout::NCHW, Kernel::Pointwise, true},
      {"NCHW FP32 96 -> 384: reduces over 96", kFp32, Pass::Forward, {2, 96, 12, 10}, {384, 96, 1, 1}, Layout::NCHW,
       Kernel::Pointwise},
      {"NCHW FP32 384 -> 96 grad-input: reduces over 96", kFp32, Pass::GradInput, {2, 384, 12, 10}, {96, 384, 1, 1},
       Layout::NCHW, Kernel::Pointwise},
      {"NCHW FP32 256 -> 64: writes 64", kFp32, Pass::Forward, {2, 256, 12, 10}, {64, 256, 1, 1}, Layout::NCHW,
       Kernel::Pointwise},
      {"NHWC 96 -> 96", kTf32, Pass::Forward, {2, 9, 7, 96}, {96, 96, 1, 1}, Layout::NHWC, Kernel::Engine},
      {"NHWC 64 -> 256: a narrow side", kTf32, Pass::Forward, {2, 9, 7, 64}, {256, 64, 1, 1}, Layout::NHWC,
       Kernel::Pointwise},
      {"NHWC 256 -> 64: reduces over 256", kTf32, Pass::Forward, {2, 9, 7, 256}, {64, 256, 1, 1}, Layout::NHWC,
       Kernel::Engine},
      {"NHWC 64 -> 256 grad-input: reduces over 256", kTf32, Pass::GradInput, {2, 9, 7, 64}, {256, 64, 1, 1},
       Layout::NHWC, Kernel::Engine},
      {"NHWC 64 -> 64", kTf32, Pass::Forward, {2, 9, 7, 64}, {64, 64, 1, 1}, Layout::NHWC, Kernel::Pointwise},
      {"NHWC 32 -> 512: a narrower side", kTf32, Pass::GradInput, {2, 9, 7, 32}, {512, 32, 1, 1}, Layout::NHWC,
       Kernel::Pointwise},
      {"NHWC 128 -> 96", kTf32, Pass::GradInput, {2, 9, 7, 128}, {96, 128, 1, 1}, Layout::NHWC, Kernel::Engine},
      {"NHWC FP32 96 -> 384", kFp32, Pass::GradInput, {2, 9, 7, 96}, {384, 96, 1, 1}, Layout::NHWC, Kernel::Engine},
      {"NHWC FP32 256 -> 64", kFp32, Pass::Forward, {2, 9, 7, 256}, {64, 256, 1, 1}, Layout::NHWC, Kernel::Pointwise},
      {"NHWC grad-weight stays", kTf32, Pass::GradWeight, {2, 9, 7, 256}, {256, 256, 1, 1}, Layout::NHWC,
       Kernel::Pointwise},
      {"past 512 channels, 20-pixel images", kTf32, Pass::Forward, {2, 640, 5, 4}, {40, 640, 1, 1}, Layout::NCHW,
       Kernel::Engine},
      {"NCHW past 512 channels", kTf32, Pass::Forward, {2, 640, 12, 10}, {40, 640, 1, 1}, Layout::NCHW,
       Kernel::Pointwise, true},
      {"NCHW FP32 1024 -> 600 grad-input", kFp32, Pass::GradInput, {2, 1024, 12, 10}, {600, 1024, 1, 1},
       Layout::NCHW, Kernel::Pointwise, true},
      // Images of 64 pixels or fewer, channels-first.
      {"8x8 NCHW 96 -> 96", kTf32, Pass::Forward, {4, 96, 8, 8}, {96, 96, 1, 1}, Layout::NCHW, Kernel::Engine},
      {"8x8 NCHW FP32 128 -> 128 grad-input", kFp32, Pass::GradInput, {4, 128, 8, 8}, {128, 128, 1, 1}, Layout::NCHW,
       Kernel::Engine},
      {"8x8 NCHW 64 -> 64", kTf32, Pass::Forward, {4, 64, 8, 8}, {64, 64, 1, 1}, Layout::NCHW, Kernel::Pointwise},
      {"8x8 NCHW grad-weight 192 -> 192", kTf32, Pass::GradWeight, {4, 192, 8, 8}, {192, 192, 1, 1}, Layout::NCHW,
       Kernel::Engine},
      {"8x8 NCHW grad-weight 128 -> 128", kFp32, Pass::GradWeight, {4, 128, 8, 8}, {128, 128, 1, 1}, Layout::NCHW,
       Kernel::Pointwise},
      {"9x9 NCHW grad-weight 192 -> 192", kTf32, Pass::GradWeight, {4, 192, 9, 9}, {192, 192, 1, 1}, Layout::NCHW,
       Kernel::Pointwise},
  };
  check_routes(cases, std::size(cases));
}

TEST(CudaConvDispatch, Conv3x3DataPassesAgainstTheEngine) {
  TG_REQUIRE_GPU();
  const Case cases[] = {
      {"8x8", kTf32, Pass::Forward, {2, 64, 8, 8}, {48, 64, 3, 3}, Layout::NCHW, Kernel::Engine},
      {"64x64, few channels", kTf32, Pass::Forward, {2, 32, 64, 64}, {32, 32, 3, 3}, Layout::NCHW, Kernel::Engine},
      {"96x96, few channels", kTf32, Pass::Forward, {1, 32, 96, 96}, {40, 32, 3, 3}, Layout::NCHW, Kernel::Conv3x3},
      {"128x128, 96 written", kTf32, Pass::Forward, {1, 16, 128, 128}, {96, 16, 3, 3}, Layout::NCHW, Kernel::Engine},
      {"130x130", kTf32, Pass::Forward, {1, 16, 130, 130}, {96, 16, 3, 3}, Layout::NCHW, Kernel::Conv3x3},
      {"128x128, 96 written back", kTf32, Pass::GradInput, {1, 96, 128, 128}, {16, 96, 3, 3}, Layout::NCHW,
       Kernel::Engine},
      {"96x96, 40 written back", kTf32, Pass::GradInput, {1, 40, 96, 96}, {32, 40, 3, 3}, Layout::NCHW,
       Kernel::Conv3x3},
      {"24x24, too few channels for the TMA kernel", kTf32, Pass::Forward, {2, 8, 24, 24}, {12, 8, 3, 3}, Layout::NCHW,
       Kernel::Conv3x3},
      {"FP32 32x32", kFp32, Pass::Forward, {2, 32, 32, 32}, {40, 32, 3, 3}, Layout::NCHW, Kernel::Engine},
      {"FP32 48x48, few channels", kFp32, Pass::Forward, {2, 32, 48, 48}, {40, 32, 3, 3}, Layout::NCHW,
       Kernel::Conv3x3},
      {"FP32 64x64, 96 written", kFp32, Pass::Forward, {1, 32, 64, 64}, {96, 32, 3, 3}, Layout::NCHW, Kernel::Engine},
      {"FP32 96x96", kFp32, Pass::Forward, {1, 32, 96, 96}, {96, 32, 3, 3}, Layout::NCHW, Kernel::Conv3x3},
      // 94 MFLOP: past the direct kernels' tiny problems (tested below).
      {"FP32 8x8", kFp32, Pass::GradInput, {64, 32, 8, 8}, {40, 32, 3, 3}, Layout::NCHW, Kernel::Engine},
  };
  check_routes(cases, std::size(cases));
}

// FP32 grad-input of a first layer (8 or fewer input channels) on Hopper: the engine's columns
// pass (its TMA kernels do not run it, so these cases name the rule as Hopper's), unless 32 or
// fewer output channels on images past 64x64. TF32 stays with the 3x3 kernels. Sizes past the
// direct kernels' tiny problems.
TEST(CudaConvDispatch, FirstLayerGradInputAgainstThe3x3Kernels) {
  TG_REQUIRE_GPU();
  const Case cases[] = {
      {"FP32 3 -> 64", kFp32, Pass::GradInput, {8, 3, 96, 96}, {64, 3, 3, 3}, Layout::NCHW, Kernel::Engine, true},
      {"FP32 4 -> 128", kFp32, Pass::GradInput, {16, 4, 32, 32}, {128, 4, 3, 3}, Layout::NCHW, Kernel::Engine, true},
      {"FP32 3 -> 32 at 64x64", kFp32, Pass::GradInput, {16, 3, 64, 64}, {32, 3, 3, 3}, Layout::NCHW, Kernel::Engine,
       true},
      {"FP32 3 -> 32 past 64x64", kFp32, Pass::GradInput, {8, 3, 100, 100}, {32, 3, 3, 3}, Layout::NCHW,
       Kernel::Conv3x3},
      {"TF32 4 -> 128", kTf32, Pass::GradInput, {16, 4, 32, 32}, {128, 4, 3, 3}, Layout::NCHW, Kernel::Conv3x3},
      {"FP32 16 -> 64: not a first layer", kFp32, Pass::GradInput, {16, 16, 64, 64}, {64, 16, 3, 3}, Layout::NCHW,
       Kernel::Conv3x3},
  };
  check_routes(cases, std::size(cases));
}

TEST(CudaConvDispatch, Conv3x3GradWeightAgainstTheEngine) {
  TG_REQUIRE_GPU();
  const Case cases[] = {
      {"8x8, C K = 9216", kTf32, Pass::GradWeight, {2, 96, 8, 8}, {96, 96, 3, 3}, Layout::NCHW, Kernel::Engine},
      {"8x8, C K = 4096", kTf32, Pass::GradWeight, {2, 64, 8, 8}, {64, 64, 3, 3}, Layout::NCHW, Kernel::Conv3x3},
      {"16x16, C K = 36864", kTf32, Pass::GradWeight, {2, 96, 16, 16}, {384, 96, 3, 3}, Layout::NCHW, Kernel::Engine},
      {"16x16, 384 -> 96: K under C / 2", kTf32, Pass::GradWeight, {2, 384, 16, 16}, {96, 384, 3, 3}, Layout::NCHW,
       Kernel::Conv3x3},
      {"8x8, 256 -> 64: K under C / 2", kTf32, Pass::GradWeight, {2, 256, 8, 8}, {64, 256, 3, 3}, Layout::NCHW,
       Kernel::Conv3x3},
      {"16x16, C K = 9216", kTf32, Pass::GradWeight, {2, 96, 16, 16}, {96, 96, 3, 3}, Layout::NCHW, Kernel::Conv3x3},
      {"32x32", kTf32, Pass::GradWeight, {2, 96, 32, 32}, {384, 96, 3, 3}, Layout::NCHW, Kernel::Conv3x3},
      {"FP32 8x8, C K = 4096", kFp32, Pass::GradWeight, {2, 64, 8, 8}, {64, 64, 3, 3}, Layout::NCHW, Kernel::Engine},
      {"FP32 16x16, C K = 9216", kFp32, Pass::GradWeight, {2, 96, 16, 16}, {96, 96, 3, 3}, Layout::NCHW,
       Kernel::Engine},
      {"FP32 16x16, C K = 4096", kFp32, Pass::GradWeight, {2, 64, 16, 16}, {64, 64, 3, 3}, Layout::NCHW,
       Kernel::Conv3x3},
  };
  check_routes(cases, std::size(cases));
}
