// conv3d_group_norm_mean on the CPU: values against a direct-loop definition in f64,
// gradients against central differences, equality with the unfused composition
// conv3d -> group_norm -> mean, the tape entry, error paths, and the module.
// gamma is always random and non-uniform: with gamma equal within a group the output is
// mean(beta) for any input, and a test with it would pass for a kernel that skips the conv.
#include <cmath>
#include <vector>

#include "common/test_util.h"
#include "nn/fused.h"
#include "ops/fused.h"

using namespace tg;
using namespace tg::test;

namespace {

struct Case {
  int64_t N, C, D, H, W, K, groups, k = 3;
};

struct Inputs {
  Tensor x, w, b, gamma, beta;
  std::vector<Tensor> all() const { return {x, w, b, gamma, beta}; }
};

// Random inputs; gamma in [0.5, 1.5) differs in every channel.
Inputs make_inputs(const Case& c, DType dt, bool grad) {
  Inputs in;
  in.x = random({c.N, c.C, c.D, c.H, c.W}, dt);
  in.w = random({c.K, c.C, c.k, c.k, c.k}, dt);
  in.b = random({c.K}, dt);
  in.gamma = uniform({c.K}, 0.5, 1.5, {.dtype = dt});
  in.beta = random({c.K}, dt);
  if (grad)
    for (Tensor* t : {&in.x, &in.w, &in.b, &in.gamma, &in.beta}) t->requires_grad_();
  return in;
}

Tensor fused(const std::vector<Tensor>& in, int64_t groups) {
  return conv3d_group_norm_mean(in[0], in[1], in[2], in[3], in[4], groups);
}

Tensor unfused(const std::vector<Tensor>& in, int64_t groups) {
  return mean(group_norm(conv3d(in[0], in[1], in[2]), in[3], in[4], groups), {1, 2, 3, 4});
}

// The definition, written out: conv, GroupNorm with biased variance, mean.
std::vector<double> direct_loops(const Inputs& in, const Case& c, double eps) {
  auto x = in.x.to_vector<double>(), w = in.w.to_vector<double>(), b = in.b.to_vector<double>();
  auto gm = in.gamma.to_vector<double>(), bt = in.beta.to_vector<double>();
  const int64_t OD = c.D - c.k + 1, OH = c.H - c.k + 1, OW = c.W - c.k + 1, V = OD * OH * OW;
  const int64_t cpg = c.K / c.groups;
  std::vector<double> out(c.N);
  for (int64_t n = 0; n < c.N; ++n) {
    std::vector<double> y(c.K * V);
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t d = 0; d < OD; ++d)
        for (int64_t h = 0; h < OH; ++h)
          for (int64_t q = 0; q < OW; ++q) {
            double s = b[k];
            for (int64_t ci = 0; ci < c.C; ++ci)
              for (int64_t a = 0; a < c.k; ++a)
                for (int64_t e = 0; e < c.k; ++e)
                  for (int64_t f = 0; f < c.k; ++f)
                    s += w[(((k * c.C + ci) * c.k + a) * c.k + e) * c.k + f] *
                         x[(((n * c.C + ci) * c.D + d + a) * c.H + h + e) * c.W + q + f];
            y[k * V + (d * OH + h) * OW + q] = s;
          }
    double total = 0;
    for (int64_t g = 0; g < c.groups; ++g) {
      double m = 0, var = 0;
      for (int64_t i = g * cpg * V; i < (g + 1) * cpg * V; ++i) m += y[i];
      m /= cpg * V;
      for (int64_t i = g * cpg * V; i < (g + 1) * cpg * V; ++i) var += (y[i] - m) * (y[i] - m);
      var /= cpg * V;
      for (int64_t k = g * cpg; k < (g + 1) * cpg; ++k)
        for (int64_t v = 0; v < V; ++v) total += gm[k] * (y[k * V + v] - m) / std::sqrt(var + eps) + bt[k];
    }
    out[n] = total / (c.K * V);
  }
  return out;
}

