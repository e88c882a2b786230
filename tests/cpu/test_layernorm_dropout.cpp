// layer_norm and dropout on the CPU: values against direct loops and known PyTorch values,
// gradients of x, weight and bias against central differences at odd shapes, dropout's
// statistics and exact scaling, its seeding, the nn modules (state-dict names, init, train
// and eval) and the typed errors.
#include <cmath>
#include <set>

#include "common/test_util.h"
#include "ops/cpu/unary_kernels.h"

using namespace tg;
using namespace tg::test;

namespace {

// The definition over the last k dims, in f64: two-pass mean and biased variance per row.
std::vector<double> layer_norm_loop(const Tensor& x, int64_t D, const Tensor& w, const Tensor& b, double eps) {
  auto vx = x.to_vector<double>();
  std::vector<double> vw = w.defined() ? w.to_vector<double>() : std::vector<double>(D, 1.0);
  std::vector<double> vb = b.defined() ? b.to_vector<double>() : std::vector<double>(D, 0.0);
  std::vector<double> y(vx.size());
  for (size_t r = 0; r < vx.size() / size_t(D); ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < D; ++i) mean += vx[r * D + i];
    mean /= double(D);
    for (int64_t i = 0; i < D; ++i) var += std::pow(vx[r * D + i] - mean, 2);
    var /= double(D);
    for (int64_t i = 0; i < D; ++i) y[r * D + i] = (vx[r * D + i] - mean) / std::sqrt(var + eps) * vw[i] + vb[i];
  }
  return y;
}

void expect_all_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

}  // namespace

TEST(LayerNorm, ValuesMatchTheDefinition) {
  manual_seed(1);
  struct Case {
    Shape x;
    std::vector<int64_t> ns;
  };
  for (const Case& c : {Case{{7, 9}, {9}}, Case{{3, 5, 7}, {5, 7}}, Case{{2, 3, 4, 5}, {3, 4, 5}}, Case{{13}, {13}}}) {
    SCOPED_TRACE(c.x.str());
    const Shape ns(c.ns);
    Tensor x = uniform(c.x, -3, 5, {.dtype = f64});
    Tensor w = random(ns), b = random(ns);
    expect_all_near(layer_norm(x, c.ns, w, b).to_vector<double>(), layer_norm_loop(x, ns.numel(), w, b, 1e-5), 1e-12);
    expect_all_near(layer_norm(x, c.ns, w, Tensor(), 0.1).to_vector<double>(),
                    layer_norm_loop(x, ns.numel(), w, Tensor(), 0.1), 1e-12);
    expect_all_near(layer_norm(x, c.ns).to_vector<double>(), layer_norm_loop(x, ns.numel(), Tensor(), Tensor(), 1e-5),
                    1e-12);
    // f32 against the f64 definition.
    Tensor xf = x.to(f32);
    expect_all_near(layer_norm(xf, c.ns, w.to(f32), b.to(f32)).to_vector<double>(),
                    layer_norm_loop(x, ns.numel(), w, b, 1e-5), 1e-5);
  }
}

TEST(LayerNorm, KnownPyTorchValues) {
  // torch.nn.functional.layer_norm(torch.tensor([[1., 2., 4.], [-1., 0., 1.]]), (3,))
  Tensor x = from_vector(std::vector<double>{1, 2, 4, -1, 0, 1}, {2, 3});
  expect_all_near(layer_norm(x, {3}).to_vector<double>(),
                  {-1.0690421, -0.2672605, 1.3363026, -1.2247357, 0.0, 1.2247357}, 1e-6);
}

TEST(LayerNorm, LargeMeanKeepsItsPrecision) {
  // A naive E[x^2] - E[x]^2 in f32 loses everything at a mean of 1e4 and a spread of 1e-2.
  std::vector<float> v(257);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1e4f + 0.01f * float(int(i % 7) - 3);
  Tensor x = from_vector(v, {1, 257});
  Tensor y = layer_norm(x, {257});
  expect_all_near(y.to_vector<double>(), layer_norm_loop(x.to(f64), 257, Tensor(), Tensor(), 1e-5), 2e-3);
}

