// The CUDA convolution kernels against the CPU reference (f32, relative L2 <= 1e-5): forward
// and every gradient, through the public op and the tape, and through each launcher directly
// on a NaN-poisoned output so that an element a kernel fails to write is caught.
#include "common/cuda_compare.h"
#include "common/test_util.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/conv.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);
constexpr double kTol = 1e-5;

struct Case {
  const char* name;
  Shape x, w;  // x in the layout of p
  ConvParams p;
  bool bias = true;
};

Tensor conv(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p) {
  return w.dim() == 5 ? conv3d(x, w, b, p) : conv2d(x, w, b, p);
}

Tensor on_gpu(const Tensor& t) { return t.defined() ? t.to(kGpu) : Tensor(); }

// Forward + backward through conv2d/conv3d and the tape on both devices.
void check_through_tape(const Case& c, DType dt, double tol) {
  const int64_t K = c.w[0];
  Tensor x = random(c.x, dt).requires_grad_(), w = random(c.w, dt).requires_grad_();
  Tensor b = c.bias ? random({K}, dt).requires_grad_() : Tensor();
  Tensor xg = on_gpu(x.detach()).requires_grad_(), wg = on_gpu(w.detach()).requires_grad_();
  Tensor bg = c.bias ? on_gpu(b.detach()).requires_grad_() : Tensor();
  Tensor y, yg, seed;
  {
    Tape tape;
    y = conv(x, w, b, c.p);
    seed = random(y.shape(), dt);
    tape.backward(y, seed);
  }
  {
    Tape tape;
    yg = conv(xg, wg, bg, c.p);
    tape.backward(yg, on_gpu(seed));
  }
  ASSERT_EQ(yg.device(), kGpu);
  EXPECT_LE(rel_l2(yg, y), tol) << c.name << ": y";
  EXPECT_LE(rel_l2(xg.grad(), x.grad()), tol) << c.name << ": dx";
  EXPECT_LE(rel_l2(wg.grad(), w.grad()), tol) << c.name << ": dw";
  if (c.bias) {
    EXPECT_LE(rel_l2(bg.grad(), b.grad()), tol) << c.name << ": db";
  }
}

// Each launcher on a NaN-filled output; the weight gradient twice, which must agree bit for bit.
void check_launchers_poisoned(const Case& c) {
  const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
  Tensor x = random(c.x, f32), w = random(c.w, f32), b = random({s.K}, f32), dy = random(s.y_shape(), f32);
  Tensor xg = on_gpu(x), wg = on_gpu(w), bg = on_gpu(b), dyg = on_gpu(dy);

  Tensor y = Tensor::empty(s.y_shape(), {.dtype = f32}), yg = poisoned_gpu(s.y_shape(), f32);
  cpu::conv_forward(y, x, w, c.bias ? b : Tensor(), s);
  cuda::conv_forward(yg, xg, wg, c.bias ? bg : Tensor(), s);
  EXPECT_LE(rel_l2(yg, y), kTol) << c.name << ": forward launcher";

  Tensor dx = Tensor::empty(c.x, {.dtype = f32}), dxg = poisoned_gpu(c.x, f32);
  cpu::conv_grad_input(dx, dy, w, s);
  cuda::conv_grad_input(dxg, dyg, wg, s);
  EXPECT_LE(rel_l2(dxg, dx), kTol) << c.name << ": grad-input launcher";

  Tensor dw = Tensor::empty(c.w, {.dtype = f32}), dwg = poisoned_gpu(c.w, f32), dwg2 = poisoned_gpu(c.w, f32);
  cpu::conv_grad_weight(dw, dy, x, s);
  cuda::conv_grad_weight(dwg, dyg, xg, s);
  cuda::conv_grad_weight(dwg2, dyg, xg, s);
  EXPECT_LE(rel_l2(dwg, dw), kTol) << c.name << ": grad-weight launcher";
  EXPECT_EQ(dwg.to_vector<float>(), dwg2.to_vector<float>()) << c.name << ": grad-weight not deterministic";

  Tensor db = Tensor::empty({s.K}, {.dtype = f32}), dbg = poisoned_gpu({s.K}, f32);
  cpu::conv_grad_bias(db, dy, s);
  cuda::conv_grad_bias(dbg, dyg, s);
  EXPECT_LE(rel_l2(dbg, db), kTol) << c.name << ": grad-bias launcher";
}

void check_all(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    check_through_tape(c, f32, kTol);
    check_launchers_poisoned(c);
  }
}

const Layout NHWC = Layout::NHWC;

}  // namespace

TEST(CudaConv2d, MatchesCpuNCHW) {
  TG_REQUIRE_GPU();
  check_all({
      {"basic 3x3", {2, 3, 7, 9}, {4, 3, 3, 3}, {}},
      {"C=1 pad 1", {3, 1, 13, 9}, {5, 1, 3, 3}, {.padding = {1}}},
      {"K=1 pad 2", {2, 4, 9, 7}, {1, 4, 3, 3}, {.padding = {2}}},
      {"N=1 W>>H stride 2", {1, 3, 5, 67}, {6, 3, 3, 3}, {.stride = {2}, .padding = {1}}, false},
      {"dilation 2", {2, 3, 13, 11}, {4, 3, 3, 3}, {.padding = {2}, .dilation = {2}}},
      {"1x1 stride 2", {2, 5, 9, 13}, {7, 5, 1, 1}, {.stride = {2}}, false},
      {"5x5 pad 2", {2, 3, 11, 9}, {3, 3, 5, 5}, {.padding = {2}}},
      {"mixed per-dim", {2, 3, 11, 13}, {5, 3, 3, 5}, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}}},
      {"stride 3 > kernel", {2, 2, 13, 11}, {3, 2, 2, 2}, {.stride = {3}}},
      {"more channels", {4, 16, 17, 19}, {8, 16, 3, 3}, {.padding = {1}}},
  });
}