const std::vector<Case> kOddCases = {
    {.N = 2, .C = 1, .D = 5, .H = 6, .W = 7, .K = 4, .groups = 1},
    {.N = 2, .C = 2, .D = 3, .H = 5, .W = 4, .K = 6, .groups = 6},  // groups = C: one channel each
    {.N = 1, .C = 3, .D = 4, .H = 3, .W = 5, .K = 6, .groups = 3},
    {.N = 2, .C = 4, .D = 3, .H = 4, .W = 3, .K = 4, .groups = 2},
};

}  // namespace

TEST(Conv3dGroupNormMean, ForwardMatchesDirectLoops) {
  for (const Case& c : {Case{.N = 3, .C = 3, .D = 7, .H = 9, .W = 13, .K = 6, .groups = 2},
                        Case{.N = 2, .C = 2, .D = 5, .H = 5, .W = 5, .K = 4, .groups = 4},
                        Case{.N = 2, .C = 1, .D = 4, .H = 6, .W = 5, .K = 6, .groups = 3, .k = 2}}) {
    SCOPED_TRACE(::testing::Message() << "C=" << c.C << " K=" << c.K << " groups=" << c.groups << " k=" << c.k);
    Inputs in = make_inputs(c, f64, false);
    Tensor out = conv3d_group_norm_mean(in.x, in.w, in.b, in.gamma, in.beta, c.groups, 1e-5);
    ASSERT_EQ(out.shape(), Shape({c.N}));
    auto ref = direct_loops(in, c, 1e-5);
    auto got = out.to_vector<double>();
    for (int64_t n = 0; n < c.N; ++n) EXPECT_NEAR(got[n], ref[n], 1e-12 * (1 + std::abs(ref[n])));
  }
}

TEST(Conv3dGroupNormMean, Conv3dGroupNormMeanGradAllInputs) {
  for (const Case& c : kOddCases) {
    SCOPED_TRACE(::testing::Message() << "C=" << c.C << " K=" << c.K << " groups=" << c.groups);
    Inputs in = make_inputs(c, f64, true);
    TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& v) { return fused(v, c.groups); }, in.all());
  }
}

TEST(Conv3dGroupNormMean, Conv3dGroupNormMeanGradWithoutInputGrad) {
  // The usual training case: x is data; only the parameters need gradients.
  const Case c{.N = 3, .C = 3, .D = 5, .H = 4, .W = 5, .K = 6, .groups = 2};
  Inputs in = make_inputs(c, f64, true);
  in.x.requires_grad_(false);
  TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& v) {
    return conv3d_group_norm_mean(in.x, v[0], v[1], v[2], v[3], c.groups);
  }, std::vector<Tensor>({in.w, in.b, in.gamma, in.beta}));
}

TEST(Conv3dGroupNormMean, Conv3dGroupNormMeanGradNoBiasNoAffine) {
  const Case c{.N = 2, .C = 2, .D = 4, .H = 5, .W = 3, .K = 4, .groups = 2};
  Inputs in = make_inputs(c, f64, true);
  TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& v) {
    return conv3d_group_norm_mean(v[0], v[1], Tensor(), v[2], Tensor(), c.groups);
  }, std::vector<Tensor>({in.x, in.w, in.gamma}));
}

// Forward and every gradient of both graphs for one seed gradient.
std::vector<Tensor> values_and_grads(const Inputs& in, int64_t groups, const Tensor& seed, bool use_fused) {
  Tape tape;
  Inputs i = in;
  for (Tensor* t : {&i.x, &i.w, &i.b, &i.gamma, &i.beta}) *t = t->clone().requires_grad_();
  Tensor out = use_fused ? fused(i.all(), groups) : unfused(i.all(), groups);
  std::vector<Tensor> r = {out.detach()};
  tape.backward(out, seed);
  for (const Tensor& t : i.all()) r.push_back(t.grad());
  return r;
}

