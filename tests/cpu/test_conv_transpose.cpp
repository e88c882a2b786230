// conv_transpose2d / conv_transpose3d on the CPU: values against a direct scatter loop (every
// input element adds x * w to the outputs its taps reach), f64 gradients against central
// differences, the output-size formula, errors, and the modules' parameters.
#include "common/test_util.h"
#include "nn/layers.h"
#include "ops/conv_transpose.h"

using namespace tg;
using namespace tg::test;

namespace {

struct Case {
  const char* name;
  Shape x, w;  // NCHW / NCDHW
  ConvTransposeParams p;
  bool bias = true;
};

int64_t at(const std::vector<int64_t>& v, int d) { return v.size() == 1 ? v[0] : v[d]; }

// y[n, co, o] = bias[co] + sum over ci, t, i with o = i * stride - pad + t * dil of x[n, ci, i] w[ci, co, t],
// spatial dims padded to 3 (D = 1 for 2-D).
std::vector<double> scatter_reference(const Tensor& x, const Tensor& w, const Tensor& b, const ConvTransposeParams& p,
                                      const Shape& y_shape) {
  const int dims = static_cast<int>(x.dim()) - 2;
  auto dim3 = [&](const Shape& s, int d) { return dims == 3 ? s[2 + d] : (d == 0 ? 1 : s[1 + d]); };
  const int64_t N = x.size(0), Ci = x.size(1), Co = w.size(1);
  int64_t in[3], k[3], out[3], st[3], pad[3], dil[3];
  for (int d = 0; d < 3; ++d) {
    in[d] = dim3(x.shape(), d);
    k[d] = dim3(w.shape(), d);
    out[d] = dim3(y_shape, d);
    const int pd = dims == 3 ? d : d - 1;  // the per-dim parameter of spatial dim d (2-D: none for D)
    st[d] = pd < 0 ? 1 : at(p.stride, pd);
    pad[d] = pd < 0 ? 0 : at(p.padding, pd);
    dil[d] = pd < 0 ? 1 : at(p.dilation, pd);
  }
  const auto vx = x.to_vector<double>(), vw = w.to_vector<double>();
  const auto vb = b.defined() ? b.to_vector<double>() : std::vector<double>(Co, 0.0);
  const int64_t P = out[0] * out[1] * out[2], V = in[0] * in[1] * in[2], kvol = k[0] * k[1] * k[2];
  std::vector<double> y(N * Co * P);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t co = 0; co < Co; ++co)
      for (int64_t o = 0; o < P; ++o) y[(n * Co + co) * P + o] = vb[co];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ci = 0; ci < Ci; ++ci)
      for (int64_t i = 0; i < V; ++i) {
        const int64_t iz = i / (in[1] * in[2]), iy = (i / in[2]) % in[1], ix = i % in[2];
        for (int64_t co = 0; co < Co; ++co)
          for (int64_t t = 0; t < kvol; ++t) {
            const int64_t tz = t / (k[1] * k[2]), ty = (t / k[2]) % k[1], tx = t % k[2];
            const int64_t oz = iz * st[0] - pad[0] + tz * dil[0], oy = iy * st[1] - pad[1] + ty * dil[1],
                          ox = ix * st[2] - pad[2] + tx * dil[2];
            if (oz < 0 || oy < 0 || ox < 0 || oz >= out[0] || oy >= out[1] || ox >= out[2]) continue;
            y[(n * Co + co) * P + (oz * out[1] + oy) * out[2] + ox] +=
                vx[(n * Ci + ci) * V + i] * vw[(ci * Co + co) * kvol + t];
          }
      }
  return y;
}

Tensor transpose_conv(const Tensor& x, const Tensor& w, const Tensor& b, const ConvTransposeParams& p) {
  return w.dim() == 5 ? conv_transpose3d(x, w, b, p) : conv_transpose2d(x, w, b, p);
}

