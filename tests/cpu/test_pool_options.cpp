// Pooling options beyond kernel, stride and padding, on the CPU: max pooling's dilation,
// ceil_mode for max and average, and average pooling's count_include_pad. Values against
// hand-computed cases and against direct loops over the kernel taps written here (output
// size with a float ceil and the "window starts in the right padding" drop, divisors by
// counting taps; not the library's window helpers), indices, f64 gradients at odd shapes,
// the inverse windows the CUDA backward gathers over, the typed errors, and the modules.
#include <cmath>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

struct OptCase {
  Shape shape;  // (N, C, H, W) or (N, C, D, H, W)
  PoolParams params;
};

// Per-dim (D, H, W) values of a list of one value or one per dim; 2-D cases get `unit` in D.
void per_dim(const std::vector<int64_t>& v, int sp, int64_t dflt, int64_t unit, int64_t out[3]) {
  out[0] = unit;
  for (int d = 0; d < sp; ++d) out[d + 3 - sp] = v.empty() ? dflt : v[v.size() == 1 ? 0 : d];
}

// The output size along one dim: ceil_mode rounds the window count up, then drops a last
// window that would start at or past the end of the input (in the right padding).
int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t span = in + 2 * p - (d * (k - 1) + 1);
  if (!ceil_mode) return span / s + 1;
  int64_t out = static_cast<int64_t>(std::ceil(double(span) / double(s))) + 1;
  if ((out - 1) * s - p >= in) --out;
  return out;
}

// A case's (D, H, W) sizes and options, 2-D cases with a unit D, and its output size.
struct Geometry {
  int64_t in[3], k[3], s[3], p[3], dil[3], o[3];
};
Geometry geometry(const OptCase& c) {
  const int sp = static_cast<int>(c.shape.rank()) - 2;
  Geometry g;
  per_dim(std::vector<int64_t>(c.shape.begin() + 2, c.shape.end()), sp, 0, 1, g.in);
  per_dim(c.params.kernel_size, sp, 0, 1, g.k);
  per_dim(c.params.stride, sp, 0, 1, g.s);
  if (c.params.stride.empty()) std::copy(g.k, g.k + 3, g.s);
  per_dim(c.params.padding, sp, 0, 0, g.p);
  per_dim(c.params.dilation, sp, 1, 1, g.dil);
  for (int i = 0; i < 3; ++i) g.o[i] = out_size(g.in[i], g.k[i], g.s[i], g.p[i], g.dil[i], c.params.ceil_mode);
  return g;
}

struct Ref {
  Shape shape;
  std::vector<double> max, avg;
  std::vector<int64_t> idx;
};

// Max and average by direct loops over the kernel taps of each window.
Ref pool_ref(const OptCase& c, const Tensor& x) {
  const int sp = static_cast<int>(c.shape.rank()) - 2;
  const Geometry g = geometry(c);
  const auto& [in, k, s, p, dil, o] = g;
  Ref r;
  std::vector<int64_t> dims = {c.shape[0], c.shape[1]};
  for (int i = 3 - sp; i < 3; ++i) dims.push_back(o[i]);
  r.shape = Shape(dims);
  const auto vx = values(x);
  const int64_t plane = in[0] * in[1] * in[2];
  for (int64_t nc = 0; nc < c.shape[0] * c.shape[1]; ++nc)
    for (int64_t od = 0; od < o[0]; ++od)
      for (int64_t oh = 0; oh < o[1]; ++oh)
        for (int64_t ow = 0; ow < o[2]; ++ow) {
          double best = 0, sum = 0;
          int64_t best_i = -1, padded_taps = 0, real_taps = 0;
          const int64_t at[3] = {od, oh, ow};
          for (int64_t a = 0; a < k[0]; ++a)
            for (int64_t b = 0; b < k[1]; ++b)
              for (int64_t e = 0; e < k[2]; ++e) {
                const int64_t tap[3] = {a, b, e};
                int64_t pos[3];
                bool real = true, in_padded = true;
                for (int i = 0; i < 3; ++i) {
                  pos[i] = at[i] * s[i] - p[i] + tap[i] * dil[i];
                  real = real && pos[i] >= 0 && pos[i] < in[i];
                  in_padded = in_padded && pos[i] >= -p[i] && pos[i] < in[i] + p[i];
                }
                padded_taps += in_padded;
                if (!real) continue;
                ++real_taps;
                const int64_t i = (pos[0] * in[1] + pos[1]) * in[2] + pos[2];
                const double v = vx[nc * plane + i];
                sum += v;
                if (best_i < 0 || v > best) best = v, best_i = i;
              }
          r.max.push_back(best);
          r.idx.push_back(best_i);
          r.avg.push_back(sum / double(c.params.count_include_pad ? padded_taps : real_taps));
        }
  return r;
}

