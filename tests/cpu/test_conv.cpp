// conv2d / conv3d on the CPU: forward values against the direct definition, gradients against
// central differences (f64), NHWC against NCHW, the tape entry, and every validation error.
#include <chrono>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Geometry {
  int64_t stride[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, dil[3] = {1, 1, 1};
};

// The definition, written independently of the library (own output sizes, own indexing):
// y[n,k,o] = b[k] + sum_{c,t} x[n,c,o*stride - pad + t*dil] * w[k,c,t], zero outside x.
// Calls visit(y_index, x_index, w_index) for every product term of that sum, so one loop
// nest gives the forward pass and both gradients. x (N, C, D, H, W), w (K, C, kd, kh, kw).
struct Direct {
  int64_t N, C, K, in[3], ker[3], out[3];
  Direct(const Shape& xs, const Shape& ws, const Geometry& g) : N(xs[0]), C(xs[1]), K(ws[0]) {
    for (int d = 0; d < 3; ++d) {
      in[d] = xs[2 + d];
      ker[d] = ws[2 + d];
      out[d] = (in[d] + 2 * g.pad[d] - g.dil[d] * (ker[d] - 1) - 1) / g.stride[d] + 1;
    }
  }
  Shape y_shape() const { return {N, K, out[0], out[1], out[2]}; }
  template <class Visit>
  void run(const Geometry& g, Visit&& visit) const {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t od = 0; od < out[0]; ++od)
          for (int64_t oh = 0; oh < out[1]; ++oh)
            for (int64_t ow = 0; ow < out[2]; ++ow)
              for (int64_t c = 0; c < C; ++c)
                for (int64_t a = 0; a < ker[0]; ++a)
                  for (int64_t i = 0; i < ker[1]; ++i)
                    for (int64_t j = 0; j < ker[2]; ++j) {
                      int64_t id = od * g.stride[0] - g.pad[0] + a * g.dil[0];
                      int64_t ih = oh * g.stride[1] - g.pad[1] + i * g.dil[1];
                      int64_t iw = ow * g.stride[2] - g.pad[2] + j * g.dil[2];
                      if (id < 0 || id >= in[0] || ih < 0 || ih >= in[1] || iw < 0 || iw >= in[2]) continue;
                      visit((((n * K + k) * out[0] + od) * out[1] + oh) * out[2] + ow,
                            (((n * C + c) * in[0] + id) * in[1] + ih) * in[2] + iw,
                            (((k * C + c) * ker[0] + a) * ker[1] + i) * ker[2] + j);
                    }
  }
};

Tensor direct_conv3d(const Tensor& x, const Tensor& w, const Tensor& b, const Geometry& g) {
  Direct d(x.shape(), w.shape(), g);
  auto vx = x.to_vector<double>(), vw = w.to_vector<double>();
  std::vector<double> vy(static_cast<size_t>(d.y_shape().numel()), 0.0);
  d.run(g, [&](int64_t yi, int64_t xi, int64_t wi) { vy[yi] += vx[xi] * vw[wi]; });
  if (b.defined()) {
    auto vb = b.to_vector<double>();
    const int64_t per_channel = d.out[0] * d.out[1] * d.out[2];
    for (size_t i = 0; i < vy.size(); ++i) vy[i] += vb[(i / per_channel) % d.K];
  }
  return from_vector(vy, d.y_shape());
}

// Gradients of sum(conv(x, w) * dy) by the definition: {dx, dw}.
std::pair<Tensor, Tensor> direct_conv3d_grads(const Tensor& x, const Tensor& w, const Tensor& dy,
                                              const Geometry& g) {
  Direct d(x.shape(), w.shape(), g);
  auto vx = x.to_vector<double>(), vw = w.to_vector<double>(), vg = dy.to_vector<double>();
  std::vector<double> dx(vx.size(), 0.0), dw(vw.size(), 0.0);
  d.run(g, [&](int64_t yi, int64_t xi, int64_t wi) {
    dx[xi] += vg[yi] * vw[wi];
    dw[wi] += vg[yi] * vx[xi];
  });
  return {from_vector(dx, x.shape()), from_vector(dw, w.shape())};
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

// Gradchecks conv2d (N=2, C=3, H=7, W=9, K=4, 3x3) with respect to x, w and b.
void gradcheck_conv2d(const ConvParams& p, bool bias) {
  Shape xs = p.layout == Layout::NHWC ? Shape{2, 7, 9, 3} : Shape{2, 3, 7, 9};
  Tensor x = param(xs), w = param({4, 3, 3, 3});
  Tensor b = bias ? param({4}) : Tensor();
  Fn fn = [p](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], p); };
  TG_EXPECT_GRADCHECK(fn, std::vector<Tensor>({x, w, b}));
}