std::vector<Case> cases() {
  return {
      {"2x2 s2 (U-Net up)", {2, 4, 5, 6}, {4, 3, 2, 2}, {.stride = {2}}},
      {"3x3 s1 p1", {1, 3, 7, 5}, {3, 5, 3, 3}, {.padding = {1}}, false},
      {"3x3 s2 p1 output_padding 1", {2, 3, 4, 5}, {3, 2, 3, 3}, {.stride = {2}, .padding = {1}, .output_padding = {1}}},
      {"dilation 2, stride 3", {1, 2, 3, 4}, {2, 3, 3, 2}, {.stride = {3}, .padding = {1}, .dilation = {2}}},
      {"per-dim params", {1, 2, 4, 3}, {2, 2, 3, 4},
       {.stride = {2, 1}, .padding = {0, 1}, .output_padding = {1, 0}, .dilation = {1, 2}}},
      {"C_in 1 -> 1", {3, 1, 5, 5}, {1, 1, 4, 4}, {.stride = {2}, .padding = {1}}},
      {"3d 2x2x2 s2", {1, 3, 2, 3, 4}, {3, 2, 2, 2, 2}, {.stride = {2}}},
      {"3d 3x3x3 s2 p1 op1", {2, 2, 3, 2, 3}, {2, 3, 3, 3, 3}, {.stride = {2}, .padding = {1}, .output_padding = {1}}},
  };
}

}  // namespace

TEST(ConvTranspose, MatchesScatterLoop) {
  for (const Case& c : cases()) {
    Tensor x = random(c.x), w = random(c.w), b = c.bias ? random({c.w[1]}) : Tensor();
    Tensor y = transpose_conv(x, w, b, c.p);
    ASSERT_EQ(y.shape(), conv_transpose_output_shape("test", c.x, c.w, c.p)) << c.name;
    const auto want = scatter_reference(x, w, b, c.p, y.shape());
    const auto got = y.to_vector<double>();
    ASSERT_EQ(got.size(), want.size()) << c.name;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << c.name << " element " << i;
  }
}

TEST(ConvTranspose, OutputSizeFormula) {
  // (in - 1) * stride - 2 * pad + dil * (k - 1) + output_padding + 1
  EXPECT_EQ(conv_transpose_output_shape("t", {2, 4, 5, 6}, {4, 3, 2, 2}, {.stride = {2}}), Shape({2, 3, 10, 12}));
  EXPECT_EQ(conv_transpose_output_shape("t", {1, 3, 4, 4}, {3, 8, 3, 3},
                                        {.stride = {2}, .padding = {1}, .output_padding = {1}}),
            Shape({1, 8, 8, 8}));
  EXPECT_EQ(conv_transpose_output_shape("t", {1, 2, 3, 3, 3}, {2, 5, 3, 3, 3}, {.dilation = {2}}),
            Shape({1, 5, 7, 7, 7}));
  EXPECT_EQ(conv_transpose_output_shape("t", {1, 6, 5, 3}, {3, 7, 3, 3}, {.stride = {2}, .layout = Layout::NHWC}),
            Shape({1, 13, 11, 7}));  // H 6 -> 13, W 5 -> 11, C 3 -> 7
}

TEST(ConvTranspose, Gradients) {
  for (const Case& c : cases()) {
    Tensor x = param(c.x), w = param(c.w);
    std::vector<Tensor> inputs = {x, w};
    if (c.bias) inputs.push_back(param({c.w[1]}));
    const ConvTransposeParams p = c.p;
    const bool bias = c.bias;
    auto fn = [p, bias](const std::vector<Tensor>& in) {
      return transpose_conv(in[0], in[1], bias ? in[2] : Tensor(), p);
    };
    TG_EXPECT_GRADCHECK(fn, inputs);
  }
}

TEST(ConvTranspose, ChannelsLastMatchesChannelsFirst) {
  Tensor x = random({2, 3, 4, 5}), w = random({3, 6, 3, 2}), b = random({6});
  const ConvTransposeParams p{.stride = {2, 1}, .padding = {1, 0}, .output_padding = {1, 0}};
  ConvTransposeParams pl = p;
  pl.layout = Layout::NHWC;
  Tensor y = conv_transpose2d(x, w, b, p);
  Tensor yl = conv_transpose2d(x.permute({0, 2, 3, 1}).contiguous(), w, b, pl);
  EXPECT_LE(rel_l2(yl.permute({0, 3, 1, 2}).contiguous(), y), 1e-14);
  Tensor xg = param({1, 4, 3, 2});
  TG_EXPECT_GRADCHECK([pl](const std::vector<Tensor>& in) { return conv_transpose2d(in[0], in[1], in[2], pl); },
                      std::vector<Tensor>({xg, param({2, 3, 3, 3}), param({3})}));
}