std::vector<OptCase> max_cases() {
  return {
      {{2, 3, 7, 9}, {.kernel_size = {3}, .stride = {2}, .padding = {1}, .dilation = {2}}},
      {{2, 3, 7, 9}, {.kernel_size = {3}, .stride = {2}, .padding = {2}, .dilation = {2}, .ceil_mode = true}},
      {{1, 2, 9, 13},
       {.kernel_size = {3, 2}, .stride = {2, 3}, .padding = {2, 1}, .dilation = {2, 3}, .ceil_mode = true}},
      {{2, 1, 5, 11}, {.kernel_size = {2}, .stride = {3}, .padding = {1}, .ceil_mode = true}},  // drops a window
      {{1, 2, 5, 7, 6}, {.kernel_size = {2}, .stride = {2}, .padding = {1}, .dilation = {2}, .ceil_mode = true}},
      {{2, 1, 7, 5, 9}, {.kernel_size = {2, 3, 2}, .stride = {3, 1, 2}, .padding = {1, 1, 0}, .dilation = {1, 2, 3}}},
  };
}

std::vector<OptCase> avg_cases() {
  std::vector<OptCase> out;
  const std::vector<OptCase> base = {
      {{2, 3, 7, 9}, {.kernel_size = {3}, .stride = {2}, .padding = {1}}},
      {{1, 2, 9, 13}, {.kernel_size = {3, 2}, .stride = {2, 3}, .padding = {1, 1}}},
      {{2, 1, 5, 11}, {.kernel_size = {2}, .stride = {3}, .padding = {1}}},  // ceil drops a window
      {{1, 1, 6, 6}, {.kernel_size = {3}, .stride = {3}, .padding = {1}}},   // ceil window past in + padding
      {{1, 2, 5, 7, 6}, {.kernel_size = {3}, .stride = {2}, .padding = {1}}},
      {{2, 1, 7, 5, 9}, {.kernel_size = {2, 3, 4}, .stride = {3, 1, 3}, .padding = {1, 1, 2}}},
  };
  for (OptCase c : base)
    for (bool ceil_mode : {false, true})
      for (bool include : {true, false}) {
        c.params.ceil_mode = ceil_mode;
        c.params.count_include_pad = include;
        out.push_back(c);
      }
  return out;
}

std::string describe_case(const OptCase& c) {
  const PoolParams& p = c.params;
  return c.shape.str() + " k " + Shape(p.kernel_size).str() + " s " + Shape(p.stride).str() + " p " +
         Shape(p.padding).str() + " d " + Shape(p.dilation).str() + (p.ceil_mode ? " ceil" : "") +
         (p.count_include_pad ? "" : " exclude_pad");
}

bool is3d(const OptCase& c) { return c.shape.rank() == 5; }

}  // namespace