// The same in backward: rows of 1e4 plus a few ulps. Its gradients against the same op in
// f64 on the same values (exact means there); a mean rounded to f32 shifts every xhat by
// ulp(1e4) * rstd, of the order of xhat itself here.
TEST(LayerNorm, LargeMeanKeepsItsPrecisionInBackward) {
  const float ulp = std::nextafter(1e4f, 2e4f) - 1e4f;
  std::vector<float> v(3 * 8);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1e4f + ulp * float(i % 3 + (i / 8 == 1 ? 1 : 0));
  const Tensor c = random({3, 8}, f64);
  const Tensor w0 = random({8}, f64);
  std::vector<std::vector<double>> grads;
  for (DType t : {f32, f64}) {
    Tensor x = from_vector(v, {3, 8}).to(t).requires_grad_();
    Tensor w = w0.to(t).requires_grad_();
    Tape tape;
    tape.backward(sum(layer_norm(x, {8}, w) * c.to(t)));
    grads.push_back(x.grad().to_vector<double>());
    grads.push_back(w.grad().to_vector<double>());
  }
  expect_all_near(grads[0], grads[2], 2e-3);  // dx: f32 against f64
  expect_all_near(grads[1], grads[3], 2e-3);  // dweight
}

TEST(LayerNorm, GradcheckAtOddShapes) {
  manual_seed(2);
  struct Case {
    Shape x;
    std::vector<int64_t> ns;
  };
  for (const Case& c : {Case{{7, 9}, {9}}, Case{{3, 5, 7}, {5, 7}}, Case{{2, 3, 13}, {13}}, Case{{9}, {9}}}) {
    SCOPED_TRACE(c.x.str());
    const Shape ns(c.ns);
    auto ln = [ns = c.ns](const std::vector<Tensor>& in) { return layer_norm(in[0], ns, in[1], in[2], 1e-5); };
    TG_EXPECT_GRADCHECK(ln, (std::vector<Tensor>{param(c.x), param(ns), param(ns)}));
    // Without bias, and without either parameter.
    TG_EXPECT_GRADCHECK(ln, (std::vector<Tensor>{param(c.x), param(ns), Tensor()}));
    TG_EXPECT_GRADCHECK(ln, (std::vector<Tensor>{param(c.x), Tensor(), Tensor()}));
    // Gradients of the parameters alone (x a constant).
    TG_EXPECT_GRADCHECK(ln, (std::vector<Tensor>{random(c.x), param(ns), param(ns)}));
  }
}

TEST(LayerNorm, ParameterGradientsAreTheRowSums) {
  manual_seed(3);
  Tensor x = random({5, 7}), w = param({7}), b = param({7});
  Tensor dy = random({5, 7});
  {
    Tape tape;
    tape.backward(layer_norm(x, {7}, w, b), dy);
  }
  const auto xhat = layer_norm_loop(x, 7, Tensor(), Tensor(), 1e-5);
  const auto g = dy.to_vector<double>();
  std::vector<double> dw(7, 0.0), db(7, 0.0);
  for (int r = 0; r < 5; ++r)
    for (int i = 0; i < 7; ++i) {
      dw[i] += g[r * 7 + i] * xhat[r * 7 + i];
      db[i] += g[r * 7 + i];
    }
  ASSERT_EQ(w.grad().shape(), Shape({7}));
  expect_all_near(w.grad().to_vector<double>(), dw, 1e-12);
  expect_all_near(b.grad().to_vector<double>(), db, 1e-12);
}

TEST(LayerNorm, EmptyBatchGivesZeroParameterGradients) {
  Tensor x = Tensor::empty({0, 5}, {.dtype = f64}).requires_grad_();
  Tensor w = param({5}), b = param({5});
  Tensor y;
  {
    Tape tape;
    y = layer_norm(x, {5}, w, b);
    tape.backward(y, Tensor::empty({0, 5}, {.dtype = f64}));
  }
  EXPECT_EQ(y.shape(), Shape({0, 5}));
  expect_all_near(w.grad().to_vector<double>(), std::vector<double>(5, 0.0), 0);
  expect_all_near(b.grad().to_vector<double>(), std::vector<double>(5, 0.0), 0);
}