TEST(Conv3dGroupNormMean, EqualsUnfusedCompositionF32) {
  for (const Case& c : {Case{.N = 3, .C = 3, .D = 9, .H = 7, .W = 13, .K = 24, .groups = 8},
                        Case{.N = 2, .C = 1, .D = 5, .H = 9, .W = 7, .K = 6, .groups = 1},
                        Case{.N = 2, .C = 4, .D = 7, .H = 5, .W = 9, .K = 8, .groups = 8}}) {
    SCOPED_TRACE(::testing::Message() << "C=" << c.C << " K=" << c.K << " groups=" << c.groups);
    Inputs in = make_inputs(c, f32, false);
    Tensor seed = random({c.N}, f32);
    auto a = values_and_grads(in, c.groups, seed, true);
    auto b = values_and_grads(in, c.groups, seed, false);
    EXPECT_LE(rel_l2(a[0], b[0]), 1e-5) << "output";
    const char* names[] = {"x", "w", "b", "gamma", "beta"};
    for (int k = 0; k < 5; ++k) {
      if (c.groups == c.K && k < 4) {
        // One channel per group: each channel's normalized mean is 0, out = mean(beta), and
        // the true gradients are zero (the unfused graph leaves rounding noise in them).
        for (float v : a[k + 1].to_vector<float>()) EXPECT_LE(std::abs(v), 1e-6) << names[k];
        continue;
      }
      EXPECT_LE(rel_l2(a[k + 1], b[k + 1]), 1e-5) << names[k];
    }
  }
}

TEST(Conv3dGroupNormMean, GradientsEqualUnfusedCompositionF64) {
  const Case c{.N = 2, .C = 3, .D = 6, .H = 5, .W = 7, .K = 6, .groups = 3};
  Inputs in = make_inputs(c, f64, false);
  Tensor seed = random({c.N});
  auto a = values_and_grads(in, c.groups, seed, true);
  auto b = values_and_grads(in, c.groups, seed, false);
  for (int k = 0; k < 6; ++k) EXPECT_LE(rel_l2(a[k], b[k]), 1e-11) << "output/input " << k;
}

TEST(Conv3dGroupNormMean, ChangingWeightChangesOutput) {
  // Guards against a kernel that skips the convolution: with non-uniform gamma the output
  // depends on w, and so does its gradient with respect to w.
  const Case c{.N = 2, .C = 3, .D = 5, .H = 6, .W = 7, .K = 6, .groups = 2};
  Inputs in = make_inputs(c, f32, false);
  Tensor before = fused(in.all(), c.groups);
  Tensor w2 = in.w + random(in.w.shape(), f32) * 0.5;
  Tensor after = conv3d_group_norm_mean(in.x, w2, in.b, in.gamma, in.beta, c.groups);
  auto vb = before.to_vector<float>(), va = after.to_vector<float>();
  for (int64_t n = 0; n < c.N; ++n) EXPECT_GT(std::abs(vb[n] - va[n]), 1e-4) << "sample " << n;
  // And with uniform gamma the output is mean(beta) for any input: the trap, documented.
  Tensor ones_gamma = ones({c.K});
  Tensor flat = conv3d_group_norm_mean(in.x, w2, in.b, ones_gamma, in.beta, c.groups);
  const double mean_beta = mean(in.beta).item();
  for (float v : flat.to_vector<float>()) EXPECT_NEAR(v, mean_beta, 1e-5);
  // The weight gradient is nonzero with non-uniform gamma.
  Tape tape;
  Tensor w = in.w.clone().requires_grad_();
  tape.backward(sum(conv3d_group_norm_mean(in.x, w, in.b, in.gamma, in.beta, c.groups)));
  double norm2 = 0;
  for (float g : w.grad().to_vector<float>()) norm2 += double(g) * g;
  EXPECT_GT(norm2, 1e-10);
}

