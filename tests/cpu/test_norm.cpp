// group_norm on the CPU: values against a direct-loop definition, gradients of x, gamma and
// beta against central differences at ranks 3, 4 and 5, and the error paths.
#include <algorithm>
#include <cmath>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

// The definition, in f64 loops over (n, g): two-pass mean and biased variance.
std::vector<double> group_norm_loop(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t G,
                                    double eps) {
  auto vx = x.to_vector<double>();
  const int64_t N = x.size(0), C = x.size(1), HW = x.numel() / (N * C), D = C / G;
  std::vector<double> vg = gamma.defined() ? gamma.to_vector<double>() : std::vector<double>(C, 1.0);
  std::vector<double> vb = beta.defined() ? beta.to_vector<double>() : std::vector<double>(C, 0.0);
  std::vector<double> y(vx.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      double mean = 0, var = 0;
      for (int64_t c = g * D; c < (g + 1) * D; ++c)
        for (int64_t i = 0; i < HW; ++i) mean += vx[(n * C + c) * HW + i];
      mean /= double(D * HW);
      for (int64_t c = g * D; c < (g + 1) * D; ++c)
        for (int64_t i = 0; i < HW; ++i) var += std::pow(vx[(n * C + c) * HW + i] - mean, 2);
      var /= double(D * HW);
      for (int64_t c = g * D; c < (g + 1) * D; ++c)
        for (int64_t i = 0; i < HW; ++i) {
          int64_t k = (n * C + c) * HW + i;
          y[k] = (vx[k] - mean) / std::sqrt(var + eps) * vg[c] + vb[c];
        }
    }
  return y;
}

void expect_all_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

const std::vector<Shape> kShapes = {{2, 6, 5}, {2, 6, 3, 4}, {2, 6, 2, 3, 2}};

}  // namespace

TEST(GroupNorm, ValuesMatchLoopAtRanks3To5) {
  for (const Shape& s : kShapes)
    for (int64_t G : {1, 3, 6}) {
      SCOPED_TRACE(testing::Message() << s << " groups=" << G);
      Tensor x = random(s), gamma = uniform({6}, 0.5, 1.5, {.dtype = f64}), beta = random({6});
      expect_all_near(group_norm(x, gamma, beta, G, 1e-5).to_vector<double>(),
                      group_norm_loop(x, gamma, beta, G, 1e-5), 1e-12);
      expect_all_near(group_norm(x, Tensor(), Tensor(), G, 0.1).to_vector<double>(),
                      group_norm_loop(x, Tensor(), Tensor(), G, 0.1), 1e-12);
    }
}

TEST(GroupNorm, EpsIsInsideTheSqrtAndVarianceIsBiased) {
  // One group of {1, 3}: mean 2, biased variance 1, so y = (x - 2) / sqrt(1 + eps).
  Tensor x = from_vector(std::vector<double>{1.0, 3.0}, {1, 1, 2});
  auto y = group_norm(x, Tensor(), Tensor(), 1, 0.25).to_vector<double>();
  EXPECT_NEAR(y[0], -1.0 / std::sqrt(1.25), 1e-15);
  EXPECT_NEAR(y[1], 1.0 / std::sqrt(1.25), 1e-15);
}

TEST(GroupNorm, GroupNormGrad) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << s);
    Tensor x = param(s), gamma = param({6}), beta = param({6});
    TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return group_norm(in[0], in[1], in[2], 3); },
                        std::vector<Tensor>({x, gamma, beta}));
  }
}

TEST(GroupNorm, GroupNormGradOneGroupAndOneGroupPerChannel) {
  Tensor x = param({2, 6, 3, 4}), gamma = param({6}), beta = param({6});
  for (int64_t G : {1, 6}) {
    SCOPED_TRACE(testing::Message() << "groups=" << G);
    TG_EXPECT_GRADCHECK([G](const std::vector<Tensor>& in) { return group_norm(in[0], in[1], in[2], G); },
                        std::vector<Tensor>({x, gamma, beta}));
  }
}

TEST(GroupNorm, GroupNormGradWithoutAffineAndWithGammaOnly) {
  Tensor x = param({2, 6, 5}), gamma = param({6});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return group_norm(in[0], Tensor(), Tensor(), 2); },
                      std::vector<Tensor>({x}));
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return group_norm(in[0], in[1], Tensor(), 2); },
                      std::vector<Tensor>({x, gamma}));
  // gamma and beta alone (x does not require grad): the parameter-only backward path.
  Tensor xc = random({2, 6, 5}), beta = param({6});
  TG_EXPECT_GRADCHECK([xc](const std::vector<Tensor>& in) { return group_norm(xc, in[0], in[1], 3); },
                      std::vector<Tensor>({gamma, beta}));
}

