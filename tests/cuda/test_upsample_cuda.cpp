// The CUDA upsample against the CPU reference: nearest, bilinear and trilinear, by scale
// (up, down, fractional) and by size, with and without align_corners, forward and backward
// through the tape (f32 GPU vs f64 CPU), the launchers into NaN-poisoned outputs in f32 and
// f64, bitwise determinism of the gather backward, and a typed error.
#include <cuda_runtime.h>

#include <cmath>

#include "common/cuda_compare.h"
#include "common/test_util.h"
#include "ops/cuda/upsample.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr double kTol = 1e-5;
const Device kGpu = Device::cuda(0);

struct Case {
  Shape x;
  UpsampleParams params;
};

std::vector<Case> cases() {
  using M = UpsampleMode;
  return {
      {{2, 3, 5, 7}, {.mode = M::nearest, .scale_factor = {2}}},
      {{2, 3, 5, 7}, {.mode = M::nearest, .scale_factor = {1.5, 2.5}}},
      {{2, 3, 9, 13}, {.mode = M::nearest, .scale_factor = {0.6}}},
      {{1, 2, 7, 9}, {.mode = M::nearest, .size = {13, 17}}},
      {{2, 3, 3, 5, 7}, {.mode = M::nearest, .scale_factor = {2}}},
      {{1, 2, 3, 5, 7}, {.mode = M::nearest, .scale_factor = {1.7, 1, 2.3}}},
      {{2, 3, 5, 7}, {.mode = M::bilinear, .scale_factor = {2}}},
      {{2, 3, 5, 7}, {.mode = M::bilinear, .scale_factor = {2}, .align_corners = true}},
      {{2, 3, 5, 7}, {.mode = M::bilinear, .scale_factor = {1.5, 2.5}}},
      {{1, 2, 9, 13}, {.mode = M::bilinear, .scale_factor = {0.6, 0.8}, .align_corners = true}},
      {{1, 2, 7, 9}, {.mode = M::bilinear, .size = {31, 3}}},
      {{4, 8, 61, 67}, {.mode = M::bilinear, .scale_factor = {2}}},
      {{2, 3, 3, 5, 7}, {.mode = M::trilinear, .scale_factor = {2}}},
      {{1, 2, 3, 5, 7}, {.mode = M::trilinear, .scale_factor = {1.7, 0.8, 2.3}, .align_corners = true}},
      {{1, 2, 3, 5, 4}, {.mode = M::trilinear, .size = {5, 7, 9}}},
      {{2, 4, 9, 17, 13}, {.mode = M::trilinear, .scale_factor = {2}}},
  };
}

}  // namespace

TEST(UpsampleCuda, ForwardAndBackwardMatchCpu) {
  TG_REQUIRE_GPU();
  manual_seed(301);
  for (const Case& c : cases()) {
    SCOPED_TRACE(testing::Message() << c.x << " mode " << int(c.params.mode) << " ac " << c.params.align_corners);
    const UpsampleParams p = c.params;
    Tensor x = random(c.x, f32, kGpu).requires_grad_();
    Tensor y_shape = upsample(random(c.x, f32), p);  // the output's shape, for the seed
    Tensor dy = random(y_shape.shape(), f32, kGpu);
    expect_matches_f64_cpu([p](const std::vector<Tensor>& in) { return upsample(in[0], p); }, {x}, dy, kTol);
  }
}

