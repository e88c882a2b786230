// conv_transpose2d / conv_transpose3d on the GPU against the CPU (f64 reference), forward and
// every gradient through the tape, FP32 mode (relative L2 <= 1e-5). The cases reach each of the
// convolution kernels the op runs on: the 3x3 fast path (3x3 stride 1 at 64 channels), the 1x1
// path, the engine's phase grad-input (16 output channels, stride 2) and its columns grad-input
// (few output channels), and 3-D.
#include "common/test_util.h"
#include "core/precision.h"
#include "ops/conv_transpose.h"

using namespace tg;
using namespace tg::test;

namespace {

struct Case {
  const char* name;
  Shape x, w;
  ConvTransposeParams p;
};

}  // namespace

TEST(CudaConvTranspose, MatchesCpu) {
  TG_REQUIRE_GPU();
  PrecisionGuard fp32(Precision::FP32);
  const Device gpu = Device::cuda(0);
  const Case cases[] = {
      {"3x3 s1 p1, 64 channels", {2, 64, 9, 11}, {64, 64, 3, 3}, {.padding = {1}}},
      {"1x1", {2, 48, 7, 5}, {48, 40, 1, 1}, {}},
      {"2x2 s2, 16 out (phases)", {2, 32, 7, 9}, {32, 16, 2, 2}, {.stride = {2}}},
      {"3x3 s2 p1 op1, 3 out (columns)", {3, 24, 6, 5}, {24, 3, 3, 3}, {.stride = {2}, .padding = {1}, .output_padding = {1}}},
      {"NHWC 3x3 s2", {2, 5, 6, 12}, {12, 8, 3, 3}, {.stride = {2}, .layout = Layout::NHWC}},
      {"3d 2x2x2 s2", {1, 8, 3, 4, 5}, {8, 6, 2, 2, 2}, {.stride = {2}}},
  };
  for (const Case& c : cases) {
    const int64_t c_out = c.w[1];
    Tensor x = random(c.x, f32).requires_grad_(), w = random(c.w, f32).requires_grad_();
    Tensor b = random({c_out}, f32).requires_grad_();
    Tensor xr = x.detach().to(f64).requires_grad_(), wr = w.detach().to(f64).requires_grad_();
    Tensor br = b.detach().to(f64).requires_grad_();
    Tensor xg = x.detach().to(gpu).requires_grad_(), wg = w.detach().to(gpu).requires_grad_();
    Tensor bg = b.detach().to(gpu).requires_grad_();
    auto run = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
      return wi.dim() == 5 ? conv_transpose3d(xi, wi, bi, c.p) : conv_transpose2d(xi, wi, bi, c.p);
    };
    Tensor y, yg, seed;
    {
      Tape tape;
      y = run(xr, wr, br);
      seed = random(y.shape(), f32);
      tape.backward(y, seed.to(f64));
    }
    {
      Tape tape;
      yg = run(xg, wg, bg);
      tape.backward(yg, seed.to(gpu));
    }
    ASSERT_EQ(yg.device(), gpu) << c.name;
    EXPECT_LE(rel_l2(yg, y), 1e-5) << c.name << ": y";
    EXPECT_LE(rel_l2(xg.grad(), xr.grad()), 1e-5) << c.name << ": dx";
    EXPECT_LE(rel_l2(wg.grad(), wr.grad()), 1e-5) << c.name << ": dw";
    EXPECT_LE(rel_l2(bg.grad(), br.grad()), 1e-5) << c.name << ": db";
  }
}

TEST(CudaConvTranspose, RejectsMixedDevices) {
  TG_REQUIRE_GPU();
  TG_EXPECT_ERROR(conv_transpose2d(random({1, 3, 4, 4}, f32).to(Device::cuda(0)), random({3, 2, 3, 3}, f32)),
                  "conv_transpose2d");
}