// Gradchecks conv3d (N=2, C=2, D=5, H=6, W=7, K=3, kernel 3) with respect to x, w and b.
void gradcheck_conv3d(const ConvParams& p, bool bias, Shape kernel = {3, 3, 3}) {
  Tensor x = param({2, 2, 5, 6, 7}), w = param({3, 2, kernel[0], kernel[1], kernel[2]});
  Tensor b = bias ? param({3}) : Tensor();
  Fn fn = [p](const std::vector<Tensor>& in) { return conv3d(in[0], in[1], in[2], p); };
  TG_EXPECT_GRADCHECK(fn, std::vector<Tensor>({x, w, b}));
}

}  // namespace

// ---- forward values -------------------------------------------------------------------

TEST(Conv2d, ForwardMatchesDirectLoop) {
  struct Case { ConvParams p; Geometry g; bool bias; };
  std::vector<Case> cases = {
      {{}, {}, true},
      {{.padding = {1}}, {{1, 1, 1}, {0, 1, 1}, {1, 1, 1}}, true},
      {{.stride = {2}}, {{1, 2, 2}, {0, 0, 0}, {1, 1, 1}}, false},
      {{.dilation = {2}}, {{1, 1, 1}, {0, 0, 0}, {1, 2, 2}}, true},
      {{.stride = {2, 1}, .padding = {2, 0}, .dilation = {1, 2}}, {{1, 2, 1}, {0, 2, 0}, {1, 1, 2}}, true},
  };
  for (const Case& c : cases) {
    Tensor x = random({2, 3, 7, 9}), w = random({4, 3, 3, 3}), b = c.bias ? random({4}) : Tensor();
    Tensor y = conv2d(x, w, b, c.p);
    Tensor ref = direct_conv3d(x.reshape({2, 3, 1, 7, 9}), w.reshape({4, 3, 1, 3, 3}), b, c.g);
    ASSERT_EQ(y.shape(), Shape({2, 4, ref.size(3), ref.size(4)}));
    EXPECT_LT(max_abs_diff(y.reshape(ref.shape()), ref), 1e-12);
  }
}

TEST(Conv2d, OutputShapeUsesDilatedExtent) {
  Tensor x = random({1, 2, 13, 9}), w = random({5, 2, 3, 3});
  // extent 5 (dilation 2), padding 1: (13 + 2 - 5) / 2 + 1 = 6, (9 + 2 - 5) / 2 + 1 = 4
  EXPECT_EQ(conv2d(x, w, {}, {.stride = {2}, .padding = {1}, .dilation = {2}}).shape(), Shape({1, 5, 6, 4}));
  EXPECT_EQ(conv_output_size(13, 3, 2, 1, 2), 6);
  EXPECT_EQ(conv2d(x, w, {}, {.stride = {3, 1}}).shape(), Shape({1, 5, 4, 7}));
}

TEST(Conv2d, F32MatchesF64) {
  Tensor x = random({2, 3, 7, 9}), w = random({4, 3, 3, 3}), b = random({4});
  ConvParams p{.stride = {2}, .padding = {1}};
  Tensor y64 = conv2d(x, w, b, p);
  Tensor y32 = conv2d(x.to(f32), w.to(f32), b.to(f32), p);
  EXPECT_EQ(y32.dtype(), f32);
  EXPECT_LT(rel_l2(y32, y64), 1e-6);
}

TEST(Conv3d, ForwardMatchesDirectLoop) {
  Tensor x = random({2, 3, 5, 6, 7}), w = random({4, 3, 3, 2, 3}), b = random({4});
  EXPECT_LT(max_abs_diff(conv3d(x, w, b), direct_conv3d(x, w, b, {})), 1e-12);
  ConvParams p{.stride = {2, 1, 2}, .padding = {1, 2, 0}, .dilation = {1, 2, 2}};
  Geometry g{{2, 1, 2}, {1, 2, 0}, {1, 2, 2}};
  EXPECT_LT(max_abs_diff(conv3d(x, w, Tensor(), p), direct_conv3d(x, w, Tensor(), g)), 1e-12);
}

