// upsample on the CPU: known PyTorch values (nearest, bilinear with and without
// align_corners, fractional scales), bilinear and trilinear against a direct separable
// formula, gradients against central differences at odd shapes (up and down, by scale and
// by size), the nn module and the typed errors.
#include <cmath>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

void expect_all_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// PyTorch's linear source coordinate for output o of one dim, written out in double.
struct Tap {
  int64_t i0, i1;
  double l0, l1;
};
Tap linear_tap(int64_t o, int64_t in, int64_t out, double scale, bool align_corners) {
  if (in == out) return {o, o, 1, 0};
  double src;
  if (align_corners) src = out > 1 ? double(in - 1) / double(out - 1) * double(o) : 0.0;
  else src = std::max((double(o) + 0.5) * (1.0 / scale) - 0.5, 0.0);
  const int64_t i0 = std::min(int64_t(std::floor(src)), in - 1);
  const double l1 = std::min(std::max(src - double(i0), 0.0), 1.0);
  return {i0, i0 < in - 1 ? i0 + 1 : i0, 1 - l1, l1};
}

// Trilinear (or bilinear with D = 1) upsampling of an (NC, D, H, W) buffer, from the taps.
std::vector<double> linear_ref(const std::vector<double>& x, int64_t NC, const int64_t in[3], const int64_t out[3],
                               const double scale[3], bool align_corners) {
  std::vector<double> y;
  for (int64_t nc = 0; nc < NC; ++nc)
    for (int64_t a = 0; a < out[0]; ++a)
      for (int64_t b = 0; b < out[1]; ++b)
        for (int64_t c = 0; c < out[2]; ++c) {
          const Tap t[3] = {linear_tap(a, in[0], out[0], scale[0], align_corners),
                            linear_tap(b, in[1], out[1], scale[1], align_corners),
                            linear_tap(c, in[2], out[2], scale[2], align_corners)};
          double v = 0;
          for (int k0 = 0; k0 < 2; ++k0)
            for (int k1 = 0; k1 < 2; ++k1)
              for (int k2 = 0; k2 < 2; ++k2) {
                const int64_t i0 = k0 ? t[0].i1 : t[0].i0, i1 = k1 ? t[1].i1 : t[1].i0, i2 = k2 ? t[2].i1 : t[2].i0;
                const double w = (k0 ? t[0].l1 : t[0].l0) * (k1 ? t[1].l1 : t[1].l0) * (k2 ? t[2].l1 : t[2].l0);
                v += w * x[((nc * in[0] + i0) * in[1] + i1) * in[2] + i2];
              }
          y.push_back(v);
        }
  return y;
}

}  // namespace

TEST(Upsample, KnownPyTorchValues) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4}, {1, 1, 2, 2});
  // F.interpolate(x, scale_factor=2, mode="nearest")
  expect_all_near(upsample_nearest(x, {2}).to_vector<double>(),
                  {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}, 0);
  // F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
  expect_all_near(upsample_bilinear2d(x, {2}).to_vector<double>(),
                  {1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0}, 1e-15);
  // ... align_corners=True
  const double t = 1.0 / 3.0;
  expect_all_near(upsample_bilinear2d(x, {2}, true).to_vector<double>(),
                  {1, 1 + t, 1 + 2 * t, 2, 1 + 2 * t, 2, 2 + t, 2 + 2 * t, 2 + t, 2 + 2 * t, 3, 3 + t, 3, 3 + t,
                   3 + 2 * t, 4},
                  1e-15);
  // F.interpolate(torch.arange(4.).view(1, 1, 1, 4), scale_factor=(1, 1.5)): floor(o * float(1/1.5))
  Tensor r = from_vector(std::vector<double>{0, 1, 2, 3}, {1, 1, 1, 4});
  Tensor y = upsample_nearest(r, {1, 1.5});
  EXPECT_EQ(y.shape(), Shape({1, 1, 1, 6}));
  expect_all_near(y.to_vector<double>(), {0, 0, 1, 2, 2, 3}, 0);
  // To a size: 4 -> 7 reads floor(o * 4/7).
  expect_all_near(upsample(r, {.size = {1, 7}}).to_vector<double>(), {0, 0, 1, 1, 2, 2, 3}, 0);
  // 3-D nearest: every element of the (2, 2, 2) block of each input.
  Tensor x3 = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 2, 2, 2});
  auto v3 = upsample_nearest(x3, {2}).to_vector<double>();
  ASSERT_EQ(v3.size(), 64u);
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(v3[(a * 4 + b) * 4 + c], 1 + (a / 2) * 4 + (b / 2) * 2 + c / 2);
}