TEST(Conv3dGroupNormMean, RecordsOneTapeEntry) {
  const Case c{.N = 2, .C = 2, .D = 4, .H = 4, .W = 4, .K = 4, .groups = 2};
  Inputs in = make_inputs(c, f32, true);
  Tape tape;
  Tensor out = fused(in.all(), c.groups);
  ASSERT_EQ(tape.entries().size(), 1u);
  EXPECT_EQ(tape.entries()[0].op, "conv3d_group_norm_mean");
  EXPECT_EQ(tape.entries()[0].inputs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(tape.entries()[0].inputs[i].same(in.all()[i]));
  // Nothing is recorded without a tape or without inputs that require grad.
  Tape other;
  Inputs plain = make_inputs(c, f32, false);
  fused(plain.all(), c.groups);
  EXPECT_TRUE(other.entries().empty());
}

TEST(Conv3dGroupNormMean, InPlaceChangeOfSavedInputIsCaught) {
  const Case c{.N = 2, .C = 2, .D = 4, .H = 4, .W = 4, .K = 4, .groups = 2};
  Inputs in = make_inputs(c, f64, true);
  Tape tape;
  Tensor out = sum(fused(in.all(), c.groups));
  in.w.fill_(0.5);
  TG_EXPECT_ERROR(tape.backward(out), "conv3d_group_norm_mean", "modified in place");
}

TEST(Conv3dGroupNormMean, NormParametersOnlySaveNoInput) {
  // Only gamma, beta and b need gradients: closed form, x and w are not kept alive.
  const Case c{.N = 3, .C = 2, .D = 5, .H = 4, .W = 6, .K = 6, .groups = 2};
  Inputs in = make_inputs(c, f64, false);
  for (Tensor* t : {&in.b, &in.gamma, &in.beta}) t->requires_grad_();
  {
    Tape tape;
    fused(in.all(), c.groups);
    ASSERT_EQ(tape.entries().size(), 1u);
    EXPECT_FALSE(tape.entries()[0].saved[0].defined()) << "x saved without need";
    EXPECT_FALSE(tape.entries()[0].saved[1].defined()) << "w saved without need";
  }
  TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& v) {
    return conv3d_group_norm_mean(in.x, in.w, v[0], v[1], v[2], c.groups);
  }, std::vector<Tensor>({in.b, in.gamma, in.beta}));
  // Switching requires_grad on after the forward pass gets a clear error, not wrong grads.
  Tape tape;
  Tensor out = sum(fused(in.all(), c.groups));
  in.w.requires_grad_();
  TG_EXPECT_ERROR(tape.backward(out), "conv3d_group_norm_mean", "not saved");
}

TEST(Conv3dGroupNormMean, ProblemCarriesThePrecisionItWasDescribedUnder) {
  const Tensor x = random({1, 3, 4, 4, 4}), w = random({6, 3, 3, 3, 3});
  Conv3dGnMeanProblem fp32, tf32;
  {
    PrecisionGuard guard(Precision::FP32);
    fp32 = make_conv3d_gn_mean_problem("test", x, w, Tensor(), 2, 1e-5);
  }
  {
    PrecisionGuard guard(Precision::TF32);
    tf32 = make_conv3d_gn_mean_problem("test", x, w, Tensor(), 2, 1e-5);
  }
  EXPECT_EQ(fp32.precision, Precision::FP32);
  EXPECT_EQ(tf32.precision, Precision::TF32);
}