TEST(PoolOptions, HandComputedCases) {
  // W = 5, kernel 2, stride 3, padding 1. Floor: (5 + 2 - 2) / 3 + 1 = 2 windows. ceil_mode
  // would add one at padded position 6, which is the right padding: dropped, still 2.
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5}, {1, 1, 1, 5});
  const PoolParams drop{.kernel_size = {1, 2}, .stride = {1, 3}, .padding = {0, 1}, .ceil_mode = true};
  MaxPoolResult m = max_pool2d_with_indices(x, drop);
  EXPECT_EQ(values(m.output), (std::vector<double>{1, 4}));  // windows {-1, 0}, {2, 3}
  EXPECT_EQ(m.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(values(avg_pool2d(x, drop)), (std::vector<double>{0.5, 3.5}));
  PoolParams drop_ex = drop;
  drop_ex.count_include_pad = false;
  EXPECT_EQ(values(avg_pool2d(x, drop_ex)), (std::vector<double>{1, 3.5}));

  // W = 6, kernel 3, stride 3, padding 1: floor gives 2 windows, ceil_mode 3; the third
  // starts at 5 (the last element) and reaches past the padding: its include-pad divisor is
  // clipped to in + padding (2 positions: 5 and the pad), not the kernel's 3.
  Tensor y = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {1, 1, 1, 6});
  PoolParams keep{.kernel_size = {1, 3}, .stride = {1, 3}, .padding = {0, 1}};
  EXPECT_EQ(values(max_pool2d(y, keep)), (std::vector<double>{2, 5}));
  keep.ceil_mode = true;
  EXPECT_EQ(values(max_pool2d(y, keep)), (std::vector<double>{2, 5, 6}));
  EXPECT_EQ(values(avg_pool2d(y, keep)), (std::vector<double>{1, 4, 3}));
  keep.count_include_pad = false;
  EXPECT_EQ(values(avg_pool2d(y, keep)), (std::vector<double>{1.5, 4, 6}));

  // Dilation 2 with padding 2 (the most the dilated extent 5 allows), stride 2: windows
  // start at -2, 0, 2, 4 and take every other element.
  Tensor z = from_vector(std::vector<double>{5, 1, 4, 1, 3, 9, 2}, {1, 1, 1, 7});
  MaxPoolResult d = max_pool2d_with_indices(z, {.kernel_size = {1, 3}, .stride = {1, 2}, .padding = {0, 2},
                                                .dilation = {1, 2}});
  EXPECT_EQ(values(d.output), (std::vector<double>{5, 5, 4, 3}));  // {0, 2}, {0, 2, 4}, {2, 4, 6}, {4, 6}
  EXPECT_EQ(d.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 2, 4}));

  // count_include_pad = false in 2-D: the corner of a 3x3 all-ones input is 1, not 4 / 9.
  Tensor one = ones({1, 1, 3, 3}, {.dtype = f64});
  for (double v : values(avg_pool2d(one, {.kernel_size = {3}, .stride = {1}, .padding = {1},
                                          .count_include_pad = false})))
    EXPECT_DOUBLE_EQ(v, 1.0);
}

TEST(PoolOptions, MaxMatchesDirectLoops) {
  manual_seed(61);
  for (const OptCase& c : max_cases()) {
    SCOPED_TRACE(describe_case(c));
    Tensor x = random(c.shape);
    const Ref r = pool_ref(c, x);
    MaxPoolResult m = is3d(c) ? max_pool3d_with_indices(x, c.params) : max_pool2d_with_indices(x, c.params);
    ASSERT_EQ(m.output.shape(), r.shape);
    EXPECT_EQ(values(m.output), r.max);
    EXPECT_EQ(m.indices.to_vector<int64_t>(), r.idx);
  }
}

TEST(PoolOptions, AvgMatchesDirectLoops) {
  manual_seed(62);
  for (const OptCase& c : avg_cases()) {
    SCOPED_TRACE(describe_case(c));
    Tensor x = random(c.shape);
    const Ref r = pool_ref(c, x);
    Tensor a = is3d(c) ? avg_pool3d(x, c.params) : avg_pool2d(x, c.params);
    ASSERT_EQ(a.shape(), r.shape);
    const auto va = values(a);
    for (size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(va[i], r.avg[i], 1e-15) << i;
  }
  // The ceil cases above do change the output size somewhere (else they test nothing new).
  EXPECT_EQ(avg_pool2d(random({1, 1, 6, 6}), {.kernel_size = {3}, .padding = {1}, .ceil_mode = true}).shape(),
            Shape({1, 1, 3, 3}));
  EXPECT_EQ(avg_pool2d(random({1, 1, 6, 6}), {.kernel_size = {3}, .padding = {1}}).shape(), Shape({1, 1, 2, 2}));
}

TEST(PoolOptions, GradcheckAtOddShapes) {
  manual_seed(63);
  for (const OptCase& c : max_cases()) {
    SCOPED_TRACE(describe_case(c));
    Tensor x = param(c.shape);
    TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) {
      return is3d(c) ? max_pool3d(in[0], c.params) : max_pool2d(in[0], c.params);
    }, std::vector<Tensor>({x}));
  }
  for (const OptCase& c : avg_cases()) {
    SCOPED_TRACE(describe_case(c));
    Tensor x = param(c.shape);
    TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) {
      return is3d(c) ? avg_pool3d(in[0], c.params) : avg_pool2d(in[0], c.params);
    }, std::vector<Tensor>({x}));
  }
}