// Channel counts large enough that the CPU kernel splits each sample's output positions
// into several column chunks (its buffer is bounded): values and gradients must not notice.
TEST(Conv3d, ChunkedColumnsMatchDirectLoop) {
  Tensor x = random({2, 64, 8, 9, 10}), w = random({2, 64, 3, 3, 3}), b = random({2});
  Geometry g;
  Tensor y = conv3d(x, w, b);
  EXPECT_LT(max_abs_diff(y, direct_conv3d(x, w, b, g)), 1e-12);
  Tensor dy = random(y.shape());
  auto [dx, dw] = direct_conv3d_grads(x, w, dy, g);
  EXPECT_LT(max_abs_diff(conv_backward_input(dy, w, x.shape()), dx), 1e-12);
  EXPECT_LT(max_abs_diff(conv_backward_weight(dy, x, w.shape()), dw), 1e-11);
}

TEST(Conv2d, ChunkedColumnsNHWCMatchDirectLoop) {
  Tensor x = random({1, 32, 33, 35}), w = random({3, 32, 3, 3});
  ConvParams p{.padding = {1}, .layout = Layout::NHWC};
  Geometry g{{1, 1, 1}, {0, 1, 1}, {1, 1, 1}};
  Tensor x5 = x.reshape({1, 32, 1, 33, 35}), w5 = w.reshape({3, 32, 1, 3, 3});
  Tensor xl = x.permute({0, 2, 3, 1});
  Tensor y = conv2d(xl, w, Tensor(), p);
  Tensor ref = direct_conv3d(x5, w5, Tensor(), g);
  EXPECT_LT(max_abs_diff(y, ref.reshape({1, 3, 33, 35}).permute({0, 2, 3, 1})), 1e-12);
  Tensor dy = random(ref.shape());
  auto [dx, dw] = direct_conv3d_grads(x5, w5, dy, g);
  Tensor dyl = dy.reshape({1, 3, 33, 35}).permute({0, 2, 3, 1});
  EXPECT_LT(max_abs_diff(conv_backward_input(dyl, w, xl.shape(), p), dx.reshape(x.shape()).permute({0, 2, 3, 1})),
            1e-12);
  EXPECT_LT(max_abs_diff(conv_backward_weight(dyl, xl, w.shape(), p), dw.reshape(w.shape())), 1e-11);
}

TEST(Conv2d, GradsMatchDirectLoop) {
  struct Case { Shape x, w; ConvParams p; Geometry g; };
  std::vector<Case> cases = {
      {{2, 3, 7, 9}, {4, 3, 3, 3}, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {2, 1}},
       {{1, 2, 1}, {0, 1, 2}, {1, 2, 1}}},
      // kernel wider than the input: some taps read only padding for every output column
      {{2, 3, 7, 4}, {4, 3, 3, 5}, {.padding = {0, 1}}, {{1, 1, 1}, {0, 0, 1}, {1, 1, 1}}},
      {{1, 2, 9, 13}, {3, 2, 2, 3}, {.stride = {3}, .padding = {2}, .dilation = {2}},
       {{1, 3, 3}, {0, 2, 2}, {1, 2, 2}}},
  };
  for (const Case& c : cases) {
    Tensor x = random(c.x), w = random(c.w);
    Tensor x5 = x.reshape({c.x[0], c.x[1], 1, c.x[2], c.x[3]}), w5 = w.reshape({c.w[0], c.w[1], 1, c.w[2], c.w[3]});
    Tensor y = conv2d(x, w, Tensor(), c.p);
    Tensor ref = direct_conv3d(x5, w5, Tensor(), c.g);
    ASSERT_EQ(y.reshape(ref.shape()).shape(), ref.shape());
    EXPECT_LT(max_abs_diff(y.reshape(ref.shape()), ref), 1e-12);
    Tensor dy = random(y.shape());
    auto [dx, dw] = direct_conv3d_grads(x5, w5, dy.reshape(ref.shape()), c.g);
    EXPECT_LT(max_abs_diff(conv_backward_input(dy, w, x.shape(), c.p), dx.reshape(x.shape())), 1e-12);
    EXPECT_LT(max_abs_diff(conv_backward_weight(dy, x, w.shape(), c.p), dw.reshape(w.shape())), 1e-12);
  }
}