TEST(LayerNorm, Errors) {
  Tensor x = random({4, 6});
  TG_EXPECT_ERROR(layer_norm(x, {5}), "layer_norm: normalized_shape [5] does not match the trailing dims of input");
  TG_EXPECT_ERROR(layer_norm(x, {2, 4, 6}), "layer_norm: normalized_shape [2, 4, 6] has more dims than input");
  TG_EXPECT_ERROR(layer_norm(x, {}), "layer_norm: normalized_shape must name at least one dim");
  TG_EXPECT_ERROR(layer_norm(x, {6}, random({5})), "layer_norm: weight [5] does not match normalized_shape [6]");
  TG_EXPECT_ERROR(layer_norm(x, {6}, random({6}), random({6, 1})), "layer_norm: bias [6, 1]");
  TG_EXPECT_ERROR(layer_norm(x, {6}, random({6}, f32)), "layer_norm");
  TG_EXPECT_ERROR(layer_norm(x, {6}, Tensor(), Tensor(), -1.0), "layer_norm: eps must be finite and non-negative");
  EXPECT_THROW(layer_norm(x, {5}), ShapeError);
  EXPECT_THROW(layer_norm(x, {6}, random({6}, f32)), DTypeError);
  EXPECT_THROW(layer_norm(from_vector(std::vector<int64_t>{1, 2}, {2}), {2}), DTypeError);
  // The kernel entry checks its buffers too.
  const LayerNormProblem p{.M = 4, .D = 6};
  Tensor y = Tensor::empty({4, 6}, {.dtype = f64}), mean = Tensor::empty({4}, {.dtype = f64});
  TG_EXPECT_ERROR(cpu::layer_norm_forward(y, mean, Tensor::empty({3}, {.dtype = f64}), x, Tensor(), Tensor(), p),
                  "layer_norm_forward: rstd f64[3] on cpu must hold 4 elements");
  const LayerNormProblem inf_eps{.M = 4, .D = 6, .eps = INFINITY};
  TG_EXPECT_ERROR(cpu::layer_norm_forward(y, mean, Tensor::empty({4}, {.dtype = f64}), x, Tensor(), Tensor(), inf_eps),
                  "layer_norm_forward: eps must be finite and non-negative");
}

TEST(LayerNorm, ModuleNamesInitAndForward) {
  manual_seed(4);
  nn::LayerNorm ln({.normalized_shape = {3, 5}});
  std::vector<std::string> names;
  for (const auto& [name, t] : ln.state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(ln.weight.shape(), Shape({3, 5}));
  expect_all_near(ln.weight.to_vector<double>(), std::vector<double>(15, 1.0), 0);
  expect_all_near(ln.bias.to_vector<double>(), std::vector<double>(15, 0.0), 0);
  EXPECT_TRUE(ln.weight.requires_grad());
  // Perturbed parameters, so the forward tests more than the normalization.
  ln.weight.copy_(uniform({3, 5}, 0.5, 1.5));
  ln.bias.copy_(uniform({3, 5}, -1, 1));
  Tensor x = random({2, 3, 5}, f32);
  expect_all_near(ln(x).to_vector<double>(),
                  layer_norm_loop(x.to(f64), 15, ln.weight.to(f64), ln.bias.to(f64), 1e-5), 1e-5);

  nn::LayerNorm plain({.normalized_shape = {4}, .elementwise_affine = false});
  EXPECT_TRUE(plain.state_dict().empty());
  nn::LayerNorm no_bias({.normalized_shape = {4}, .bias = false});
  EXPECT_EQ(no_bias.state_dict().size(), 1u);
  TG_EXPECT_ERROR(nn::LayerNorm({.normalized_shape = {}}), "LayerNorm: normalized_shape must name");
  TG_EXPECT_ERROR(nn::LayerNorm({.normalized_shape = {4}, .eps = 0}), "LayerNorm: eps must be positive");
}

// ---- dropout ------------------------------------------------------------------------------

TEST(Dropout, KeptFractionAndExactScaling) {
  for (double p : {0.1, 0.5, 0.8}) {
    SCOPED_TRACE(p);
    const int64_t n = 200003;
    Tensor x = uniform({n}, 1.0, 2.0, {.dtype = f64});
    Tensor y = dropout(x, {.p = p, .seed = 17});
    auto vx = x.to_vector<double>(), vy = y.to_vector<double>();
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (vy[i] == 0) continue;
      ++kept;
      ASSERT_EQ(vy[i], vx[i] * (1.0 / (1.0 - p))) << i;  // exact: one rounding
    }
    // Binomial: the standard deviation of the kept fraction is sqrt(p (1-p) / n) < 1.2e-3.
    EXPECT_NEAR(double(kept) / double(n), 1.0 - p, 6e-3);
  }
}

TEST(Dropout, MaskIsTheCounterBasedGenerator) {
  Tensor x = ones({3, 7, 9}, {.dtype = f64});
  Tensor y = dropout(x, {.p = 0.3, .seed = 5, .offset = 11});
  auto vy = y.to_vector<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const bool keep = uniform_at(5, 11 + uint64_t(i)) >= 0.3;
    EXPECT_EQ(vy[i], keep ? 1.0 / 0.7 : 0.0) << i;
  }
}

