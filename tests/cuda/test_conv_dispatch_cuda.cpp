// Which kernel the CUDA convolution dispatcher picks (ops/cuda/conv.cu): each routed result must
// be bit-identical to the kernel the rule names, called directly on the same inputs. The rules:
// TF32 3x3 stride-1 NCHW forward and grad-input go to the engine on images under 4096 output
// pixels where the engine runs that pass on its TMA kernel (Hopper, 16+ channels into it), under
// 512 otherwise; grad-weight stays on the 3x3 kernels except for the engine's TMA product on
// images under 512 pixels; FP32 stays.
#include "common/test_util.h"
#include "core/precision.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv1x1/conv1x1.h"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/gemm/engine.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

struct Problem {
  ConvShape s;
  Tensor x, w, dy;
};

Problem make(const Shape& x_shape, const Shape& w_shape, int64_t pad) {
  ConvParams p;
  p.padding = {pad, pad};
  Problem pr;
  pr.s = make_conv_shape("conv2d", x_shape, w_shape, p);
  pr.x = random(x_shape, f32).to(kGpu);
  pr.w = random(w_shape, f32).to(kGpu);
  pr.dy = random(pr.s.y_shape(), f32).to(kGpu);
  return pr;
}

Tensor out(const Shape& shape) {
  Tensor t = Tensor::empty(shape, {.dtype = f32, .device = kGpu});
  poison(t);
  return t;
}

template <class Fn>
std::vector<float> run(const Shape& shape, Fn&& fn) {
  Tensor t = out(shape);
  fn(t);
  return t.to_vector<float>();
}

}  // namespace

TEST(CudaConvDispatch, Tf32SmallImages3x3GoToTheEngine) {
  TG_REQUIRE_GPU();
  PrecisionGuard tf32(Precision::TF32);
  // 64 output pixels; and 576, under the TMA limit where the engine's TMA kernel serves both passes.
  for (const Shape& x_shape : {Shape{2, 64, 8, 8}, Shape{2, 32, 24, 24}}) {
    Problem p = make(x_shape, {48, x_shape[1], 3, 3}, 1);
    ASSERT_TRUE(cuda::conv3x3_applies(p.s));
    const bool tma = cuda::engine_conv_forward_uses_tma(p.s, p.x, Precision::TF32);
    if (x_shape[2] == 24 && !tma) continue;  // no TMA kernel on this GPU: the 512-pixel rule keeps the 3x3 kernels
    const auto routed = run(p.s.y_shape(), [&](const Tensor& y) { cuda::conv_forward(y, p.x, p.w, Tensor(), p.s); });
    const auto engine = run(p.s.y_shape(), [&](const Tensor& y) {
      cuda::engine_conv_forward(y, p.x, p.w, Tensor(), p.s, Precision::TF32);
    });
    EXPECT_EQ(routed, engine) << "x " << x_shape;
    const auto dx = run(p.s.x_shape(), [&](const Tensor& t) { cuda::conv_grad_input(t, p.dy, p.w, p.s); });
    const auto dx_engine = run(p.s.x_shape(), [&](const Tensor& t) {
      cuda::engine_conv_grad_input(t, p.dy, p.w, p.s, Precision::TF32);
    });
    EXPECT_EQ(dx, dx_engine) << "x " << x_shape;
    const auto dw = run(p.s.w_shape(), [&](const Tensor& t) { cuda::conv_grad_weight(t, p.dy, p.x, p.s); });
    const auto dw_3x3 = run(p.s.w_shape(), [&](const Tensor& t) { cuda::conv3x3_grad_weight(t, p.dy, p.x, p.s); });
    EXPECT_EQ(dw, dw_3x3) << "x " << x_shape;
  }
}