TEST(GroupNorm, ParameterGradientsMatchDefinition) {
  // dbeta_c = sum dy over (n, hw); dgamma_c = sum dy * xhat, with xhat = group_norm without affine.
  Tensor x = random({2, 6, 3, 4}), gamma = param({6}), beta = param({6}), dy = random({2, 6, 3, 4});
  {
    Tape tape;
    tape.backward(group_norm(x, gamma, beta, 3), dy);
  }
  auto xhat = group_norm(x, Tensor(), Tensor(), 3).to_vector<double>(), vdy = dy.to_vector<double>();
  std::vector<double> dg(6, 0.0), db(6, 0.0);
  for (size_t k = 0; k < vdy.size(); ++k) {
    int64_t c = (k / 12) % 6;
    dg[c] += vdy[k] * xhat[k];
    db[c] += vdy[k];
  }
  expect_all_near(gamma.grad().to_vector<double>(), dg, 1e-12);
  expect_all_near(beta.grad().to_vector<double>(), db, 1e-12);
}

// Groups of 1e4 plus a few ulps: f32 gradients against the same op in f64 on the same
// values. A mean rounded to f32 would shift every deviation by ulp(1e4), of their order.
TEST(GroupNorm, LargeMeanKeepsItsPrecisionInBackward) {
  const float ulp = std::nextafter(1e4f, 2e4f) - 1e4f;
  std::vector<float> v(2 * 4 * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1e4f + ulp * float(i % 4);  // group means 7/6, 11/6 ulps
  const Tensor c = random({2, 4, 3}, f64);
  const Tensor gamma0 = random({4}, f64);
  std::vector<std::vector<double>> grads;
  for (DType t : {f32, f64}) {
    Tensor x = from_vector(v, {2, 4, 3}).to(t).requires_grad_();
    Tensor gamma = gamma0.to(t).requires_grad_();
    Tape tape;
    tape.backward(sum(group_norm(x, gamma, Tensor(), 2) * c.to(t)));
    grads.push_back(x.grad().to_vector<double>());
    grads.push_back(gamma.grad().to_vector<double>());
  }
  expect_all_near(grads[0], grads[2], 2e-3);  // dx: f32 against f64
  expect_all_near(grads[1], grads[3], 2e-3);  // dgamma
}

TEST(GroupNorm, BadArgumentsAreRejected) {
  Tensor x = random({2, 6, 5});
  TG_EXPECT_ERROR(group_norm(x, Tensor(), Tensor(), 4), "group_norm: 6 channels are not divisible into 4 groups");
  TG_EXPECT_ERROR(group_norm(x, Tensor(), Tensor(), 0), "group_norm: groups must be positive");
  TG_EXPECT_ERROR(group_norm(random({2, 6}), Tensor(), Tensor(), 3), "group_norm: input must be (N, C, *)",
                  "f64[2, 6]");
  TG_EXPECT_ERROR(group_norm(x, random({5}), Tensor(), 3), "group_norm: gamma [5] does not match the 6 channels",
                  "[2, 6, 5]");
  TG_EXPECT_ERROR(group_norm(x, random({6}), random({6, 1}), 3), "group_norm: beta [6, 1]");
  TG_EXPECT_ERROR(group_norm(x, random({6}, f32), Tensor(), 3), "group_norm", "dtypes differ", "f32[6]");
  TG_EXPECT_ERROR(group_norm(random({2, 6, 0}), Tensor(), Tensor(), 3), "group_norm", "empty spatial extent");
  TG_EXPECT_ERROR(group_norm(x, Tensor(), Tensor(), 3, -1.0), "group_norm: eps must be finite and non-negative");
}

// An infinite eps would make every rstd 0 and the output silently beta (zeros without it), a
// NaN one NaN: both are rejected as layer_norm rejects them, by the op and by the kernels.
TEST(GroupNorm, NonFiniteEpsIsRejected) {
  const Tensor x = random({2, 6, 5});
  for (double eps : {INFINITY, -INFINITY, NAN}) {
    TG_EXPECT_ERROR(group_norm(x, Tensor(), Tensor(), 3, eps), "group_norm: eps must be finite and non-negative");
    TG_EXPECT_ERROR(group_norm_relu(x, Tensor(), Tensor(), 3, eps), "group_norm_relu: eps must be finite");
    TG_EXPECT_ERROR(group_norm_add_relu(x, Tensor(), Tensor(), 3, random({2, 6, 5}), eps),
                    "group_norm_add_relu: eps must be finite");
    const GroupNormProblem p{.N = 2, .C = 6, .HW = 5, .groups = 3, .eps = eps};
    Tensor y = Tensor::empty({2, 6, 5}, {.dtype = f64});
    Tensor mean = Tensor::empty({2, 3}, {.dtype = f64}), rstd = Tensor::empty({2, 3}, {.dtype = f64});
    TG_EXPECT_ERROR(cpu::group_norm_forward(y, mean, rstd, x, Tensor(), Tensor(), p),
                    "group_norm_forward: eps must be finite");
  }
}

// group_norm_relu is relu(group_norm(...)) in one op: the same values and, with the ReLU's
// mask applied to dy first, the same gradients, bit for bit (same formulas in the same order),
// in f64 and f32, with and without gamma / beta, at ranks 3 to 5. Beta shifts half the
// outputs below zero so that the mask matters.
TEST(GroupNorm, GroupNormReluIsReluOfGroupNorm) {
  for (DType dt : {f64, f32})
    for (const Shape& s : kShapes)
      for (bool affine : {true, false}) {
        SCOPED_TRACE(testing::Message() << s << " " << dtype_name(dt) << (affine ? " affine" : ""));
        Tensor x = random(s, dt).requires_grad_();
        Tensor gamma = affine ? random({6}, dt).requires_grad_() : Tensor();
        Tensor beta = affine ? random({6}, dt).requires_grad_() : Tensor();
        Tensor dy = random(s, dt);
        std::vector<double> got[4], want[4];
        for (int fused = 0; fused < 2; ++fused) {
          Tape tape;
          Tensor y = fused ? group_norm_relu(x, gamma, beta, 3) : relu(group_norm(x, gamma, beta, 3));
          tape.backward(y, dy);
          auto& out = fused ? got : want;
          out[0] = y.to_vector<double>();
          out[1] = x.grad().to_vector<double>();
          out[2] = affine ? gamma.grad().to_vector<double>() : std::vector<double>();
          out[3] = affine ? beta.grad().to_vector<double>() : std::vector<double>();
          x.zero_grad();
          if (affine) {
            gamma.zero_grad();
            beta.zero_grad();
          }
        }
        for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], want[i]) << "output " << i;
        int64_t zeros = 0;
        for (double v : got[0]) zeros += v == 0.0;
        EXPECT_GT(zeros, 0) << "the ReLU clamped nothing: the test would not see the mask";
      }
}