// ---- gradients --------------------------------------------------------------------------

TEST(Conv2d, Grad) { gradcheck_conv2d({}, true); }
TEST(Conv2d, GradPad1) { gradcheck_conv2d({.padding = {1}}, true); }
TEST(Conv2d, GradStride2) { gradcheck_conv2d({.stride = {2}}, true); }
TEST(Conv2d, GradDilation2) { gradcheck_conv2d({.dilation = {2}}, true); }
TEST(Conv2d, GradNoBias) { gradcheck_conv2d({.padding = {1}}, false); }
TEST(Conv2d, GradMixedPerDimParams) {
  gradcheck_conv2d({.stride = {2, 3}, .padding = {2, 1}, .dilation = {1, 2}}, true);
}
TEST(Conv2d, GradNHWC) { gradcheck_conv2d({.stride = {2}, .padding = {1}, .layout = Layout::NHWC}, true); }

TEST(Conv2d, NHWCEqualsNCHWPermuted) {
  Tensor x = random({2, 3, 7, 9}), w = random({4, 3, 3, 3}), b = random({4});
  for (ConvParams p : {ConvParams{.padding = {1}}, ConvParams{.stride = {2}, .dilation = {2}}}) {
    ConvParams pl = p;
    pl.layout = Layout::NHWC;
    Tensor x1 = x.clone().requires_grad_(), w1 = w.clone().requires_grad_(), b1 = b.clone().requires_grad_();
    Tensor x2 = x.permute({0, 2, 3, 1}).requires_grad_(), w2 = w.clone().requires_grad_(),
           b2 = b.clone().requires_grad_();
    Tensor y1, y2, seed;
    {
      Tape tape;
      y1 = conv2d(x1, w1, b1, p);
      seed = random(y1.shape());
      tape.backward(y1, seed);
    }
    {
      Tape tape;
      y2 = conv2d(x2, w2, b2, pl);
      tape.backward(y2, seed.permute({0, 2, 3, 1}));  // the same seed, channels-last
    }
    ASSERT_EQ(y2.shape(), Shape({y1.size(0), y1.size(2), y1.size(3), y1.size(1)}));
    EXPECT_LT(max_abs_diff(y2, y1.permute({0, 2, 3, 1})), 1e-12);
    EXPECT_LT(max_abs_diff(x2.grad(), x1.grad().permute({0, 2, 3, 1})), 1e-12);
    EXPECT_LT(max_abs_diff(w2.grad(), w1.grad()), 1e-12);
    EXPECT_LT(max_abs_diff(b2.grad(), b1.grad()), 1e-12);
  }
}

TEST(Conv3d, Grad) { gradcheck_conv3d({}, true); }
TEST(Conv3d, GradPad1) { gradcheck_conv3d({.padding = {1}}, true); }
TEST(Conv3d, GradStride2) { gradcheck_conv3d({.stride = {2}, .padding = {1}}, true); }
TEST(Conv3d, GradDilation2NoBias) { gradcheck_conv3d({.dilation = {2, 1, 2}}, false, {2, 3, 3}); }
TEST(Conv3d, GradMixedPerDimParams) {
  gradcheck_conv3d({.stride = {1, 2, 3}, .padding = {0, 1, 2}, .dilation = {2, 1, 1}}, true, {2, 3, 1});
}

// ---- the tape entry and the explicit backward functions -----------------------------------

