// The CUDA group_norm against the CPU reference (computed in f64 from the same f32 values):
// forward, dx, dgamma and dbeta, at ranks 3-5, both normalize paths (HW < 32 and >= 32),
// groups=1 and groups=C, with and without affine, and outputs poisoned with NaN. Under
// Autocast a bf16 / f16 x is read as it is: the same bits as the f32 launchers on its values.
#include "common/cuda_compare.h"
#include "common/half_util.h"
#include "common/test_util.h"
#include "core/autocast.h"
#include "ops/cuda/norm.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr double kTol = 1e-5;

struct Case {
  Shape shape;
  int64_t groups;
  bool affine;
};

const std::vector<Case> kCases = {
    {{2, 6, 5}, 3, true},          {{2, 6, 3, 4}, 1, true},          {{2, 6, 2, 3, 2}, 6, true},
    {{1, 1, 1}, 1, true},          {{3, 6, 7}, 2, false},            {{2, 24, 5, 9, 11}, 8, true},
    {{3, 4, 65, 33}, 2, true},     {{2, 8, 1000, 3}, 8, false},      {{5, 12, 1, 1}, 4, true},
    // Fewer groups than SMs: each group is cut into ranges (one block each), per channel or
    // flat (HW < 32), a few ranges or many.
    {{2, 16, 9, 17, 33}, 4, true}, {{1, 4096, 3}, 2, true},           {{1, 64, 130, 70}, 1, false},
    // Groups enough to fill any GPU (300+), each group's x and dy within shared memory: the
    // fused backward, with fewer channels per group than warps (each channel's pixels in
    // ranges), more (12), tiny images (HW < 32), a group of exactly kFusedMaxElements (8192),
    // and one past it (the unfused kernels, unsliced).
    {{10, 64, 12, 10}, 32, true},  {{20, 20, 7}, 20, true},           {{40, 96, 5, 5}, 8, true},
    {{25, 36, 7, 3}, 12, false},   {{300, 2, 64, 64}, 1, true},       {{300, 2, 70, 60}, 1, true},
};

// A case's GPU tensors: x (requiring grad), gamma and beta (requiring grad; undefined without
// affine), and the upstream gradient dy.
struct Inputs {
  Tensor x, gamma, beta, dy;
};
Inputs inputs_of(const Case& k, Device gpu) {
  const int64_t C = k.shape[1];
  Inputs in;
  in.x = random(k.shape, f32, gpu).requires_grad_();
  if (k.affine) {
    in.gamma = uniform({C}, 0.5, 1.5, {.dtype = f32, .device = gpu}).requires_grad_();
    in.beta = random({C}, f32, gpu).requires_grad_();
  }
  in.dy = random(k.shape, f32, gpu);
  return in;
}

GroupNormProblem problem_of(const Tensor& x, int64_t groups) {
  return {.N = x.size(0), .C = x.size(1), .HW = x.numel() / (x.size(0) * x.size(1)), .groups = groups, .eps = 1e-5};
}

}  // namespace

TEST(GroupNormCuda, ForwardAndEveryGradientMatchCpu) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.shape << " groups=" << k.groups << " affine=" << k.affine);
    auto [x, gamma, beta, dy] = inputs_of(k, gpu);
    const int64_t groups = k.groups;
    expect_matches_f64_cpu([groups](const std::vector<Tensor>& in) { return group_norm(in[0], in[1], in[2], groups); },
                           {x, gamma, beta}, dy, kTol);
  }
}