TEST(Dropout, SeedsAndTheGlobalGenerator) {
  Tensor x = random({1000});
  auto mask = [](const Tensor& y) {
    std::vector<bool> m;
    for (double v : y.to_vector<double>()) m.push_back(v != 0);
    return m;
  };
  EXPECT_EQ(mask(dropout(x, {.p = 0.5, .seed = 1})), mask(dropout(x, {.p = 0.5, .seed = 1})));
  EXPECT_NE(mask(dropout(x, {.p = 0.5, .seed = 1})), mask(dropout(x, {.p = 0.5, .seed = 2})));
  EXPECT_NE(mask(dropout(x, {.p = 0.5, .seed = 1})), mask(dropout(x, {.p = 0.5, .seed = 1, .offset = 1000})));
  // Without a seed: successive calls differ, and re-seeding the generator repeats them.
  manual_seed(9);
  auto a1 = mask(dropout(x, 0.5)), a2 = mask(dropout(x, 0.5));
  manual_seed(9);
  auto b1 = mask(dropout(x, 0.5)), b2 = mask(dropout(x, 0.5));
  EXPECT_NE(a1, a2);
  EXPECT_EQ(a1, b1);
  EXPECT_EQ(a2, b2);
}

TEST(Dropout, IdentityZerosAndEdgeProbabilities) {
  Tensor x = random({7, 9});
  EXPECT_TRUE(dropout(x, 0.5, /*training=*/false).same(x));
  EXPECT_TRUE(dropout(x, 0.0).same(x));
  EXPECT_TRUE(dropout2d(random({2, 3, 4, 5}), {.p = 0.5, .training = false}).defined());
  for (double v : dropout(x, 1.0).to_vector<double>()) ASSERT_EQ(v, 0.0);
  for (double v : dropout3d(random({2, 3, 2, 2, 2}), {.p = 1.0, .seed = 3}).to_vector<double>()) ASSERT_EQ(v, 0.0);
  Tensor empty = Tensor::empty({0, 4}, {.dtype = f64});
  EXPECT_EQ(dropout(empty, {.p = 0.5, .seed = 1}).shape(), Shape({0, 4}));
}

TEST(Dropout, ChannelFormsDropWholeChannels) {
  for (int spatial : {2, 3}) {
    SCOPED_TRACE(spatial);
    const Shape s = spatial == 2 ? Shape{5, 13, 3, 7} : Shape{5, 13, 3, 2, 7};
    const int64_t inner = s.numel() / 65;
    Tensor x = uniform(s, 1.0, 2.0, {.dtype = f64});
    const DropoutParams params{.p = 0.4, .seed = 23};
    Tensor y = spatial == 2 ? dropout2d(x, params) : dropout3d(x, params);
    auto vx = x.to_vector<double>(), vy = y.to_vector<double>();
    int kept = 0;
    for (int64_t u = 0; u < 65; ++u) {
      const bool keep = uniform_at(23, uint64_t(u)) >= 0.4;
      kept += keep;
      for (int64_t i = u * inner; i < (u + 1) * inner; ++i)
        ASSERT_EQ(vy[i], keep ? vx[i] * (1.0 / 0.6) : 0.0) << "channel " << u << " element " << i;
    }
    EXPECT_GT(kept, 0);
    EXPECT_LT(kept, 65);
    // Unbatched input: (C, H, W) / (C, D, H, W), channels are the leading dim.
    Shape unbatched(std::vector<int64_t>(s.dims().begin() + 1, s.dims().end()));
    Tensor xu = random(unbatched);
    Tensor yu = spatial == 2 ? dropout2d(xu, params) : dropout3d(xu, params);
    EXPECT_EQ(yu.shape(), unbatched);
  }
}

