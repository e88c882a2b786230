// conv2d and conv_transpose2d with their geometry parameters pushed to extremes together: a
// stride near INT64_MAX over padding, a dilation near INT64_MAX with a two-tap kernel, padding
// near 2^62 under a huge stride, in H, in W (the CPU kernel's column ranges) or both, in both
// layouts (channels-last multiplies the column step by the channels). Sizes are predicted in
// 128-bit arithmetic; values and both gradients are checked against the definition, looped in
// double with 128-bit indices. A sibling of SizeOverflow.ConvParamsAtBoundaryValues
// (test_size_overflow.cpp), which moves one parameter at a time.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

using i128 = __int128;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k31 = int64_t{1} << 31;
constexpr int64_t k62 = int64_t{1} << 62;

// One spatial dim of a convolution.
struct Dim {
  int64_t in, k, stride, pad, dil;
};

// The output size by the rule, stated independently in 128 bits; -1 where the geometry is
// invalid (a term past INT64_MAX, or a dilated kernel wider than the padded input).
i128 predicted_out(const Dim& d) {
  const i128 padded = i128(d.in) + 2 * i128(d.pad), extent = i128(d.dil) * (d.k - 1) + 1;
  if (2 * i128(d.pad) > kMax || padded > kMax || extent > kMax || extent > padded) return -1;
  return (padded - extent) / d.stride + 1;
}

std::string describe_dim(const Dim& d) {
  return "in " + std::to_string(d.in) + " k " + std::to_string(d.k) + " stride " + std::to_string(d.stride) +
         " pad " + std::to_string(d.pad) + " dil " + std::to_string(d.dil);
}

// A 2-D convolution x (N, C, H, W) by w (K, C, kh, kw) -> y (N, K, oh, ow), or channels-last.
struct Problem {
  int64_t N, C, K;
  Dim h, w;
  int64_t oh, ow;
  Layout layout;

  bool last() const { return layout == Layout::NHWC; }
  Shape x_shape() const { return last() ? Shape{N, h.in, w.in, C} : Shape{N, C, h.in, w.in}; }
  Shape w_shape() const { return {K, C, h.k, w.k}; }
  Shape y_shape() const { return last() ? Shape{N, oh, ow, K} : Shape{N, K, oh, ow}; }
  int64_t x_index(int64_t n, int64_t c, int64_t i, int64_t j) const {
    return last() ? ((n * h.in + i) * w.in + j) * C + c : ((n * C + c) * h.in + i) * w.in + j;
  }
  int64_t y_index(int64_t n, int64_t k, int64_t i, int64_t j) const {
    return last() ? ((n * oh + i) * ow + j) * K + k : ((n * K + k) * oh + i) * ow + j;
  }

  // Calls visit(y_index, x_index, w_index) for every product term of
  // y[n, k, o] = sum over c and taps t of x[n, c, o * stride - pad + t * dil] * w[k, c, t].
  template <class Visit>
  void each_product(Visit&& visit) const {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t a = 0; a < oh; ++a)
            for (int64_t b = 0; b < ow; ++b)
              for (int64_t i = 0; i < h.k; ++i)
                for (int64_t j = 0; j < w.k; ++j) {
                  const i128 ih = i128(a) * h.stride - h.pad + i128(i) * h.dil;
                  const i128 iw = i128(b) * w.stride - w.pad + i128(j) * w.dil;
                  if (ih < 0 || ih >= h.in || iw < 0 || iw >= w.in) continue;
                  visit(y_index(n, k, a, b), x_index(n, c, int64_t(ih), int64_t(iw)),
                        ((k * C + c) * h.k + i) * w.k + j);
                }
  }
};