TEST(GroupNormCuda, LaunchersWriteEveryPoisonedOutput) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.shape << " groups=" << k.groups);
    const int64_t C = k.shape[1];
    Tensor x = random(k.shape, f32, gpu), dy = random(k.shape, f32, gpu);
    Tensor gamma = uniform({C}, 0.5, 1.5, {.dtype = f32, .device = gpu}), beta = random({C}, f32, gpu);
    const GroupNormProblem p = problem_of(x, k.groups);
    const TensorOptions o{.dtype = f32, .device = gpu};
    Tensor y = Tensor::empty(k.shape, o), mean = Tensor::empty({p.N, p.groups}, o), rstd = Tensor::empty({p.N, p.groups}, o);
    for (Tensor* t : {&y, &mean, &rstd}) poison(*t);
    cuda::group_norm_forward(y, mean, rstd, x, gamma, beta, p);

    Tensor rx = ref_of(x), rgamma = ref_of(gamma), rbeta = ref_of(beta);
    const TensorOptions h{.dtype = f64};
    Tensor ry = Tensor::empty(k.shape, h), rmean = Tensor::empty({p.N, p.groups}, h), rrstd = Tensor::empty({p.N, p.groups}, h);
    cpu::group_norm_forward(ry, rmean, rrstd, rx, rgamma, rbeta, p);
    EXPECT_LE(rel_l2(y, ry), kTol);
    EXPECT_LE(rel_l2(mean, rmean), kTol);
    EXPECT_LE(rel_l2(rstd, rrstd), kTol);

    // Backward from the GPU's own statistics; the reference uses the same (f32) values.
    Tensor dx = Tensor::empty(k.shape, o), dgamma = Tensor::empty({C}, o), dbeta = Tensor::empty({C}, o);
    for (Tensor* t : {&dx, &dgamma, &dbeta}) poison(*t);
    cuda::group_norm_backward(dx, dgamma, dbeta, dy, x, gamma, mean, rstd, p);
    Tensor rdx = Tensor::empty(k.shape, h), rdgamma = Tensor::empty({C}, h), rdbeta = Tensor::empty({C}, h);
    cpu::group_norm_backward(rdx, rdgamma, rdbeta, ref_of(dy), rx, rgamma, ref_of(mean), ref_of(rstd), p);
    EXPECT_LE(rel_l2(dx, rdx), kTol);
    EXPECT_LE(rel_l2(dgamma, rdgamma), kTol);
    EXPECT_LE(rel_l2(dbeta, rdbeta), kTol);

    // Each output alone: the launcher must not depend on the others being requested.
    Tensor only_dbeta = Tensor::empty({C}, o);
    poison(only_dbeta);
    cuda::group_norm_backward(Tensor(), Tensor(), only_dbeta, dy, x, gamma, mean, rstd, p);
    EXPECT_LE(rel_l2(only_dbeta, rdbeta), kTol);
  }
}

TEST(GroupNormCuda, DoublePrecisionAndDeterminism) {
  TG_REQUIRE_GPU();
  Tensor x = random({2, 24, 5, 9, 11}, f64), gamma = random({24}, f64), beta = random({24}, f64);
  Tensor y = group_norm(x.cuda(), gamma.cuda(), beta.cuda(), 8);
  EXPECT_LE(rel_l2(y, group_norm(x, gamma, beta, 8)), 1e-12);
  Tensor xf = x.to(f32).cuda();
  auto first = group_norm(xf, Tensor(), Tensor(), 8).to_vector<float>();
  auto second = group_norm(xf, Tensor(), Tensor(), 8).to_vector<float>();
  EXPECT_EQ(first, second);
}

// The fused backward (300+ groups, each within shared memory) in f64, and its gradients the
// same bits run to run (the ranges' sums are added in a fixed order).
TEST(GroupNormCuda, FusedBackwardInDoubleAndDeterministic) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  Tensor x = random({20, 48, 6, 5}, f64, gpu).requires_grad_();
  Tensor gamma = uniform({48}, 0.5, 1.5, {.dtype = f64, .device = gpu}).requires_grad_();
  Tensor beta = random({48}, f64, gpu).requires_grad_();
  expect_matches_f64_cpu([](const std::vector<Tensor>& in) { return group_norm(in[0], in[1], in[2], 16); },
                         {x, gamma, beta}, random({20, 48, 6, 5}, f64, gpu), 1e-12);
  Tensor xf = random({16, 64, 9, 7}, f32, gpu), dy = random({16, 64, 9, 7}, f32, gpu);
  const GroupNormProblem p = problem_of(xf, 32);
  const TensorOptions o{.dtype = f32, .device = gpu};
  Tensor gf = uniform({64}, 0.5, 1.5, o);
  Tensor y = Tensor::empty(xf.shape(), o), mean = Tensor::empty({p.N, p.groups}, o);
  Tensor rstd = Tensor::empty({p.N, p.groups}, o);
  cuda::group_norm_forward(y, mean, rstd, xf, gf, Tensor(), p);
  std::vector<float> runs[2][3];
  for (auto& run : runs) {
    Tensor dx = Tensor::empty(xf.shape(), o), dgamma = Tensor::empty({64}, o), dbeta = Tensor::empty({64}, o);
    poison(dx);
    cuda::group_norm_backward(dx, dgamma, dbeta, dy, xf, gf, mean, rstd, p);
    run[0] = dx.to_vector<float>();
    run[1] = dgamma.to_vector<float>();
    run[2] = dbeta.to_vector<float>();
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "output " << i;
}