TEST(CudaConvDispatch, Tf32LargeImagesAndFp32Stay3x3) {
  TG_REQUIRE_GPU();
  struct Case {
    Precision mode;
    Shape x, w;
  };
  const Case cases[] = {
      {Precision::TF32, {2, 32, 64, 64}, {40, 32, 3, 3}},  // 4096 pixels: the TMA limit
      {Precision::TF32, {2, 8, 24, 24}, {12, 8, 3, 3}},    // 576 pixels, too few channels for TMA: the 512 rule
      {Precision::FP32, {2, 32, 24, 24}, {40, 32, 3, 3}},
      {Precision::FP32, {2, 32, 8, 8}, {40, 32, 3, 3}},
  };
  for (const Case& c : cases) {
    PrecisionGuard guard(c.mode);
    Problem p = make(c.x, c.w, 1);
    const auto routed = run(p.s.y_shape(), [&](const Tensor& y) { cuda::conv_forward(y, p.x, p.w, Tensor(), p.s); });
    const auto direct = run(p.s.y_shape(), [&](const Tensor& y) { cuda::conv3x3_forward(y, p.x, p.w, Tensor(), p.s); });
    EXPECT_EQ(routed, direct) << "x " << c.x;
    const auto dx = run(p.s.x_shape(), [&](const Tensor& t) { cuda::conv_grad_input(t, p.dy, p.w, p.s); });
    const auto dx_3x3 = run(p.s.x_shape(), [&](const Tensor& t) { cuda::conv3x3_grad_input(t, p.dy, p.w, p.s); });
    EXPECT_EQ(dx, dx_3x3) << "x " << c.x;
  }
}

// Grad-weight leaves the 3x3 kernels only for the engine's TMA product (160+ output channels)
// on images under 512 output pixels; with 128 output channels it stays.
TEST(CudaConvDispatch, Tf32SmallImageGradWeightGoesToTheTmaProduct) {
  TG_REQUIRE_GPU();
  PrecisionGuard tf32(Precision::TF32);
  for (const auto& [x_shape, K] : {std::pair{Shape{2, 32, 8, 8}, 192}, std::pair{Shape{2, 32, 32, 32}, 192},
                                   std::pair{Shape{2, 32, 8, 8}, 128}}) {
    Problem p = make(x_shape, {K, 32, 3, 3}, 1);
    Tensor probe = out(p.s.w_shape());
    const bool engine =
        x_shape[2] == 8 && K >= 160 && cuda::engine_conv_grad_weight_uses_tma(p.s, probe, Precision::TF32);
    const auto dw = run(p.s.w_shape(), [&](const Tensor& t) { cuda::conv_grad_weight(t, p.dy, p.x, p.s); });
    const auto want = run(p.s.w_shape(), [&](const Tensor& t) {
      if (engine) cuda::engine_conv_grad_weight(t, p.dy, p.x, p.s, Precision::TF32);
      else cuda::conv3x3_grad_weight(t, p.dy, p.x, p.s);
    });
    EXPECT_EQ(dw, want) << "x " << x_shape << ", K " << K << (engine ? " (engine)" : " (3x3 kernel)");
  }
}

TEST(CudaConvDispatch, PointwiseForwardPast128InputChannelsGoesToTheEngine) {
  TG_REQUIRE_GPU();
  for (const Precision mode : {Precision::TF32, Precision::FP32}) {
    PrecisionGuard guard(mode);
    for (const bool nhwc : {false, true}) {
      for (const int64_t C : {96, 128, 129, 384}) {
        ConvParams params;
        params.layout = nhwc ? Layout::NHWC : Layout::NCHW;
        const Shape x_shape = nhwc ? Shape{2, 12, 10, C} : Shape{2, C, 12, 10};
        const Shape w_shape{40, C, 1, 1};
        const ConvShape s = make_conv_shape("conv2d", x_shape, w_shape, params);
        ASSERT_TRUE(cuda::conv1x1_applies(s, f32));
        const Tensor x = random(x_shape, f32).to(kGpu), w = random(w_shape, f32).to(kGpu);
        const Tensor b = random({40}, f32).to(kGpu);
        const auto routed = run(s.y_shape(), [&](const Tensor& y) { cuda::conv_forward(y, x, w, b, s); });
        const auto want = run(s.y_shape(), [&](const Tensor& y) {
          if (C > 128) cuda::engine_conv_forward(y, x, w, b, s, mode);
          else cuda::conv1x1_forward(y, x, w, b, s);
        });
        EXPECT_EQ(routed, want) << "C " << C << (nhwc ? " NHWC" : " NCHW") << (C > 128 ? " (engine)" : " (1x1 kernel)");
        const Tensor dy = random(s.y_shape(), f32).to(kGpu);
        const auto dx = run(s.x_shape(), [&](const Tensor& t) { cuda::conv_grad_input(t, dy, w, s); });
        const auto dx_1x1 = run(s.x_shape(), [&](const Tensor& t) { cuda::conv1x1_grad_input(t, dy, w, s); });
        EXPECT_EQ(dx, dx_1x1) << "C " << C << (nhwc ? " NHWC" : " NCHW");
      }
    }
  }
}