TEST(Dropout, GradientIsTheSameMask) {
  // The op is linear in x for a fixed seed, so gradcheck applies; odd shapes.
  auto f = [](const std::vector<Tensor>& in) { return dropout(in[0], {.p = 0.3, .seed = 77}); };
  TG_EXPECT_GRADCHECK(f, (std::vector<Tensor>{param({7, 9, 13})}));
  auto f2 = [](const std::vector<Tensor>& in) { return dropout2d(in[0], {.p = 0.5, .seed = 78}); };
  TG_EXPECT_GRADCHECK(f2, (std::vector<Tensor>{param({3, 7, 5, 3})}));
  auto f3 = [](const std::vector<Tensor>& in) { return dropout3d(in[0], {.p = 0.5, .seed = 79}); };
  TG_EXPECT_GRADCHECK(f3, (std::vector<Tensor>{param({3, 7, 3, 5, 3})}));
  // And explicitly: dx = dy * mask / (1 - p).
  Tensor x = param({9, 7});
  Tensor dy = random({9, 7});
  Tensor y;
  {
    Tape tape;
    y = dropout(x, {.p = 0.25, .seed = 4});
    tape.backward(y, dy);
  }
  auto vy = y.to_vector<double>(), vx = x.to_vector<double>(), g = dy.to_vector<double>();
  auto dx = x.grad().to_vector<double>();
  for (size_t i = 0; i < vy.size(); ++i) EXPECT_EQ(dx[i], vy[i] == 0 ? 0.0 : g[i] * (1.0 / 0.75)) << i;
}

TEST(Dropout, Errors) {
  Tensor x = random({4, 6});
  TG_EXPECT_ERROR(dropout(x, 1.5), "dropout: dropout probability has to be between 0 and 1, but got 1.5");
  TG_EXPECT_ERROR(dropout(x, -0.1), "dropout: dropout probability");
  TG_EXPECT_ERROR(dropout(x, std::nan("")), "dropout: dropout probability");
  TG_EXPECT_ERROR(dropout2d(x, {.p = 0.5}), "dropout2d: expects a 4-D (batched) or 3-D (unbatched) input, got");
  TG_EXPECT_ERROR(dropout3d(random({2, 3, 4}), {.p = 0.5}), "dropout3d: expects a 5-D (batched) or 4-D");
  EXPECT_THROW(dropout2d(x, {.p = 0.5}), ShapeError);
  EXPECT_THROW(dropout(from_vector(std::vector<int64_t>{1, 2}, {2}), 0.5), DTypeError);
  Tensor out = Tensor::empty({5, 6}, {.dtype = f64});
  TG_EXPECT_ERROR(cpu::dropout_apply(out, x, {.units = 24, .inner = 1, .p = 0.5}), "dropout_apply: input",
                  "units*inner = 24*1");
  TG_EXPECT_ERROR(nn::Dropout({.p = 2.0}), "Dropout: dropout probability has to be between 0 and 1");
}

TEST(Dropout, ModulesTrainEvalAndAdvancingSeeds) {
  Tensor x = uniform({4, 3, 5, 7}, 1.0, 2.0, {.dtype = f64});
  manual_seed(31);
  nn::Dropout d({.p = 0.5});
  nn::Dropout2d d2({.p = 0.5});
  nn::Dropout3d d3({.p = 0.5});
  EXPECT_TRUE(d.state_dict().empty());
  Tensor y1 = d(x), y2 = d(x);
  EXPECT_NE(y1.to_vector<double>(), y2.to_vector<double>());  // successive calls differ
  EXPECT_EQ(d.offset(), uint64_t(2 * x.numel()));
  // The same program run again gives the same masks.
  manual_seed(31);
  nn::Dropout again({.p = 0.5});
  EXPECT_EQ(again.seed(), d.seed());
  EXPECT_EQ(again(x).to_vector<double>(), y1.to_vector<double>());
  EXPECT_EQ(again(x).to_vector<double>(), y2.to_vector<double>());
  // Channel forms: one counter per channel.
  Tensor z = d2(x);
  EXPECT_EQ(d2.offset(), 12u);
  auto vz = z.to_vector<double>();
  for (int64_t c = 0; c < 12; ++c)
    for (int64_t i = 1; i < 35; ++i) ASSERT_EQ(vz[c * 35 + i] == 0, vz[c * 35] == 0);
  EXPECT_EQ(d3(x.reshape({4, 3, 5, 7, 1})).shape(), Shape({4, 3, 5, 7, 1}));
  // eval(): the identity, and no counters used.
  d.eval();
  EXPECT_TRUE(d(x).same(x));
  EXPECT_EQ(d.offset(), uint64_t(2 * x.numel()));
  d.train();
  EXPECT_FALSE(d(x).same(x));
  // An explicit seed.
  nn::Dropout s1({.p = 0.3, .seed = 99}), s2({.p = 0.3, .seed = 99});
  EXPECT_EQ(s1(x).to_vector<double>(), s2(x).to_vector<double>());
}