TEST(Upsample, LinearModesMatchTheSeparableFormula) {
  manual_seed(41);
  struct Case {
    Shape x;
    std::vector<double> scale;
  };
  for (bool ac : {false, true}) {
    for (const Case& c : {Case{{2, 3, 5, 7}, {2.0}}, Case{{1, 2, 7, 9}, {1.5, 2.5}}, Case{{1, 1, 9, 13}, {0.6, 0.7}},
                          Case{{2, 2, 3, 5, 7}, {2.0}}, Case{{1, 3, 5, 4, 3}, {1.7, 1.3, 2.2}}}) {
      SCOPED_TRACE(testing::Message() << c.x << " align_corners=" << ac);
      const int64_t S = c.x.rank() - 2, first = 3 - S;
      Tensor x = random(c.x);
      int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
      double scale[3] = {1, 1, 1};
      for (int64_t s = 0; s < S; ++s) {
        scale[first + s] = c.scale.size() == 1 ? c.scale[0] : c.scale[s];
        in[first + s] = c.x[2 + s];
        out[first + s] = int64_t(std::floor(double(c.x[2 + s]) * scale[first + s]));
      }
      Tensor y = S == 2 ? upsample_bilinear2d(x, c.scale, ac) : upsample_trilinear3d(x, c.scale, ac);
      expect_all_near(y.to_vector<double>(), linear_ref(x.to_vector<double>(), c.x[0] * c.x[1], in, out, scale, ac),
                      1e-14);
      // f32 against the f64 formula: only the f32 rounding of the coordinates and the result.
      Tensor yf = S == 2 ? upsample_bilinear2d(x.to(f32), c.scale, ac) : upsample_trilinear3d(x.to(f32), c.scale, ac);
      expect_all_near(yf.to_vector<double>(), y.to_vector<double>(), 1e-5);
    }
  }
}

TEST(Upsample, GradcheckAtOddShapes) {
  manual_seed(42);
  const std::vector<UpsampleParams> cases = {
      {.mode = UpsampleMode::nearest, .scale_factor = {2}},
      {.mode = UpsampleMode::nearest, .scale_factor = {1.5, 2.5}},
      {.mode = UpsampleMode::nearest, .scale_factor = {0.6}},
      {.mode = UpsampleMode::nearest, .size = {9, 13}},
      {.mode = UpsampleMode::bilinear, .scale_factor = {2}},
      {.mode = UpsampleMode::bilinear, .scale_factor = {1.5, 2.5}, .align_corners = true},
      {.mode = UpsampleMode::bilinear, .scale_factor = {0.6, 0.8}},
      {.mode = UpsampleMode::bilinear, .size = {11, 3}, .align_corners = true},
  };
  for (const UpsampleParams& p : cases) {
    SCOPED_TRACE(testing::Message() << "mode " << int(p.mode) << " ac " << p.align_corners);
    auto f = [p](const std::vector<Tensor>& in) { return upsample(in[0], p); };
    TG_EXPECT_GRADCHECK(f, (std::vector<Tensor>{param({2, 3, 5, 7})}));
  }
  const std::vector<UpsampleParams> cases3 = {
      {.mode = UpsampleMode::nearest, .scale_factor = {2}},
      {.mode = UpsampleMode::nearest, .scale_factor = {1.7, 1, 2.3}},
      {.mode = UpsampleMode::trilinear, .scale_factor = {2}},
      {.mode = UpsampleMode::trilinear, .scale_factor = {1.7, 0.8, 2.3}, .align_corners = true},
      {.mode = UpsampleMode::trilinear, .size = {5, 7, 4}},
  };
  for (const UpsampleParams& p : cases3) {
    SCOPED_TRACE(testing::Message() << "3-D mode " << int(p.mode) << " ac " << p.align_corners);
    auto f = [p](const std::vector<Tensor>& in) { return upsample(in[0], p); };
    TG_EXPECT_GRADCHECK(f, (std::vector<Tensor>{param({1, 2, 3, 5, 3})}));
  }
}

TEST(Upsample, NearestGradientSumsTheCopies) {
  // Each input of a 2x nearest upsampling is read by a 2x2 block: its gradient is the block's sum.
  Tensor x = param({1, 1, 3, 5});
  Tensor dy = random({1, 1, 6, 10});
  {
    Tape tape;
    tape.backward(upsample_nearest(x, {2}), dy);
  }
  auto g = dy.to_vector<double>(), dx = x.grad().to_vector<double>();
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t w = 0; w < 5; ++w) {
      double want = 0;
      for (int64_t a = 0; a < 2; ++a)
        for (int64_t b = 0; b < 2; ++b) want += g[(2 * h + a) * 10 + 2 * w + b];
      EXPECT_NEAR(dx[h * 5 + w], want, 1e-15);
    }
}