TEST(GroupNorm, GroupNormReluGrad) {
  Tensor x = param({2, 6, 3, 4}), gamma = param({6}), beta = param({6});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return group_norm_relu(in[0], in[1], in[2], 3); },
                      std::vector<Tensor>({x, gamma, beta}));
}

TEST(GroupNorm, GroupNormReluErrorsNameIt) {
  Tensor x = random({2, 6, 5});
  TG_EXPECT_ERROR(group_norm_relu(x, Tensor(), Tensor(), 4), "group_norm_relu: 6 channels are not divisible into 4");
  TG_EXPECT_ERROR(group_norm_relu(x, random({5}), Tensor(), 3), "group_norm_relu: gamma [5] does not match");
}

// The module option runs the same op: nn::GroupNorm{.relu = true} is relu(nn::GroupNorm).
TEST(GroupNorm, ModuleReluOptionIsReluOfTheNorm) {
  nn::GroupNorm plain(nn::GroupNormOptions{.num_groups = 3, .num_channels = 6});
  nn::GroupNorm fused(nn::GroupNormOptions{.num_groups = 3, .num_channels = 6, .relu = true});
  fused.weight.copy_(random({6}, f32));
  fused.bias.copy_(random({6}, f32));
  plain.weight.copy_(fused.weight);
  plain.bias.copy_(fused.bias);
  Tensor x = random({2, 6, 7}, f32);
  const std::vector<float> y = fused(x).to_vector<float>();
  EXPECT_EQ(y, relu(plain(x)).to_vector<float>());
  EXPECT_GT(std::count(y.begin(), y.end(), 0.0f), 0) << "the ReLU clamped nothing";
}