TEST(UpsampleCuda, LaunchersWriteEveryPoisonedOutput) {
  TG_REQUIRE_GPU();
  manual_seed(302);
  for (DType dt : {f32, f64}) {
    const double tol = dt == f32 ? kTol : 1e-12;
    for (const Case& c : cases()) {
      SCOPED_TRACE(testing::Message() << c.x << " mode " << int(c.params.mode) << " " << dtype_name(dt));
      Tensor xc = random(c.x, dt);
      const Shape ys = upsample(xc, c.params).shape();
      // The problem as upsample() builds it: spatial dims right-aligned in (in0, in1, in2).
      UpsampleProblem p{.NC = c.x[0] * c.x[1], .mode = c.params.mode, .align_corners = c.params.align_corners};
      const int64_t S = c.x.rank() - 2;
      for (int64_t s = 0; s < S; ++s) {
        const int d = int(3 - S + s);
        p.in[d] = c.x[2 + s];
        p.out[d] = ys[2 + s];
        if (!c.params.scale_factor.empty())
          p.scale[d] = c.params.scale_factor[c.params.scale_factor.size() == 1 ? 0 : size_t(s)];
      }
      Tensor x = xc.cuda(), dy = random(ys, dt, kGpu);
      Tensor y = Tensor::empty(ys, {.dtype = dt, .device = kGpu}), dx = Tensor::empty(c.x, {.dtype = dt, .device = kGpu});
      poison(y);
      poison(dx);
      cuda::upsample_forward(y, x, p);
      cuda::upsample_backward(dx, dy, p);
      Tensor ry = Tensor::empty(ys, {.dtype = dt}), rdx = Tensor::empty(c.x, {.dtype = dt});
      cpu::upsample_forward(ry, xc, p);
      cpu::upsample_backward(rdx, dy.cpu(), p);
      EXPECT_LE(rel_l2(y, ry), tol);
      EXPECT_LE(rel_l2(dx, rdx), tol);
      // The CPU launcher and the public op agree (the problem above is the op's).
      EXPECT_LE(rel_l2(ry, upsample(xc, c.params)), 0.0);
    }
  }
}

TEST(UpsampleCuda, BackwardIsDeterministic) {
  TG_REQUIRE_GPU();
  manual_seed(303);
  Tensor x = random({4, 16, 33, 47}, f32, kGpu).requires_grad_();
  Tensor dy = random({4, 16, 49, 70}, f32, kGpu);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    x.zero_grad();
    Tape tape;
    tape.backward(upsample_bilinear2d(x, {1.5}), dy);
    if (run == 0) first = x.grad().to_vector<float>();
    else EXPECT_EQ(x.grad().to_vector<float>(), first);
  }
}

TEST(UpsampleCuda, ModuleAndDeviceErrors) {
  TG_REQUIRE_GPU();
  Tensor x = random({2, 3, 5, 7}, f32, kGpu);
  nn::Upsample up({.scale_factor = {2}, .mode = UpsampleMode::bilinear, .align_corners = true});
  EXPECT_LE(rel_l2(up(x), upsample_bilinear2d(ref_of(x), {2}, true)), kTol);
  UpsampleProblem p{.NC = 6, .in = {1, 5, 7}, .out = {1, 10, 14}};
  EXPECT_THROW(cuda::upsample_forward(Tensor::empty({2, 3, 10, 14}), x, p), DeviceError);
}

TEST(UpsampleCuda, OutputPast2To31Elements) {
  TG_REQUIRE_GPU();
  manual_seed(304);
  Tensor x = random({1, 2, 16385, 16384}, f32, kGpu).requires_grad_();
  Tensor y;
  {
    Tape tape;
    y = upsample_nearest(x, {2});
    ASSERT_GT(y.numel(), int64_t{1} << 31);
    tape.backward(y, ones(y.shape(), {.device = kGpu}));
  }
  synchronize(kGpu);
  std::vector<float> xt(4), yt(8), gt(4);
  ASSERT_EQ(cudaMemcpy(xt.data(), x.data<float>() + (x.numel() - 4), 4 * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(yt.data(), y.data<float>() + (y.numel() - 8), 8 * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gt.data(), x.grad().data<float>() + (x.numel() - 4), 4 * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(yt[size_t(i)], xt[size_t(i / 2)]) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(gt[size_t(i)], 4.0f) << i;  // each input read by a 2x2 block
  EXPECT_NEAR(sum(y).item(), 4.0 * sum(x.detach()).item(), 1e-6 * double(y.numel()));
  EXPECT_NEAR(sum(x.grad()).item(), 4.0 * double(x.numel()), 1e-6 * 4.0 * double(x.numel()));
}