// The f64 CPU reference of group_norm_relu / group_norm_add_relu (residual defined) on the GPU
// tensors' values: the output, and the gradients of x, gamma, beta (and the residual) for the
// seed dy. The backward's ReLU mask is taken from the GPU's own output: where an output lies
// within an f32 rounding of 0, the f64 reference's sign may differ, and one element's mask
// would then decide the comparison instead of the kernels.
static void expect_relu_variant_matches_cpu(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& residual,
                                     const Tensor& dy, int64_t groups) {
  auto op = [&](const Tensor& a, const Tensor& g, const Tensor& b, const Tensor& r) {
    return r.defined() ? group_norm_add_relu(a, g, b, groups, r) : group_norm_relu(a, g, b, groups);
  };
  Tensor y;
  {
    Tape tape;
    y = op(x, gamma, beta, residual);
    tape.backward(y, dy);
  }
  auto ref_or_none = [](const Tensor& t) { return t.defined() ? ref_of(t) : Tensor(); };
  auto ref_leaf = [](const Tensor& t) { return t.defined() ? ref_of(t).requires_grad_() : Tensor(); };
  Tensor rx = ref_leaf(x), rgamma = ref_leaf(gamma), rbeta = ref_leaf(beta);
  EXPECT_LE(rel_l2(y, op(ref_of(x), ref_or_none(gamma), ref_or_none(beta), ref_or_none(residual))), kTol) << "output";
  const Tensor g = relu_backward(ref_of(dy), ref_of(y));  // dy where the GPU's output is positive
  {
    Tape tape;
    tape.backward(group_norm(rx, rgamma, rbeta, groups), g);
  }
  EXPECT_LE(rel_l2(x.grad(), rx.grad()), kTol) << "gradient of x";
  if (gamma.defined()) {
    EXPECT_LE(rel_l2(gamma.grad(), rgamma.grad()), kTol) << "gradient of gamma";
  }
  if (beta.defined()) {
    EXPECT_LE(rel_l2(beta.grad(), rbeta.grad()), kTol) << "gradient of beta";
  }
  if (residual.defined()) {
    EXPECT_LE(rel_l2(residual.grad(), g), kTol) << "gradient of the residual";
  }
}

// group_norm_relu on the GPU: against the f64 CPU reference on every case (the fused backward,
// the unfused one and the sliced forward among them), and bit for bit against relu(group_norm)
// on the GPU (the mask applied to dy is the relu op's own).
TEST(GroupNormCuda, GroupNormReluMatchesCpuAndTheTwoOps) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.shape << " groups=" << k.groups << " affine=" << k.affine);
    auto [x, gamma, beta, dy] = inputs_of(k, gpu);
    const int64_t groups = k.groups;
    expect_relu_variant_matches_cpu(x, gamma, beta, Tensor(), dy, groups);
    if (beta.defined()) beta.zero_grad();
    std::vector<float> got[3], want[3];
    for (int fused = 0; fused < 2; ++fused) {
      x.zero_grad();
      if (k.affine) gamma.zero_grad();
      Tape tape;
      Tensor y = fused ? group_norm_relu(x, gamma, beta, groups) : relu(group_norm(x, gamma, beta, groups));
      tape.backward(y, dy);
      auto& out = fused ? got : want;
      out[0] = y.to_vector<float>();
      out[1] = x.grad().to_vector<float>();
      out[2] = k.affine ? gamma.grad().to_vector<float>() : std::vector<float>();
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], want[i]) << "output " << i;
  }
}

// group_norm_add_relu on the GPU: against the f64 CPU reference (the forward's sliced and
// unsliced kernels), and bit for bit against relu(group_norm + residual) on the GPU.
TEST(GroupNormCuda, GroupNormAddReluMatchesCpuAndTheThreeOps) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << k.shape << " groups=" << k.groups << " affine=" << k.affine);
    auto [x, gamma, beta, dy] = inputs_of(k, gpu);
    Tensor r = random(k.shape, f32, gpu).requires_grad_();
    const int64_t groups = k.groups;
    expect_relu_variant_matches_cpu(x, gamma, beta, r, dy, groups);
    if (gamma.defined()) gamma.zero_grad();
    if (beta.defined()) beta.zero_grad();
    std::vector<float> got[3], want[3];
    for (int fused = 0; fused < 2; ++fused) {
      x.zero_grad();
      r.zero_grad();
      Tape tape;
      Tensor y = fused ? group_norm_add_relu(x, gamma, beta, groups, r)
                       : relu(add(group_norm(x, gamma, beta, groups), r));
      tape.backward(y, dy);
      auto& out = fused ? got : want;
      out[0] = y.to_vector<float>();
      out[1] = x.grad().to_vector<float>();
      out[2] = r.grad().to_vector<float>();
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], want[i]) << "output " << i;
  }
}