TEST(Upsample, ModuleAndErrors) {
  Tensor x = random({2, 3, 5, 7});
  nn::Upsample up({.scale_factor = {2}, .mode = UpsampleMode::bilinear});
  EXPECT_TRUE(up.state_dict().empty());
  expect_all_near(up(x).to_vector<double>(), upsample_bilinear2d(x, {2}).to_vector<double>(), 0);
  EXPECT_EQ(nn::Upsample({.size = {4, 9}})(x).shape(), Shape({2, 3, 4, 9}));
  TG_EXPECT_ERROR(nn::Upsample({}), "Upsample: exactly one of scale_factor and size must be given");
  TG_EXPECT_ERROR(nn::Upsample({.scale_factor = {-2}}), "Upsample: scale_factor must be positive");
  TG_EXPECT_ERROR(nn::Upsample({.scale_factor = {2}, .align_corners = true}),
                  "Upsample: align_corners can only be set with the interpolating modes");

  TG_EXPECT_ERROR(upsample_nearest(random({3, 5, 7}), {2}),
                  "upsample_nearest: expects a 4-D (N, C, H, W) or 5-D (N, C, D, H, W) input, got");
  TG_EXPECT_ERROR(upsample_bilinear2d(random({1, 2, 3, 5, 7}), {2}), "upsample_bilinear2d: expects a 4-D");
  TG_EXPECT_ERROR(upsample_trilinear3d(x, {2}), "upsample_trilinear3d: expects a 5-D (N, C, D, H, W) input");
  EXPECT_THROW(upsample_trilinear3d(x, {2}), ShapeError);
  TG_EXPECT_ERROR(upsample_nearest(x, {2, 2, 2}), "upsample_nearest: scale_factor needs 1 or 2 values, got 3");
  TG_EXPECT_ERROR(upsample_nearest(x, {0}), "upsample_nearest: scale_factor must be positive and finite, got 0");
  TG_EXPECT_ERROR(upsample_nearest(x, {0.1}), "upsample_nearest: scale_factor 0.1 gives an output size of 0");
  TG_EXPECT_ERROR(upsample(x, {.scale_factor = {2}, .size = {3, 3}}),
                  "upsample_nearest: exactly one of scale_factor and size must be given");
  TG_EXPECT_ERROR(upsample(x, {.size = {0, 3}}), "upsample_nearest: output size must be positive, got 0");
  TG_EXPECT_ERROR(upsample(x, {.scale_factor = {2}, .align_corners = true}), "upsample_nearest: align_corners");
  EXPECT_THROW(upsample_nearest(from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 1, 2, 2}), {2}), DTypeError);
  UpsampleProblem p{.NC = 6, .in = {1, 5, 7}, .out = {1, 10, 14}};
  Tensor y = Tensor::empty({2, 3, 10, 13}, {.dtype = f64});
  TG_EXPECT_ERROR(cpu::upsample_forward(y, x, p), "upsample_forward: input", "must hold 210 and 840 elements");
  // A caller's scale factor must give its output size: 1e-300 would read index 2^63 and more.
  Tensor y2 = Tensor::empty({2, 3, 10, 14}, {.dtype = f64});
  for (double bad : {1e-300, -2.0, std::nan(""), 3.0}) {
    const UpsampleProblem scaled{.NC = 6, .in = {1, 5, 7}, .out = {1, 10, 14}, .scale = {0, bad, 2}};
    TG_EXPECT_ERROR(cpu::upsample_forward(y2, x, scaled), "upsample_forward: invalid problem: scale factor");
  }
  const UpsampleProblem scaled{.NC = 6, .in = {1, 5, 7}, .out = {1, 10, 14}, .scale = {0, 2, 2}};
  cpu::upsample_forward(y2, x, scaled);
  expect_all_near(y2.to_vector<double>(), upsample_nearest(x, {2}).to_vector<double>(), 0);
  // An empty batch is fine.
  EXPECT_EQ(upsample_nearest(Tensor::empty({0, 3, 5, 7}, {.dtype = f64}), {2}).shape(), Shape({0, 3, 10, 14}));
}

// The kernels' tables grow with the output's spatial size: an empty batch, whose output holds
// nothing whatever the size, must not build them (2^31 entries here), forward or backward.
// f32: the byte count of an f64 [0, 1, 2^31, 2^29] would not fit in int64.
TEST(Upsample, EmptyBatchWithAHugeSizeBuildsNoTables) {
  const int64_t h = int64_t(1) << 31, w = int64_t(1) << 29;
  for (UpsampleMode mode : {UpsampleMode::nearest, UpsampleMode::bilinear}) {
    Tensor x = Tensor::empty({0, 1, 1, 1}, {.dtype = DType::f32}).requires_grad_();
    Tape tape;
    const Tensor y = upsample(x, {.mode = mode, .size = {h, w}});
    EXPECT_EQ(y.shape(), Shape({0, 1, h, w}));
    tape.backward(sum(y));
    EXPECT_EQ(x.grad().shape(), Shape({0, 1, 1, 1}));
    const UpsampleProblem p{.NC = 0, .in = {1, 1, 1}, .out = {1, h, w}, .mode = mode};
    cpu::upsample_forward(y, x, p);  // the kernel entry itself
  }
}

// Tables too large for any host are a typed out-of-memory error, raised before an
// allocation is tried, not std::bad_alloc or std::length_error.
TEST(Upsample, TablesTooLargeAreATypedError) {
  const UpsampleProblem p{.NC = 1, .in = {1, 1, 1}, .out = {1, 1, int64_t(1) << 62}};
  EXPECT_THROW(upsample_tables(p, DType::f32), OutOfMemory);
  TG_EXPECT_ERROR(upsample_tables(p, DType::f32), "upsample: out of host memory for the index tables",
                  "[1, 1, 4611686018427387904]");
}