TEST(Conv3dGroupNormMean, BadArgumentsAreRejected) {
  const Case c{.N = 2, .C = 3, .D = 5, .H = 5, .W = 5, .K = 6, .groups = 2};
  Inputs in = make_inputs(c, f32, false);
  const char* op = "conv3d_group_norm_mean";
  TG_EXPECT_ERROR(conv3d_group_norm_mean(in.x, in.w, in.b, in.gamma, in.beta, 4), op, "6 output channels",
                  "4 groups");
  TG_EXPECT_ERROR(conv3d_group_norm_mean(in.x, in.w, in.b, in.gamma, in.beta, 0), op, "groups must be positive");
  TG_EXPECT_ERROR(conv3d_group_norm_mean(in.x, in.w, in.b, random({5}, f32), in.beta, 2), op, "gamma", "[5]",
                  "expected [6]");
  TG_EXPECT_ERROR(conv3d_group_norm_mean(in.x, in.w, in.b, in.gamma, random({7}, f32), 2), op, "beta", "[7]");
  TG_EXPECT_ERROR(conv3d_group_norm_mean(in.x, in.w, random({3}, f32), in.gamma, in.beta, 2), op, "bias", "[3]");
  TG_EXPECT_ERROR(conv3d_group_norm_mean(random({2, 2, 5, 5, 5}, f32), in.w, in.b, in.gamma, in.beta, 2), op,
                  "[2, 2, 5, 5, 5]", "[6, 3, 3, 3, 3]");
  TG_EXPECT_ERROR(conv3d_group_norm_mean(random({2, 3, 5, 5}, f32), in.w, in.b, in.gamma, in.beta, 2), op,
                  "5-D input", "[2, 3, 5, 5]");
  TG_EXPECT_ERROR(conv3d_group_norm_mean(random({2, 3, 2, 5, 5}, f32), in.w, in.b, in.gamma, in.beta, 2), op,
                  "kernel larger", "[2, 3, 2, 5, 5]");
  TG_EXPECT_ERROR(conv3d_group_norm_mean(in.x.to(f64), in.w, in.b, in.gamma, in.beta, 2), op, "f64", "f32");
  TG_EXPECT_ERROR(conv3d_group_norm_mean(in.x, in.w, in.b, in.gamma, in.beta, 2, -1.0), op, "eps");
  // A non-finite eps would make rstd 0 (or NaN) and the output silently mean(beta).
  for (double eps : {INFINITY, NAN})
    TG_EXPECT_ERROR(conv3d_group_norm_mean(in.x, in.w, in.b, in.gamma, in.beta, 2, eps), op,
                    ": eps must be finite and non-negative");
}

TEST(Conv3dGroupNormMeanModule, PyTorchNamesAndSameFunction) {
  manual_seed(7);
  nn::Conv3dGroupNormMean m({.in_channels = 3, .out_channels = 6, .kernel_size = 3, .num_groups = 2});
  auto named = m.named_parameters();
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named[0].first, "conv.weight");
  EXPECT_EQ(named[1].first, "conv.bias");
  EXPECT_EQ(named[2].first, "norm.weight");
  EXPECT_EQ(named[3].first, "norm.bias");
  EXPECT_EQ(named[0].second.shape(), Shape({6, 3, 3, 3, 3}));
  EXPECT_EQ(named[2].second.to_vector<float>(), std::vector<float>(6, 1.0f));  // GroupNorm's init
  // Same numbers as the layers it replaces, once gamma is perturbed.
  fill_uniform_(m.norm->weight, 0.5, 1.5);
  Tensor x = random({2, 3, 5, 6, 7}, f32);
  Tensor ref = mean(m.norm->forward(m.conv->forward(x)), {1, 2, 3, 4});
  EXPECT_LE(rel_l2(m(x), ref), 1e-5);
  // Training: one tape entry, gradients reach every parameter.
  Tape tape;
  tape.backward(sum(m(x)));
  for (const auto& [name, p] : m.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
  TG_EXPECT_ERROR(m(random({2, 4, 5, 5, 5}, f32)), "Conv3dGroupNormMean", "(N, 3, D, H, W)");
  TG_EXPECT_ERROR(nn::Conv3dGroupNormMean({.in_channels = 3, .out_channels = 6, .num_groups = 4}), "GroupNorm");
}