void expect_near(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  const auto v = got.to_vector<double>();
  ASSERT_EQ(v.size(), want.size()) << what;
  for (size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(v[i], want[i], 1e-12) << what << " element " << i;
}

// conv2d forward, dx and dw (seed g) against the definition.
void check_conv(const Problem& pb, const ConvParams& p) {
  Tensor x = param(pb.x_shape()), w = param(pb.w_shape());
  Tensor y, g = random(pb.y_shape());
  {
    Tape tape;
    y = conv2d(x, w, Tensor(), p);
    ASSERT_EQ(y.shape(), pb.y_shape());
    tape.backward(y, g);
  }
  const auto vx = x.to_vector<double>(), vw = w.to_vector<double>(), vg = g.to_vector<double>();
  std::vector<double> vy(size_t(y.numel())), dx(vx.size()), dw(vw.size());
  pb.each_product([&](int64_t yi, int64_t xi, int64_t wi) {
    vy[yi] += vx[xi] * vw[wi];
    dx[xi] += vg[yi] * vw[wi];
    dw[wi] += vg[yi] * vx[xi];
  });
  expect_near(y, vy, "conv2d y");
  expect_near(x.grad(), dx, "conv2d dx");
  expect_near(w.grad(), dw, "conv2d dw");
}

// conv_transpose2d of a tensor shaped like the convolution's output back to the input's shape
// (output_padding (padded - extent) mod stride, below the stride): the adjoint of the
// convolution, so its values, dx and dw come from the same products.
void check_conv_transpose(const Problem& pb, const ConvParams& p) {
  const auto out_pad = [](const Dim& d) {
    return int64_t((i128(d.in) + 2 * i128(d.pad) - i128(d.dil) * (d.k - 1) - 1) % d.stride);
  };
  const ConvTransposeParams tp{.stride = p.stride, .padding = p.padding, .output_padding = {out_pad(pb.h), out_pad(pb.w)},
                               .dilation = p.dilation, .layout = p.layout};
  // Its input is y-shaped (channels K), its weight (K, C, kh, kw), its output x-shaped.
  Tensor u = param(pb.y_shape()), w = param({pb.K, pb.C, pb.h.k, pb.w.k});
  Tensor v, g = random(pb.x_shape());
  {
    Tape tape;
    v = conv_transpose2d(u, w, Tensor(), tp);
    ASSERT_EQ(v.shape(), pb.x_shape());
    tape.backward(v, g);
  }
  const auto vu = u.to_vector<double>(), vw = w.to_vector<double>(), vg = g.to_vector<double>();
  std::vector<double> vv(size_t(v.numel())), du(vu.size()), dw(vw.size());
  // w[k, c, t] sits where the convolution's weight (K, C, kh, kw) has it.
  pb.each_product([&](int64_t yi, int64_t xi, int64_t wi) {
    vv[xi] += vu[yi] * vw[wi];
    du[yi] += vg[xi] * vw[wi];
    dw[wi] += vg[xi] * vu[yi];
  });
  expect_near(v, vv, "conv_transpose2d y");
  expect_near(u.grad(), du, "conv_transpose2d dx");
  expect_near(w.grad(), dw, "conv_transpose2d dw");
}

}  // namespace