// The launchers with a half x (f32 values elsewhere) against the same launchers on its exact
// f32 copy: y, the statistics and the parameter gradients bit for bit, dx the f32 copy's dx
// rounded once to the half type. Every case (sliced forward, fused and unfused backward),
// plain, with the ReLU and with a residual; outputs poisoned.
TEST(GroupNormCuda, HalfInputGivesTheF32ResultsOfItsValues) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  const TensorOptions o{.dtype = f32, .device = gpu};
  for (DType half : kHalves) {
    for (const Case& k : kCases) {
      for (int variant = 0; variant < 3; ++variant) {  // plain, ReLU, residual + ReLU
        SCOPED_TRACE(testing::Message() << half << " " << k.shape << " groups=" << k.groups << " variant=" << variant);
        const int64_t C = k.shape[1];
        const Tensor xh = random(k.shape, f32, gpu).to(half), xf = xh.to(f32);
        Tensor gamma, beta;
        if (k.affine) {
          gamma = uniform({C}, 0.5, 1.5, o);
          beta = random({C}, f32, gpu);
        }
        const Tensor residual = variant == 2 ? random(k.shape, f32, gpu) : Tensor();
        GroupNormProblem p = problem_of(xh, k.groups);
        p.relu = variant > 0;
        Tensor y[2], mean[2], rstd[2];
        for (int i = 0; i < 2; ++i) {
          y[i] = poisoned_gpu(k.shape);
          mean[i] = poisoned_gpu({p.N, p.groups});
          rstd[i] = poisoned_gpu({p.N, p.groups});
          cuda::group_norm_forward(y[i], mean[i], rstd[i], i ? xf : xh, gamma, beta, p, residual);
        }
        EXPECT_EQ(y[0].to_vector<float>(), y[1].to_vector<float>()) << "y";
        EXPECT_EQ(mean[0].to_vector<float>(), mean[1].to_vector<float>()) << "mean";
        EXPECT_EQ(rstd[0].to_vector<float>(), rstd[1].to_vector<float>()) << "rstd";

        // The backward of group_norm (the residual's ReLU is applied before it, by the op).
        GroupNormProblem pb = p;
        pb.relu = variant == 1;
        const Tensor dy = random(k.shape, f32, gpu);
        Tensor dxh = poisoned_gpu(k.shape, half), dxf = poisoned_gpu(k.shape);
        Tensor dg[2], db[2];
        for (int i = 0; i < 2; ++i) {
          if (k.affine) dg[i] = poisoned_gpu({C});
          db[i] = poisoned_gpu({C});
          cuda::group_norm_backward(i ? dxf : dxh, dg[i], db[i], dy, i ? xf : xh, gamma, mean[i], rstd[i], pb,
                                    pb.relu ? y[i] : Tensor());
        }
        EXPECT_EQ(half_bits(dxh), half_bits(dxf.to(half))) << "dx";
        if (k.affine) EXPECT_EQ(dg[0].to_vector<float>(), dg[1].to_vector<float>()) << "dgamma";
        EXPECT_EQ(db[0].to_vector<float>(), db[1].to_vector<float>()) << "dbeta";
      }
    }
  }
}

// group_norm, group_norm_relu and group_norm_add_relu under Autocast on a half activation: an
// f32 result and the gradients of an explicit f32 copy of it (outside the scope), bit for bit.
TEST(GroupNormCuda, AutocastReadsHalfActivationsAsTheyAre) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  const Shape shape{6, 32, 9, 11};
  const int64_t groups = 8;
  for (DType half : kHalves) {
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(testing::Message() << half << " variant=" << variant);
      Tensor x = random(shape, f32, gpu).requires_grad_();
      Tensor gamma = uniform({32}, 0.5, 1.5, {.dtype = f32, .device = gpu}).requires_grad_();
      Tensor beta = random({32}, f32, gpu).requires_grad_();
      Tensor r = random(shape, f32, gpu).requires_grad_();
      const Tensor dy = random(shape, f32, gpu);
      auto op = [&](const Tensor& a) {
        return variant == 0   ? group_norm(a, gamma, beta, groups)
               : variant == 1 ? group_norm_relu(a, gamma, beta, groups)
                              : group_norm_add_relu(a, gamma, beta, groups, r);
      };
      std::vector<float> got[5];
      for (int direct = 1; direct >= 0; --direct) {
        for (Tensor* t : {&x, &gamma, &beta, &r}) t->zero_grad();
        Tape tape;
        Tensor y;
        if (direct) {
          Autocast ac(half);
          y = op(x.to(half));  // the half activation, read by the kernels
        } else {
          y = op(x.to(half).to(f32));
        }
        ASSERT_EQ(y.dtype(), f32);
        tape.backward(y, dy);
        const std::vector<float> now[5] = {y.to_vector<float>(), x.grad().to_vector<float>(),
                                           gamma.grad().to_vector<float>(), beta.grad().to_vector<float>(),
                                           variant == 2 ? r.grad().to_vector<float>() : std::vector<float>()};
        if (direct) {
          for (int i = 0; i < 5; ++i) got[i] = now[i];
        } else {
          for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i], now[i]) << "output " << i;
        }
      }
    }
  }
}