TEST(ConvTranspose, BadArgumentsAreRejected) {
  TG_EXPECT_ERROR(conv_transpose2d(random({1, 3, 4, 4}), random({4, 2, 3, 3})), "conv_transpose2d", "3 channels",
                  "expects 4");
  TG_EXPECT_ERROR(conv_transpose2d(random({1, 3, 4, 4}), random({3, 2, 3, 3}), Tensor(), {.output_padding = {1}}),
                  "conv_transpose2d", "output_padding");
  TG_EXPECT_ERROR(conv_transpose2d(random({1, 3, 4, 4}), random({3, 2, 3, 3}), random({3})), "conv_transpose2d",
                  "bias", "[2]");
  // Below the dilation but not the stride: PyTorch's rule allows it; refused as unsupported,
  // saying so, rather than as a shape that is not a convolution's output.
  EXPECT_THROW(conv_transpose2d(random({1, 1, 3, 3}), random({1, 1, 2, 2}), Tensor(),
                                {.stride = {1}, .output_padding = {2}, .dilation = {3}}),
               UnsupportedError);
  TG_EXPECT_ERROR(conv_transpose2d(random({1, 1, 3, 3}), random({1, 1, 2, 2}), Tensor(),
                                   {.stride = {1}, .output_padding = {2}, .dilation = {3}}),
                  "conv_transpose2d", "output_padding [2, 2] at or above the stride [1, 1]", "not supported");
  TG_EXPECT_ERROR(conv_transpose2d(random({1, 3, 2, 2}), random({3, 2, 1, 1}), Tensor(), {.padding = {1}}),
                  "conv_transpose2d", "empty output");
  TG_EXPECT_ERROR(conv_transpose3d(random({1, 3, 4, 4}), random({3, 2, 3, 3})), "conv_transpose3d", "5-D input");
  TG_EXPECT_ERROR(conv_transpose2d(random({1, 3, 4, 4}), random({3, 2, 3, 3}, f32)), "conv_transpose2d", "f32");
}

TEST(ConvTranspose, ModulesHavePyTorchParameters) {
  nn::ConvTranspose2d up({.in_channels = 8, .out_channels = 4, .kernel_size = 2, .stride = 2});
  EXPECT_EQ(up.weight.shape(), Shape({8, 4, 2, 2}));
  EXPECT_EQ(up.bias.shape(), Shape({4}));
  const auto names = up.named_parameters();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].first, "weight");
  EXPECT_EQ(names[1].first, "bias");
  // U(+-1/sqrt(fan_in)), fan_in = out * kh * kw = 16: every value inside, and not all tiny.
  const double bound = 1.0 / std::sqrt(16.0);
  double largest = 0;
  for (double v : up.weight.to_vector<double>()) {
    EXPECT_LE(std::abs(v), bound);
    largest = std::max(largest, std::abs(v));
  }
  EXPECT_GT(largest, 0.5 * bound);
  EXPECT_EQ(up.forward(random({2, 8, 3, 5}, f32)).shape(), Shape({2, 4, 6, 10}));
  nn::ConvTranspose3d up3(nn::ConvTranspose3dOptions::make(2, 3, 3).stride(2).padding(1).output_padding(1).bias(false));
  EXPECT_FALSE(up3.bias.defined());
  EXPECT_EQ(up3.forward(random({1, 2, 2, 3, 4}, f32)).shape(), Shape({1, 3, 4, 6, 8}));
  TG_EXPECT_ERROR(nn::ConvTranspose2d({.in_channels = 2, .out_channels = 2}), "ConvTranspose2d", "kernel_size");
  TG_EXPECT_ERROR(nn::ConvTranspose2d({.in_channels = 2, .out_channels = 2, .kernel_size = 3, .output_padding = 1}),
                  "ConvTranspose2d", "output_padding");
}