TEST(ConvExtremes, CombinedBoundaryParametersMatchTheDefinition) {
  const std::vector<int64_t> ins = {1, 3}, kernels = {1, 2, 3}, strides = {1, 2, k31, k62, kMax},
                             pads = {0, 2, k31, k62 - 2, k62}, dils = {1, 2, k31, k62, kMax};
  const Dim mild{4, 2, 1, 1, 1};  // the other dim: an ordinary 4 -> 5 convolution
  int ran = 0, rejected = 0;
  for (int mode = 0; mode < 3; ++mode)  // the extreme dim: W, H, or both
    for (int64_t in : ins)
      for (int64_t k : kernels)
        for (int64_t stride : strides)
          for (int64_t pad : pads)
            for (int64_t dil : dils) {
              const Dim e{in, k, stride, pad, dil};
              const Dim h = mode == 0 ? mild : e, w = mode == 1 ? mild : e;
              const i128 oh = predicted_out(h), ow = predicted_out(w);
              SCOPED_TRACE("mode " + std::to_string(mode) + ": " + describe_dim(e));
              const ConvParams p{.stride = {h.stride, w.stride}, .padding = {h.pad, w.pad},
                                 .dilation = {h.dil, w.dil}};
              const Shape xs{2, 3, h.in, w.in}, ws{2, 3, h.k, w.k};
              if (oh < 0 || ow < 0) {
                TG_EXPECT_ERROR(make_conv_shape("conv2d", xs, ws, p), "conv2d");
                ++rejected;
                continue;
              }
              if (oh * ow > kMax / 4) continue;  // valid, but its output cannot be counted
              const ConvShape s = make_conv_shape("conv2d", xs, ws, p);
              EXPECT_EQ(i128(s.out[1]), oh);
              EXPECT_EQ(i128(s.out[2]), ow);
              if (oh > 8 || ow > 8) continue;  // valid, but too large to run here
              for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
                SCOPED_TRACE(layout == Layout::NHWC ? "NHWC" : "NCHW");
                ConvParams pl = p;
                pl.layout = layout;
                const Problem pb{2, 3, 2, h, w, int64_t(oh), int64_t(ow), layout};
                check_conv(pb, pl);
                check_conv_transpose(pb, pl);
              }
              ++ran;
            }
  EXPECT_GT(ran, 200);
  EXPECT_GT(rejected, 100);
}

// The reported cases: a stride of INT64_MAX over padding 2 leaves one output column whose
// window is all padding (zero output, zero gradient); channels-last with a stride of 2^62.
TEST(ConvExtremes, HugeStrideOverPaddingReadsOnlyPadding) {
  Tensor x = param({1, 1, 3, 3});
  Tensor y;
  {
    Tape tape;
    y = conv2d(x, ones({1, 1, 1, 1}, {.dtype = DType::f64}), Tensor(), {.stride = {1, kMax}, .padding = {0, 2}});
    tape.backward(sum(y));
  }
  ASSERT_EQ(y.shape(), Shape({1, 1, 3, 1}));
  expect_near(y, {0, 0, 0}, "y");
  expect_near(x.grad(), std::vector<double>(9, 0.0), "dx");
  // Its transpose: each of the three inputs lands on the kernel's middle tap, column 0.
  Tensor t = conv_transpose2d(ones({1, 1, 3, 1}), ones({1, 1, 1, 5}), Tensor(),
                              {.stride = {1, kMax}, .padding = {0, 2}});
  ASSERT_EQ(t.shape(), Shape({1, 1, 3, 1}));
  expect_near(t, {1, 1, 1}, "conv_transpose2d");
  // One column per row: y[n, h, 0, k] = sum over c of x[n, h, 0, c].
  Tensor xl = random({1, 5, 5, 4});
  Tensor yl = conv2d(xl, ones({1, 4, 1, 1}, {.dtype = DType::f64}), Tensor(),
                     {.stride = {int64_t{1} << 62}, .layout = Layout::NHWC});
  ASSERT_EQ(yl.shape(), Shape({1, 1, 1, 1}));
  const auto vx = xl.to_vector<double>();
  EXPECT_NEAR(yl.item(), vx[0] + vx[1] + vx[2] + vx[3], 1e-12);
}

// An empty batch admits spatial sizes whose products with the weight's size pass INT64_MAX
// (nothing is allocated): every pass returns its empty or zero result.
TEST(ConvExtremes, EmptyBatchWithHugeSpatialSizes) {
  const Shape xs{0, 16, int64_t{1} << 28, int64_t{1} << 28}, ws{16, 16, 1, 1};
  const auto empty = [](const Shape& s) { return Tensor::empty(s, {.dtype = DType::f32}); };
  Tensor w = random(ws, DType::f32);
  EXPECT_EQ(conv2d(empty(xs), w).shape(), xs);
  EXPECT_EQ(conv_backward_input(empty(xs), w, xs).shape(), xs);
  Tensor dw = conv_backward_weight(empty(xs), empty(xs), ws);
  expect_near(dw, std::vector<double>(size_t(dw.numel()), 0.0), "dw");
}