TEST(CudaConv2d, MatchesCpuNHWC) {
  TG_REQUIRE_GPU();
  check_all({
      {"NHWC pad 1", {2, 7, 9, 3}, {4, 3, 3, 3}, {.padding = {1}, .layout = NHWC}},
      {"NHWC C=1 stride 2", {1, 13, 9, 1}, {5, 1, 3, 3}, {.stride = {2}, .layout = NHWC}},
      {"NHWC K=1 dilation 2", {3, 5, 31, 8}, {1, 8, 3, 3}, {.padding = {2}, .dilation = {2}, .layout = NHWC}},
      {"NHWC 1x1", {2, 9, 7, 5}, {6, 5, 1, 1}, {.layout = NHWC}, false},
      {"NHWC mixed", {2, 11, 13, 3}, {5, 3, 3, 5},
       {.stride = {1, 2}, .padding = {2, 1}, .dilation = {2, 1}, .layout = NHWC}},
  });
}

TEST(CudaConv3d, MatchesCpu) {
  TG_REQUIRE_GPU();
  const ConvParams variants[] = {{}, {.padding = {1}}, {.stride = {2}, .padding = {1}}, {.padding = {2}, .dilation = {2}}};
  std::vector<Case> cases;
  for (int64_t c = 1; c <= 4; ++c)
    for (int v = 0; v < 4; ++v) cases.push_back({"conv3d C_in 1..4", {2, c, 5, 7, 9}, {3, c, 3, 3, 3}, variants[v], v != 2});
  cases.push_back({"conv3d like workload C", {2, 3, 9, 11, 13}, {24, 3, 3, 3, 3}, {}});
  cases.push_back({"conv3d 1x1x1 N=1", {1, 4, 3, 5, 7}, {2, 4, 1, 1, 1}, {}});
  cases.push_back({"conv3d mixed per-dim", {2, 3, 7, 9, 11}, {4, 3, 2, 3, 1},
                   {.stride = {1, 2, 3}, .padding = {0, 1, 2}, .dilation = {2, 1, 1}}});
  check_all(cases);
}

// Grids larger than one launch covers (grid-stride loops over threads and over blocks), and
// long weight-gradient reductions (N * output positions ~ 130k per weight element).
TEST(CudaConv2d, LargeGridsAndLongReductions) {
  TG_REQUIRE_GPU();
  check_all({
      {"forward > 1M outputs", {2, 4, 262, 272}, {8, 4, 3, 3}, {}},
      {"> 65536 weight elements", {1, 128, 5, 5}, {64, 128, 3, 3}, {.padding = {1}}},
      {"long reduction", {8, 2, 128, 130}, {3, 2, 3, 3}, {}},
      // The bias gradient's partial sums: 4440 rows in 3 slices, 300 channels in 2 groups.
      {"NHWC bias over slices", {3, 40, 37, 5}, {300, 5, 1, 1}, {.layout = NHWC}},
  });
}

TEST(CudaConv, F64MatchesCpu) {
  TG_REQUIRE_GPU();
  check_through_tape({"f64 conv2d", {2, 3, 9, 7}, {4, 3, 3, 3}, {.stride = {2}, .padding = {1}}}, f64, 1e-12);
  check_through_tape({"f64 NHWC", {2, 9, 7, 3}, {4, 3, 3, 3}, {.padding = {1}, .layout = NHWC}}, f64, 1e-12);
  check_through_tape({"f64 conv3d", {2, 2, 5, 6, 7}, {3, 2, 3, 3, 3}, {.dilation = {2, 1, 1}}}, f64, 1e-12);
}

TEST(CudaConv, BackwardFunctionsOnGpu) {
  TG_REQUIRE_GPU();
  Tensor x = random({2, 3, 7, 9}, f32), w = random({4, 3, 3, 3}, f32);
  ConvParams p{.padding = {1}, .dilation = {2}};
  Tensor dy = random({2, 4, 5, 7}, f32);
  EXPECT_LE(rel_l2(conv_backward_input(on_gpu(dy), on_gpu(w), x.shape(), p), conv_backward_input(dy, w, x.shape(), p)),
            kTol);
  EXPECT_LE(rel_l2(conv_backward_weight(on_gpu(dy), on_gpu(x), w.shape(), p), conv_backward_weight(dy, x, w.shape(), p)),
            kTol);
  EXPECT_LE(rel_l2(conv_backward_bias(on_gpu(dy)), conv_backward_bias(dy)), kTol);
}

TEST(CudaConv, RejectsMixedDevices) {
  TG_REQUIRE_GPU();
  TG_EXPECT_ERROR(conv2d(random({2, 3, 7, 9}, f32, kGpu), random({4, 3, 3, 3}, f32)), "conv2d", "different devices",
                  "cuda:0", "cpu");
  TG_EXPECT_ERROR(conv2d(random({2, 3, 7, 9}, f32, kGpu), random({4, 3, 3, 3}, f32, kGpu), random({4}, f32)),
                  "conv2d", "different devices");
}