TEST(Conv2d, RecordsOneEntryAndOnlyNeededGrads) {
  Tensor x = random({2, 3, 7, 9}), w = param({4, 3, 3, 3}), b = random({4});
  Tape tape;
  Tensor y = conv2d(x, w, b, {.padding = {1}});
  ASSERT_EQ(tape.entries().size(), 1u);
  EXPECT_EQ(tape.entries()[0].op, "conv2d");
  ASSERT_EQ(tape.entries()[0].inputs.size(), 3u);
  EXPECT_TRUE(tape.entries()[0].inputs[2].same(b));
  tape.backward(sum(y));
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(Conv2d, NotRecordedWithoutTape) {
  Tensor x = param({1, 2, 5, 5}), w = param({3, 2, 3, 3});
  Tensor y = conv2d(x, w);
  EXPECT_TRUE(y.is_leaf());
  EXPECT_FALSE(y.requires_grad());
}

TEST(Conv, BackwardFunctionsMatchTape) {
  Tensor x = param({2, 3, 7, 9}), w = param({4, 3, 3, 3}), b = param({4});
  ConvParams p{.stride = {2}, .padding = {1}, .dilation = {2}};
  Tensor seed = random({2, 4, 3, 4});
  {
    Tape tape;
    Tensor y = conv2d(x, w, b, p);
    ASSERT_EQ(y.shape(), seed.shape());
    tape.backward(y, seed);
  }
  EXPECT_LT(max_abs_diff(conv_backward_input(seed, w.detach(), x.shape(), p), x.grad()), 1e-14);
  EXPECT_LT(max_abs_diff(conv_backward_weight(seed, x.detach(), w.shape(), p), w.grad()), 1e-14);
  EXPECT_LT(max_abs_diff(conv_backward_bias(seed), b.grad()), 1e-14);
  // the bias gradient is the sum over everything but channels
  EXPECT_LT(max_abs_diff(conv_backward_bias(seed), sum(seed, {0, 2, 3})), 1e-12);
  Tensor seed_nhwc = seed.permute({0, 2, 3, 1});
  EXPECT_LT(max_abs_diff(conv_backward_bias(seed_nhwc, Layout::NHWC), sum(seed, {0, 2, 3})), 1e-12);
}

TEST(Conv2d, EmptyBatch) {
  Tensor x = random({0, 3, 7, 9}), w = random({4, 3, 3, 3});
  EXPECT_EQ(conv2d(x, w, random({4})).shape(), Shape({0, 4, 5, 7}));
  Tensor dy = random({0, 4, 5, 7});
  EXPECT_EQ(conv_backward_weight(dy, x, w.shape()).to_vector<double>(), std::vector<double>(108, 0.0));
  EXPECT_EQ(conv_backward_bias(dy).to_vector<double>(), std::vector<double>(4, 0.0));
  EXPECT_EQ(conv_backward_input(dy, w, x.shape()).shape(), x.shape());
}

// ---- errors -----------------------------------------------------------------------------

TEST(Conv2d, RejectsMismatchedChannels) {
  TG_EXPECT_ERROR(conv2d(random({2, 3, 7, 9}), random({4, 5, 3, 3})),
                  "conv2d: input [2, 3, 7, 9] has 3 channels but weight [4, 5, 3, 3] expects 5");
  TG_EXPECT_ERROR(conv2d(random({2, 7, 9, 3}), random({4, 5, 3, 3}), {}, {.layout = Layout::NHWC}),
                  "conv2d: input [2, 7, 9, 3] has 3 channels but weight [4, 5, 3, 3] expects 5");
}

TEST(Conv2d, RejectsWrongRank) {
  TG_EXPECT_ERROR(conv2d(random({3, 7, 9}), random({4, 3, 3, 3})), "conv2d", "4-D input", "[3, 7, 9]");
  TG_EXPECT_ERROR(conv2d(random({2, 3, 7, 9}), random({4, 3, 3})), "conv2d", "4-D weight", "[4, 3, 3]");
  TG_EXPECT_ERROR(conv3d(random({2, 3, 7, 9}), random({4, 3, 3, 3})), "conv3d", "5-D input", "[2, 3, 7, 9]");
}

TEST(Conv2d, RejectsBadParams) {
  Tensor x = random({2, 3, 7, 9}), w = random({4, 3, 3, 3});
  TG_EXPECT_ERROR(conv2d(x, w, {}, {.padding = {-1}}), "conv2d", "padding", "non-negative", "[-1, -1]");
  TG_EXPECT_ERROR(conv2d(x, w, {}, {.stride = {0}}), "conv2d", "stride", "positive");
  TG_EXPECT_ERROR(conv2d(x, w, {}, {.stride = {2, -1}}), "conv2d", "stride", "positive", "[2, -1]");
  TG_EXPECT_ERROR(conv2d(x, w, {}, {.dilation = {0}}), "conv2d", "dilation", "positive");
  TG_EXPECT_ERROR(conv2d(x, w, {}, {.stride = {1, 1, 1}}), "conv2d", "stride has 3 values", "expected 1 or 2");
  TG_EXPECT_ERROR(conv3d(random({1, 3, 5, 5, 5}), random({2, 3, 3, 3, 3}), {}, {.padding = {1, 1}}),
                  "conv3d", "padding has 2 values", "expected 1 or 3");
}

TEST(Conv2d, RejectsKernelLargerThanPaddedInput) {
  TG_EXPECT_ERROR(conv2d(random({1, 3, 2, 9}), random({4, 3, 3, 3})), "conv2d", "kernel larger",
                  "dim H", "extent 3 > padded input size 2", "[1, 3, 2, 9]", "[4, 3, 3, 3]");
  TG_EXPECT_ERROR(conv2d(random({1, 3, 7, 4}), random({4, 3, 3, 3}), {}, {.dilation = {2}}), "conv2d",
                  "dim W", "extent 5 > padded input size 4");
  EXPECT_EQ(conv2d(random({1, 3, 7, 4}), random({4, 3, 3, 3}), {}, {.padding = {1}, .dilation = {2}}).shape(),
            Shape({1, 4, 5, 2}));
}

TEST(Conv2d, RejectsBadBiasDtypeDevice) {
  Tensor x = random({2, 3, 7, 9}), w = random({4, 3, 3, 3});
  TG_EXPECT_ERROR(conv2d(x, w, random({5})), "conv2d", "bias", "[5]", "[4, 3, 3, 3]");
  TG_EXPECT_ERROR(conv2d(x, w, random({4, 1})), "conv2d", "bias", "[4, 1]");
  TG_EXPECT_ERROR(conv2d(x, random({4, 3, 3, 3}, f32)), "conv2d", "f64[2, 3, 7, 9]", "f32[4, 3, 3, 3]");
  TG_EXPECT_ERROR(conv2d(x, w, random({4}, f32)), "conv2d", "f32[4]");
  TG_EXPECT_ERROR(conv2d(x, Tensor()), "conv2d", "undefined");
  TG_EXPECT_ERROR(conv2d(from_vector(std::vector<int64_t>(2 * 3 * 7 * 9, 1), {2, 3, 7, 9}), w), "conv2d",
                  "floating", "i64");
}

TEST(Conv3d, RejectsNHWC) {
  TG_EXPECT_ERROR(conv3d(random({1, 3, 5, 5, 5}), random({2, 3, 3, 3, 3}), {}, {.layout = Layout::NHWC}),
                  "conv3d", "NHWC", "not supported");
}

TEST(Conv, BackwardFunctionsValidate) {
  Tensor w = random({4, 3, 3, 3}), x = random({2, 3, 7, 9});
  TG_EXPECT_ERROR(conv_backward_input(random({2, 4, 5, 6}), w, Shape{2, 3, 7, 9}), "conv_backward_input",
                  "[2, 4, 5, 6]", "[2, 4, 5, 7]");
  TG_EXPECT_ERROR(conv_backward_weight(random({2, 4, 5, 7}), x, Shape{4, 2, 3, 3}), "conv_backward_weight",
                  "3 channels", "expects 2");
  TG_EXPECT_ERROR(conv_backward_bias(random({4, 5})), "conv_backward_bias", "[4, 5]");
}

// ---- speed: the small CNN of the examples must train in well under a minute -----------

TEST(Conv2d, SmallCnnStepIsFast) {
  Tensor x = random({64, 1, 28, 28}, f32);
  Tensor w1 = random({8, 1, 3, 3}, f32).requires_grad_(), b1 = random({8}, f32).requires_grad_();
  Tensor w2 = random({16, 8, 3, 3}, f32).requires_grad_(), b2 = random({16}, f32).requires_grad_();
  auto start = std::chrono::steady_clock::now();
  const int steps = 5;
  for (int i = 0; i < steps; ++i) {
    Tape tape;
    Tensor h = relu(conv2d(x, w1, b1, {.padding = {1}}));
    Tensor y = conv2d(h, w2, b2, {.padding = {1}});
    tape.backward(mean(y));
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / steps;
  std::printf("small CNN conv forward+backward: %.1f ms per step of 64 images\n", ms);
  EXPECT_LT(ms, 500.0);  // ~1000 steps a minute would need < 60 ms; this only catches disasters
}