// group_norm_add_relu is relu(group_norm(...) + residual): the same values and gradients (x,
// gamma, beta and the residual's) bit for bit as the three ops, in f64 and f32, at ranks 3-5.
TEST(GroupNorm, GroupNormAddReluIsReluOfGroupNormPlusResidual) {
  for (DType dt : {f64, f32})
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << s << " " << dtype_name(dt));
      Tensor x = random(s, dt).requires_grad_(), r = random(s, dt).requires_grad_();
      Tensor gamma = random({6}, dt).requires_grad_(), beta = random({6}, dt).requires_grad_();
      Tensor dy = random(s, dt);
      std::vector<double> got[5], want[5];
      for (int fused = 0; fused < 2; ++fused) {
        for (Tensor* t : {&x, &r, &gamma, &beta}) t->zero_grad();
        Tape tape;
        Tensor y = fused ? group_norm_add_relu(x, gamma, beta, 3, r) : relu(add(group_norm(x, gamma, beta, 3), r));
        tape.backward(y, dy);
        auto& out = fused ? got : want;
        out[0] = y.to_vector<double>();
        out[1] = x.grad().to_vector<double>();
        out[2] = r.grad().to_vector<double>();
        out[3] = gamma.grad().to_vector<double>();
        out[4] = beta.grad().to_vector<double>();
      }
      for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i], want[i]) << "output " << i;
      EXPECT_GT(std::count(got[0].begin(), got[0].end(), 0.0), 0) << "the ReLU clamped nothing";
    }
}

TEST(GroupNorm, GroupNormAddReluGradAndErrors) {
  Tensor x = param({2, 6, 3, 4}), gamma = param({6}), beta = param({6}), r = param({2, 6, 3, 4});
  TG_EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) { return group_norm_add_relu(in[0], in[1], in[2], 3, in[3]); },
      std::vector<Tensor>({x, gamma, beta, r}));
  Tensor xc = random({2, 6, 5});
  TG_EXPECT_ERROR(group_norm_add_relu(xc, Tensor(), Tensor(), 3, random({2, 6, 4})),
                  "group_norm_add_relu: residual [2, 6, 4] does not match input [2, 6, 5]");
  TG_EXPECT_ERROR(group_norm_add_relu(xc, Tensor(), Tensor(), 3, random({2, 6, 5}, f32)), "group_norm_add_relu",
                  "dtypes differ");
  TG_EXPECT_ERROR(group_norm_add_relu(xc, Tensor(), Tensor(), 3, Tensor()), "group_norm_add_relu: the residual");
  nn::GroupNorm with_relu(nn::GroupNormOptions{.num_groups = 3, .num_channels = 6, .relu = true});
  TG_EXPECT_ERROR(with_relu.forward_add_relu(random({2, 6, 5}, f32), random({2, 6, 5}, f32)), "forward_add_relu");
}

// The CPU launchers take one dtype: a half x with f32 statistics (what the CUDA kernels read
// under Autocast) is a DTypeError before any work. Under Autocast the op gives a half CPU
// activation an f32 copy: the results and gradients of that copy.
TEST(GroupNorm, CpuLaunchersTakeOneDtype) {
  const GroupNormProblem p{.N = 2, .C = 4, .HW = 5, .groups = 2};
  const Tensor xh = random({2, 4, 5}, f32).to(DType::bf16);
  Tensor y = Tensor::empty({2, 4, 5}, {.dtype = f32}), mean = Tensor::empty({2, 2}, {.dtype = f32});
  Tensor rstd = Tensor::empty({2, 2}, {.dtype = f32});
  EXPECT_THROW(cpu::group_norm_forward(y, mean, rstd, xh, Tensor(), Tensor(), p), DTypeError);
  TG_EXPECT_ERROR(cpu::group_norm_forward(y, mean, rstd, xh, Tensor(), Tensor(), p), "group_norm_forward",
                  "CUDA kernels only");
  Tensor dx = Tensor::empty({2, 4, 5}, {.dtype = DType::bf16});
  EXPECT_THROW(cpu::group_norm_backward(dx, Tensor(), Tensor(), y, xh, Tensor(), mean, rstd, p), DTypeError);

  Tensor x = random({2, 4, 5}, f32).requires_grad_(), gamma = param({4}, f32);
  const Tensor dy = random({2, 4, 5}, f32);
  std::vector<float> results[2][3];
  for (int autocast = 0; autocast < 2; ++autocast) {
    x.zero_grad();
    gamma.zero_grad();
    Tape tape;
    Tensor out;
    if (autocast) {
      Autocast ac(DType::bf16);
      out = group_norm_relu(x.to(DType::bf16), gamma, Tensor(), 2);
    } else {
      out = group_norm_relu(x.to(DType::bf16).to(f32), gamma, Tensor(), 2);
    }
    ASSERT_EQ(out.dtype(), f32);
    tape.backward(out, dy);
    results[autocast][0] = out.to_vector<float>();
    results[autocast][1] = x.grad().to_vector<float>();
    results[autocast][2] = gamma.grad().to_vector<float>();
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(results[0][i], results[1][i]) << "output " << i;
}