// The CUDA backward gathers over pool_inverse_window: with dilation and ceil_mode it must
// still list every output whose window holds an input (with dilation 1, exactly those;
// with dilation > 1, those whose window spans it, taps or not).
TEST(PoolOptions, InverseWindowsCoverEveryWindowHoldingAnInput) {
  for (int64_t in : {1, 2, 5, 7, 13}) {
    for (int64_t k = 1; k <= 4; ++k) {
      for (int64_t s = 1; s <= 4; ++s) {
        for (int64_t dil = 1; dil <= 3; ++dil) {
          for (int64_t pad = 0; pad <= (dil * (k - 1) + 1) / 2; ++pad) {
            for (bool ceil_mode : {false, true}) {
              if (in + 2 * pad - (dil * (k - 1) + 1) + (ceil_mode ? s - 1 : 0) < 0) continue;
              PoolProblem p;
              p.kind = PoolKind::max;
              p.in[2] = in;
              p.kernel[2] = k;
              p.stride[2] = s;
              p.padding[2] = pad;
              p.dilation[2] = dil;
              p.out[2] = out_size(in, k, s, pad, dil, ceil_mode);
              for (int64_t i = 0; i < in; ++i) {
                int64_t first = -1, last = -1;
                pool_inverse_window(p, 2, i, first, last);
                for (int64_t o = 0; o < p.out[2]; ++o) {
                  const PoolWindow w = pool_window(p, 2, o);
                  bool holds = false;
                  for (int64_t t = w.begin; t < w.end; t += w.step) holds = holds || t == i;
                  const int64_t start = o * s - pad;
                  const bool spans = start <= i && i <= start + dil * (k - 1);
                  const bool listed = first <= o && o < last;
                  EXPECT_EQ(spans, listed) << "in " << in << " k " << k << " s " << s << " d " << dil << " pad " << pad
                                           << " ceil " << ceil_mode << " i " << i << " o " << o;
                  if (dil == 1) {
                    EXPECT_EQ(holds, listed) << "in " << in << " k " << k << " s " << s << " i " << i;
                  }
                  if (holds) {
                    EXPECT_TRUE(listed);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(PoolOptions, BadOptionsAreTypedErrors) {
  Tensor x = random({2, 3, 7, 9});
  // Padding above half the (dilated) kernel: 3 > 5 / 2 with dilation 2; 2 > 3 / 2 without.
  TG_EXPECT_ERROR(max_pool2d(x, {.kernel_size = {3}, .padding = {3}, .dilation = {2}}), "max_pool2d", "padding [3]",
                  "half", "dilated", "dilation [2]", "dim H");
  EXPECT_NO_THROW(max_pool2d(x, {.kernel_size = {3}, .padding = {2}, .dilation = {2}}));
  TG_EXPECT_ERROR(avg_pool2d(x, {.kernel_size = {3}, .padding = {2}, .ceil_mode = true}), "avg_pool2d", "padding",
                  "half");
  TG_EXPECT_ERROR(
      max_pool3d(random({1, 1, 5, 5, 5}), {.kernel_size = {3}, .padding = {0, 0, 3}, .dilation = {1, 1, 2}}),
      "max_pool3d", "padding", "half", "dim W");
  // Dilation must be positive, and one value or one per dim.
  TG_EXPECT_ERROR(max_pool2d(x, {.kernel_size = {2}, .dilation = {0}}), "max_pool2d", "dilation", "positive");
  TG_EXPECT_ERROR(max_pool2d(x, {.kernel_size = {2}, .dilation = {1, -1}}), "max_pool2d", "dilation", "positive");
  TG_EXPECT_ERROR(max_pool3d(random({1, 1, 4, 4, 4}), {.kernel_size = {2}, .dilation = {1, 2}}), "max_pool3d",
                  "dilation has 2 values");
  // Average pooling has no dilation.
  TG_EXPECT_ERROR(avg_pool2d(x, {.kernel_size = {2}, .dilation = {2}}), "avg_pool2d", "dilation [2]",
                  "not supported");
  EXPECT_NO_THROW(avg_pool2d(x, {.kernel_size = {2}, .dilation = {1, 1}}));
  // The dilated kernel must fit the padded input: extent 2 * (4 - 1) + 1 = 7 fits H = 7, not 6.
  EXPECT_NO_THROW(max_pool2d(x, {.kernel_size = {4}, .dilation = {2}}));
  EXPECT_THROW(max_pool2d(random({1, 1, 6, 9}), {.kernel_size = {4}, .dilation = {2}}), ShapeError);
  TG_EXPECT_ERROR(max_pool2d(random({1, 1, 6, 9}), {.kernel_size = {4}, .dilation = {2}}), "max_pool2d",
                  "dilation [2]", "larger than the padded input", "dim H", "[1, 1, 6, 9]");
  // ceil_mode lets a window reach past the padded input when it starts inside it, as PyTorch:
  // W = 2, kernel 3, stride 2 gives one window; without ceil_mode it is an error.
  EXPECT_EQ(max_pool2d(random({1, 1, 1, 2}), {.kernel_size = {1, 3}, .stride = {1, 2}, .ceil_mode = true}).shape(),
            Shape({1, 1, 1, 1}));
  EXPECT_THROW(max_pool2d(random({1, 1, 1, 2}), {.kernel_size = {1, 3}, .stride = {1, 2}}), ShapeError);
  // An empty dim has no windows: ceil_mode's one would start past the input.
  TG_EXPECT_ERROR(max_pool2d(random({1, 1, 0, 4}), {.kernel_size = {1}, .stride = {2}, .ceil_mode = true}),
                  "max_pool2d", "is empty in spatial dim H");
  // A dilated window over the padding that misses every element (W = 1, kernel 2, dilation
  // 3, padding 2: taps at -2 and 1) is an error, where PyTorch would return -inf.
  EXPECT_THROW(max_pool2d(random({1, 1, 1, 1}), {.kernel_size = {1, 2}, .stride = {1}, .padding = {0, 2},
                                                 .dilation = {1, 3}}),
               ShapeError);
  TG_EXPECT_ERROR(max_pool2d(random({1, 1, 1, 1}), {.kernel_size = {1, 2}, .stride = {1}, .padding = {0, 2},
                                                    .dilation = {1, 3}}),
                  "max_pool2d", "output position 0", "dim W", "holds no element", "[1, 1, 1, 1]");
  // The modules check their options when built.
  TG_EXPECT_ERROR(nn::MaxPool2d({.kernel_size = {3}, .dilation = {0}}), "MaxPool2d", "dilation", "positive");
  TG_EXPECT_ERROR(nn::AvgPool3d({.kernel_size = {3}, .dilation = {2}}), "AvgPool3d", "dilation", "not supported");
  TG_EXPECT_ERROR(nn::MaxPool3d({.kernel_size = {3}, .padding = {3}, .dilation = {2}}), "MaxPool3d", "half");
}

TEST(PoolOptions, ModulesTakePyTorchsOptions) {
  manual_seed(64);
  const PoolParams defaults{.kernel_size = {2}};
  EXPECT_EQ(defaults.dilation, std::vector<int64_t>{1});
  EXPECT_FALSE(defaults.ceil_mode);
  EXPECT_TRUE(defaults.count_include_pad);
  Tensor x = random({2, 3, 7, 9}), x3 = random({1, 2, 5, 7, 6});
  auto same = [](const Tensor& a, const Tensor& b) { return values(a) == values(b); };
  const PoolParams m{.kernel_size = {3}, .stride = {2}, .padding = {2}, .dilation = {2}, .ceil_mode = true};
  const PoolParams a{.kernel_size = {3}, .stride = {2}, .padding = {1}, .ceil_mode = true, .count_include_pad = false};
  EXPECT_TRUE(same(nn::MaxPool2d(m)(x), max_pool2d(x, m)));
  EXPECT_TRUE(same(nn::MaxPool3d(m)(x3), max_pool3d(x3, m)));
  EXPECT_TRUE(same(nn::AvgPool2d(a)(x), avg_pool2d(x, a)));
  EXPECT_TRUE(same(nn::AvgPool3d(a)(x3), avg_pool3d(x3, a)));
  EXPECT_FALSE(same(nn::AvgPool2d(a)(x), avg_pool2d(x, {.kernel_size = {3}, .stride = {2}, .padding = {1}})));
  EXPECT_EQ(nn::MaxPool2d(m).options().dilation, std::vector<int64_t>{2});
}
