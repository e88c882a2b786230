// Pooling (max, avg, adaptive avg; 2-D and 3-D) on the CPU: values against direct loops
// written here (padded taps, float floor/ceil for the adaptive windows; not the library's
// window helpers), max-pool indices and PyTorch's tie and NaN rules, gradients against central
// differences in f64 at odd shapes, the typed errors, and the nn modules.
#include <cmath>
#include <limits>

#include "common/test_util.h"
#include "ops/cpu/shape_pool_kernels.h"

using namespace tg;
using namespace tg::test;

namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// Pooling by direct loops over the kernel taps of an (N, C, D, H, W) view (2-D: D = 1).
struct Ref {
  std::vector<double> y;
  std::vector<int64_t> idx;
};
enum class Kind { max, avg };
Ref pool_ref(const Tensor& x5, Kind kind, const int64_t k[3], const int64_t s[3], const int64_t p[3],
             const int64_t o[3]) {
  const Shape& sh = x5.shape();
  const int64_t N = sh[0], C = sh[1], D = sh[2], H = sh[3], W = sh[4];
  auto vx = values(x5);
  Ref r;
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t od = 0; od < o[0]; ++od)
      for (int64_t oh = 0; oh < o[1]; ++oh)
        for (int64_t ow = 0; ow < o[2]; ++ow) {
          double best = -INFINITY, sum = 0;
          int64_t best_i = -1;
          for (int64_t a = 0; a < k[0]; ++a)
            for (int64_t b = 0; b < k[1]; ++b)
              for (int64_t c = 0; c < k[2]; ++c) {
                const int64_t d = od * s[0] - p[0] + a, h = oh * s[1] - p[1] + b, w = ow * s[2] - p[2] + c;
                if (d < 0 || d >= D || h < 0 || h >= H || w < 0 || w >= W) continue;  // padding
                const int64_t i = (d * H + h) * W + w;
                const double v = vx[nc * D * H * W + i];
                sum += v;
                if (best_i < 0 || v > best) best = v, best_i = i;
              }
          r.y.push_back(kind == Kind::max ? best : sum / double(k[0] * k[1] * k[2]));
          r.idx.push_back(best_i);
        }
  return r;
}

std::vector<double> adaptive_ref(const Tensor& x5, const int64_t o[3]) {
  const Shape& sh = x5.shape();
  const int64_t D = sh[2], H = sh[3], W = sh[4];
  const int64_t in[3] = {D, H, W};
  auto vx = values(x5);
  auto lo = [&](int k, int64_t i) { return int64_t(std::floor(double(i) * in[k] / o[k])); };
  auto hi = [&](int k, int64_t i) { return int64_t(std::ceil(double(i + 1) * in[k] / o[k])); };
  std::vector<double> y;
  for (int64_t nc = 0; nc < sh[0] * sh[1]; ++nc)
    for (int64_t od = 0; od < o[0]; ++od)
      for (int64_t oh = 0; oh < o[1]; ++oh)
        for (int64_t ow = 0; ow < o[2]; ++ow) {
          double sum = 0;
          int64_t count = 0;
          for (int64_t d = lo(0, od); d < hi(0, od); ++d)
            for (int64_t h = lo(1, oh); h < hi(1, oh); ++h)
              for (int64_t w = lo(2, ow); w < hi(2, ow); ++w, ++count) sum += vx[nc * D * H * W + (d * H + h) * W + w];
          y.push_back(sum / double(count));
        }
  return y;
}

struct PoolCase {
  Shape shape;  // (N, C, H, W) or (N, C, D, H, W)
  std::vector<int64_t> kernel, stride, padding;
};
std::vector<PoolCase> pool_cases() {
  return {
      {{2, 3, 7, 9}, {3}, {2}, {1}},            // overlapping windows, padding
      {{2, 3, 7, 9}, {2}, {3}, {0}},            // stride > kernel: positions skipped
      {{1, 2, 9, 13}, {3, 2}, {1, 2}, {1, 0}},  // per-dim kernel, stride, padding
      {{2, 1, 7, 9}, {7, 9}, {}, {0}},          // one window covering the plane
      {{1, 2, 5, 7, 6}, {3}, {2}, {1}},         // 3-D
      {{2, 1, 7, 5, 9}, {2, 3, 1}, {3, 1, 2}, {1, 1, 0}},
  };
}

// The case's arrays as (D, H, W), with D = 1 for a 2-D case, and its output size.
void expand3(const PoolCase& c, int64_t k[3], int64_t s[3], int64_t p[3], int64_t o[3]) {
  const int sp = static_cast<int>(c.shape.rank()) - 2;
  for (int i = 0; i < 3; ++i) k[i] = 1, s[i] = 1, p[i] = 0, o[i] = 1;
  for (int d = 0; d < sp; ++d) {
    const int slot = d + 3 - sp;
    auto pick = [&](const std::vector<int64_t>& v, int64_t dflt) { return v.empty() ? dflt : v[v.size() == 1 ? 0 : d]; };
    k[slot] = pick(c.kernel, 0);
    s[slot] = pick(c.stride, k[slot]);
    p[slot] = pick(c.padding, 0);
    o[slot] = (c.shape[2 + d] + 2 * p[slot] - k[slot]) / s[slot] + 1;
  }
}

Tensor as5d(const Tensor& x) {
  return x.dim() == 5 ? x : x.reshape({x.size(0), x.size(1), 1, x.size(2), x.size(3)});
}

}  // namespace

// ---- pooling -------------------------------------------------------------------------------

TEST(Pool, MaxAndAvgMatchDirectLoops) {
  manual_seed(51);
  for (const PoolCase& c : pool_cases()) {
    SCOPED_TRACE(c.shape.str() + " kernel " + Shape(c.kernel).str() + " stride " + Shape(c.stride).str());
    const bool is3d = c.shape.rank() == 5;
    int64_t k[3], s[3], p[3], o[3];
    expand3(c, k, s, p, o);
    Tensor x = random(c.shape);
    const PoolParams params{.kernel_size = c.kernel, .stride = c.stride, .padding = c.padding};
    MaxPoolResult m = is3d ? max_pool3d_with_indices(x, params) : max_pool2d_with_indices(x, params);
    Tensor a = is3d ? avg_pool3d(x, params) : avg_pool2d(x, params);
    Ref rm = pool_ref(as5d(x), Kind::max, k, s, p, o), ra = pool_ref(as5d(x), Kind::avg, k, s, p, o);
    ASSERT_EQ(m.output.numel(), static_cast<int64_t>(rm.y.size()));
    EXPECT_EQ(m.output.size(-1), o[2]);
    EXPECT_EQ(m.output.size(-2), o[1]);
    EXPECT_EQ(values(m.output), rm.y);
    EXPECT_EQ(m.indices.to_vector<int64_t>(), rm.idx);
    auto va = values(a);
    for (size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(va[i], ra.y[i], 1e-15) << i;
  }
}

TEST(Pool, AdaptiveAvgMatchesPyTorchWindows) {
  manual_seed(52);
  struct A {
    Shape shape;
    std::vector<int64_t> out;
  };
  for (const A& c : {A{{2, 3, 7, 9}, {3, 4}}, A{{1, 2, 5, 13}, {5, 13}}, A{{1, 1, 3, 4}, {5, 7}},
                     A{{2, 2, 7, 9}, {1}}, A{{1, 2, 5, 7, 6}, {2, 3, 4}}, A{{1, 1, 3, 5, 2}, {4, 2, 3}}}) {
    SCOPED_TRACE(c.shape.str() + " -> " + Shape(c.out).str());
    const int sp = static_cast<int>(c.shape.rank()) - 2;
    int64_t o[3] = {1, 1, 1};
    for (int d = 0; d < sp; ++d) o[d + 3 - sp] = c.out[c.out.size() == 1 ? 0 : d];
    Tensor x = random(c.shape);
    Tensor y = sp == 2 ? adaptive_avg_pool2d(x, c.out) : adaptive_avg_pool3d(x, c.out);
    auto want = adaptive_ref(as5d(x), o);
    auto got = values(y);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
  }
  // Output 1x1 is the plane's mean.
  Tensor x = random({2, 3, 7, 9});
  auto g = values(adaptive_avg_pool2d(x, {1}));
  auto m = values(mean(x, {2, 3}));
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], m[i], 1e-15);
}

TEST(Pool, MaxTiesNaNAndPaddingFollowPyTorch) {
  // Ties: the first maximum in window order; the backward sums where windows share it.
  Tensor x = from_vector(std::vector<double>{1, 3, 3, 2}, {1, 1, 1, 4}).requires_grad_();
  Tape tape;
  MaxPoolResult r = max_pool2d_with_indices(x, {.kernel_size = {1, 2}, .stride = {1}});
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 2}));
  tape.backward(sum(r.output * from_vector(std::vector<double>{1, 10, 100}, {1, 1, 1, 3})));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{0, 11, 100, 0}));

  // A NaN in the window wins.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor n = from_vector(std::vector<double>{1, nan, 5, 2}, {1, 1, 2, 2});
  MaxPoolResult rn = max_pool2d_with_indices(n, {.kernel_size = {2}});
  EXPECT_TRUE(std::isnan(values(rn.output)[0]));
  EXPECT_EQ(rn.indices.to_vector<int64_t>()[0], 1);

  // Padding is -inf for max (never a 0 that beats negative inputs) and 0 for average
  // (count_include_pad: the divisor is always the kernel's size).
  Tensor neg = uniform({1, 2, 5, 5}, -2, -1, {.dtype = f64});
  for (double v : values(max_pool2d(neg, {.kernel_size = {3}, .stride = {1}, .padding = {1}}))) EXPECT_LT(v, -0.5);
  Tensor one = ones({1, 1, 3, 3}, {.dtype = f64});
  auto av = values(avg_pool2d(one, {.kernel_size = {3}, .stride = {1}, .padding = {1}}));
  EXPECT_DOUBLE_EQ(av[0], 4.0 / 9.0);  // corner: 4 real elements of 9
  EXPECT_DOUBLE_EQ(av[4], 1.0);
}

TEST(Pool, GradcheckAtOddShapes) {
  manual_seed(53);
  for (const PoolCase& c : pool_cases()) {
    SCOPED_TRACE(c.shape.str() + " kernel " + Shape(c.kernel).str());
    const bool is3d = c.shape.rank() == 5;
    const PoolParams params{.kernel_size = c.kernel, .stride = c.stride, .padding = c.padding};
    Tensor x = param(c.shape);
    TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) {
      return is3d ? max_pool3d(in[0], params) : max_pool2d(in[0], params);
    }, std::vector<Tensor>({x}));
    TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) {
      return is3d ? avg_pool3d(in[0], params) : avg_pool2d(in[0], params);
    }, std::vector<Tensor>({x}));
  }
  Tensor x2 = param({2, 3, 7, 9}), x3 = param({1, 2, 5, 7, 6});
  for (std::vector<int64_t> o : {std::vector<int64_t>{3, 4}, {9, 11}, {1}}) {
    TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], o); },
                        std::vector<Tensor>({x2}));
  }
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return adaptive_avg_pool3d(in[0], {2, 3, 4}); },
                      std::vector<Tensor>({x3}));
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return adaptive_avg_pool3d(in[0], {7, 8, 9}); },
                      std::vector<Tensor>({x3}));
}

// The CUDA backward gathers over pool_inverse_window: it must list exactly the outputs
// whose windows (pool_window) hold each input, for every kind, stride and padding.
TEST(Pool, InverseWindowsListExactlyTheWindowsHoldingAnInput) {
  for (PoolKind kind : {PoolKind::max, PoolKind::adaptive_avg}) {
    for (int64_t in : {1, 2, 5, 7, 13}) {
      for (int64_t k = 1; k <= 5; ++k) {
        for (int64_t s = 1; s <= 6; ++s) {
          for (int64_t pad = 0; pad <= k / 2; ++pad) {
            PoolProblem p;
            p.kind = kind;
            p.in[2] = in;
            p.kernel[2] = k;
            p.stride[2] = s;
            p.padding[2] = pad;
            if (kind == PoolKind::adaptive_avg) {
              p.out[2] = k * s;  // 1 .. 30: fewer and more outputs than inputs
            } else {
              if (in + 2 * pad < k) continue;
              p.out[2] = (in + 2 * pad - k) / s + 1;
            }
            for (int64_t i = 0; i < in; ++i) {
              int64_t first = -1, last = -1;
              pool_inverse_window(p, 2, i, first, last);
              for (int64_t o = 0; o < p.out[2]; ++o) {
                const PoolWindow w = pool_window(p, 2, o);
                const bool holds = w.begin <= i && i < w.end;
                EXPECT_EQ(holds, first <= o && o < last)
                    << "kind " << int(kind) << " in " << in << " k " << k << " s " << s << " pad " << pad << " i " << i
                    << " o " << o;
              }
            }
            if (kind == PoolKind::adaptive_avg) break;  // kernel and padding do not matter
          }
        }
      }
    }
  }
}

TEST(Pool, ErrorsAreTypedAndNameTheOp) {
  Tensor x = random({2, 3, 7, 9});
  EXPECT_THROW(max_pool2d(random({3, 7, 9}), {.kernel_size = {2}}), ShapeError);
  TG_EXPECT_ERROR(max_pool2d(random({3, 7, 9}), {.kernel_size = {2}}), "max_pool2d", "4-D", "f64[3, 7, 9]");
  TG_EXPECT_ERROR(avg_pool3d(x, {.kernel_size = {2}}), "avg_pool3d", "5-D", "[2, 3, 7, 9]");
  EXPECT_THROW(max_pool2d(x, {.kernel_size = {8}}), ShapeError);  // 8 > 7 in H
  TG_EXPECT_ERROR(max_pool2d(x, {.kernel_size = {8}}), "max_pool2d", "larger than the padded input", "dim H",
                  "[2, 3, 7, 9]");
  EXPECT_NO_THROW(max_pool2d(x, {.kernel_size = {8}, .padding = {1}}));  // 7 + 2 >= 8
  TG_EXPECT_ERROR(avg_pool2d(x, {.kernel_size = {3}, .padding = {2}}), "avg_pool2d", "padding", "half");
  TG_EXPECT_ERROR(max_pool3d(random({1, 1, 4, 4, 4}), {.kernel_size = {2, 4, 4}, .padding = {0, 2, 3}}),
                  "max_pool3d", "padding", "half", "dim W");
  TG_EXPECT_ERROR(max_pool2d(x, {.kernel_size = {2}, .stride = {0}}), "max_pool2d", "stride", "positive");
  TG_EXPECT_ERROR(max_pool2d(x, {.kernel_size = {0}}), "max_pool2d", "kernel_size", "positive");
  TG_EXPECT_ERROR(max_pool2d(x, {.kernel_size = {2}, .padding = {-1}}), "padding", "non-negative");
  TG_EXPECT_ERROR(max_pool2d(x, {.kernel_size = {2, 2, 2}}), "max_pool2d", "kernel_size has 3 values");
  TG_EXPECT_ERROR(max_pool2d(x, {}), "max_pool2d", "kernel_size is required");
  TG_EXPECT_ERROR(adaptive_avg_pool2d(x, {0, 2}), "adaptive_avg_pool2d", "output_size", "positive");
  TG_EXPECT_ERROR(adaptive_avg_pool3d(x, {2}), "adaptive_avg_pool3d", "5-D");
  TG_EXPECT_ERROR(adaptive_avg_pool2d(random({1, 1, 0, 3}), {2}), "adaptive_avg_pool2d", "empty");
  Tensor idx = from_vector(std::vector<int64_t>(16, 1), {1, 1, 4, 4});
  EXPECT_THROW(max_pool2d(idx, {.kernel_size = {2}}), DTypeError);

  // The kernels check their buffers against the problem.
  const PoolProblem p = make_pool_problem("test", PoolKind::max, 2, x, {.kernel_size = {3}, .stride = {2}, .padding = {1}});
  EXPECT_EQ(pool_output_shape(p), Shape({2, 3, 4, 5}));
  Tensor out = Tensor::empty({2, 3, 4, 5}, {.dtype = f64});
  Tensor ind = Tensor::empty({2, 3, 4, 5}, {.dtype = DType::i64});
  EXPECT_THROW(cpu::pool_forward(Tensor::empty({2, 3, 4, 4}, {.dtype = f64}), ind, x, p), ShapeError);
  EXPECT_THROW(cpu::pool_forward(out, Tensor::empty({2, 3, 4, 5}, {.dtype = f64}), x, p), DTypeError);
  EXPECT_THROW(cpu::pool_forward(out, Tensor(), x, p), Error);
  EXPECT_THROW(cpu::pool_forward(Tensor::empty({2, 3, 4, 5}), ind, x, p), DTypeError);
  cpu::pool_forward(out, ind, x, p);
  TG_EXPECT_ERROR(max_pool_backward(random({2, 3, 4, 4}), ind, p), "max_pool2d_backward", "[2, 3, 4, 4]",
                  "[2, 3, 4, 5]");
  ind.fill_(63.0);  // one past the 7 x 9 plane
  TG_EXPECT_ERROR(max_pool_backward(random({2, 3, 4, 5}), ind, p), "index 63");
}

// An empty spatial dim leaves windows over nothing but padding (a -inf max, a 0 / 0 average):
// rejected as PyTorch does, naming the op, the shape and the dim. An empty batch or channel
// dim is an empty result, forward and backward.
TEST(Pool, EmptySpatialDimIsRejectedEmptyBatchIsNot) {
  const PoolParams params{.kernel_size = {2}, .stride = {1}, .padding = {1}};
  const PoolParams exclude_pad{.kernel_size = {2}, .stride = {1}, .padding = {1}, .count_include_pad = false};
  EXPECT_THROW(max_pool2d(random({1, 1, 0, 3}), params), ShapeError);
  TG_EXPECT_ERROR(max_pool2d(random({1, 1, 0, 3}), params), "max_pool2d: input f64[1, 1, 0, 3]",
                  "is empty in spatial dim H");
  TG_EXPECT_ERROR(avg_pool2d(random({1, 1, 3, 0}), exclude_pad), "avg_pool2d", "[1, 1, 3, 0]", "dim W");
  TG_EXPECT_ERROR(avg_pool3d(random({1, 1, 0, 3, 3}), params), "avg_pool3d", "[1, 1, 0, 3, 3]", "dim D");
  TG_EXPECT_ERROR(max_pool3d(random({1, 1, 3, 3, 0}), params), "max_pool3d", "[1, 1, 3, 3, 0]", "dim W");

  for (const Shape& shape : {Shape{0, 3, 7, 9}, Shape{2, 0, 7, 9}}) {
    SCOPED_TRACE(shape.str());
    Tensor x = Tensor::empty(shape, {.dtype = f64}).requires_grad_();
    Tape tape;
    Tensor y = max_pool2d(x, params), z = avg_pool2d(x, exclude_pad), a = adaptive_avg_pool2d(x, {2});
    EXPECT_EQ(y.shape(), Shape({shape[0], shape[1], 8, 10}));
    EXPECT_EQ(z.shape(), y.shape());
    tape.backward(add(add(sum(y), sum(z)), sum(a)));
    EXPECT_EQ(x.grad().shape(), shape);
  }
}

// A window of 2^32 x 2^32 taps (padding 2^31 each side) over one element: the divisor 2^64
// overflows int64 and must not come out as inf. The 3-D kernel 2^21 in every dim is 2^63.
TEST(Pool, HugeWindowsDivideByTheirTrueSize) {
  manual_seed(57);
  const int64_t k = int64_t(1) << 32;
  Tensor x = random({1, 1, 1, 1}).requires_grad_();
  Tape tape;
  const Tensor y = avg_pool2d(x, {.kernel_size = {k}, .padding = {k / 2}});
  ASSERT_EQ(y.shape(), Shape({1, 1, 1, 1}));
  EXPECT_EQ(y.item(), x.item() * std::ldexp(1.0, -64));  // scaling by a power of 2 is exact
  const Tensor dy = random({1, 1, 1, 1});
  tape.backward(y, dy);
  EXPECT_EQ(x.grad().item(), dy.item() * std::ldexp(1.0, -64));
  EXPECT_EQ(max_pool2d(x, {.kernel_size = {k}, .padding = {k / 2}}).item(), x.item());

  const int64_t k3 = int64_t(1) << 21;
  Tensor x3 = random({1, 2, 1, 1, 1});
  const std::vector<double> y3 = values(avg_pool3d(x3, {.kernel_size = {k3}, .padding = {k3 / 2}}));
  ASSERT_EQ(y3.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(y3[i], values(x3)[i] * std::ldexp(1.0, -63));
}

// A PoolProblem built by a caller goes to the kernels as it is: the public backward
// functions and the kernel entries validate it first, as make_pool_problem would have built
// it (a zero dilation divided by zero, a negative one read before the input).
TEST(Pool, CallerBuiltProblemsAreValidated) {
  // W = 3, kernel 2, stride 1, padding 1: 4 outputs.
  PoolProblem good;
  good.kind = PoolKind::avg;
  good.N = good.C = 1;
  good.in[2] = 3;
  good.out[2] = 4;
  good.kernel[2] = 2;
  good.padding[2] = 1;
  const Tensor dy = random({1, 1, 1, 4});
  // Windows [-1, 0], [0, 1], [1, 2], [2, 3] with padding counted: each of 2 taps.
  const std::vector<double> g = values(dy);
  const std::vector<double> want = {(g[0] + g[1]) / 2, (g[1] + g[2]) / 2, (g[2] + g[3]) / 2};
  const std::vector<double> got = values(avg_pool_backward(dy, good));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15);

  auto with = [&](auto&& change) {
    PoolProblem p = good;
    change(p);
    return p;
  };
  const std::vector<std::pair<const char*, PoolProblem>> bad = {
      {"dilation 0", with([](PoolProblem& p) { p.dilation[2] = 0; })},
      {"dilation -1", with([](PoolProblem& p) { p.dilation[2] = -1; })},
      {"dilation 2 for an average", with([](PoolProblem& p) { p.dilation[2] = 2; })},
      {"stride 0", with([](PoolProblem& p) { p.stride[2] = 0; })},
      {"kernel 0", with([](PoolProblem& p) { p.kernel[2] = 0; })},
      {"padding -1", with([](PoolProblem& p) { p.padding[2] = -1; })},
      {"padding above half the kernel", with([](PoolProblem& p) { p.padding[2] = 2; })},
      {"output too long", with([](PoolProblem& p) { p.out[2] = 5; })},
      {"output too short", with([](PoolProblem& p) { p.out[2] = 2; })},
      {"empty input", with([](PoolProblem& p) { p.in[2] = 0; })},
      {"negative batch", with([](PoolProblem& p) { p.N = -1; })},
      {"2-D problem with a depth", with([](PoolProblem& p) { p.in[0] = p.out[0] = 3; })},
      {"overflowing plane", with([](PoolProblem& p) { p.in[0] = p.in[1] = int64_t(1) << 40; p.spatial = 3; })},
  };
  for (const auto& [what, p] : bad) {
    SCOPED_TRACE(what);
    TG_EXPECT_ERROR(avg_pool_backward(dy, p), "avg_pool_backward");
    Tensor dx = Tensor::empty({1, 1, 1, 3}, {.dtype = f64});
    TG_EXPECT_ERROR(cpu::pool_backward(dx, dy, Tensor(), p), "avg_pool", "_backward");
  }
  TG_EXPECT_ERROR(avg_pool_backward(dy, bad[0].second), "avg_pool_backward: invalid problem", "dilation [1, 1, 0]");

  // A max problem whose dilated window (taps at -2 and 1 over W = 1) holds no element.
  PoolProblem max_p;
  max_p.N = max_p.C = 1;
  max_p.out[2] = 2;
  max_p.kernel[2] = 2;
  max_p.padding[2] = 2;
  max_p.dilation[2] = 3;
  const Tensor ind = from_vector(std::vector<int64_t>{0, 0}, {1, 1, 1, 2});
  TG_EXPECT_ERROR(max_pool_backward(random({1, 1, 1, 2}), ind, max_p), "max_pool_backward", "holds no input");
  Tensor out = Tensor::empty({1, 1, 1, 2}, {.dtype = f64}), idx = Tensor::empty({1, 1, 1, 2}, {.dtype = DType::i64});
  TG_EXPECT_ERROR(cpu::pool_forward(out, idx, random({1, 1, 1, 1}), max_p), "max_pool2d", "holds no input");

  PoolProblem adaptive;
  adaptive.kind = PoolKind::adaptive_avg;
  adaptive.N = adaptive.C = 1;
  adaptive.in[2] = 0;
  adaptive.out[2] = 2;
  TG_EXPECT_ERROR(avg_pool_backward(random({1, 1, 1, 2}), adaptive), "avg_pool_backward", "invalid problem");
}

TEST(PoolModules, MatchTheFunctionalOpsAndTrain) {
  manual_seed(54);
  Tensor x = random({2, 3, 7, 9});
  Tensor x3 = random({1, 2, 5, 7, 6});
  auto same = [](const Tensor& a, const Tensor& b) { return values(a) == values(b); };
  const PoolParams p{.kernel_size = {3}, .stride = {2}, .padding = {1}};
  EXPECT_TRUE(same(nn::MaxPool2d(p)(x), max_pool2d(x, p)));
  EXPECT_TRUE(same(nn::AvgPool2d(p)(x), avg_pool2d(x, p)));
  EXPECT_TRUE(same(nn::MaxPool3d(p)(x3), max_pool3d(x3, p)));
  EXPECT_TRUE(same(nn::AvgPool3d({.kernel_size = {2}})(x3), avg_pool3d(x3, {.kernel_size = {2}})));
  EXPECT_TRUE(same(nn::AdaptiveAvgPool2d({3, 4})(x), adaptive_avg_pool2d(x, {3, 4})));
  EXPECT_TRUE(same(nn::AdaptiveAvgPool3d({2})(x3), adaptive_avg_pool3d(x3, {2})));
  EXPECT_EQ(nn::Flatten()(x).shape(), Shape({2, 189}));
  EXPECT_EQ(nn::MaxPool2d(p).options().stride, std::vector<int64_t>{2});
  TG_EXPECT_ERROR(nn::MaxPool2d({.kernel_size = {3}, .padding = {2}}), "MaxPool2d", "half");
  TG_EXPECT_ERROR(nn::AvgPool3d({.kernel_size = {2, 2}}), "AvgPool3d", "kernel_size has 2 values");
  TG_EXPECT_ERROR(nn::AdaptiveAvgPool2d({0}), "AdaptiveAvgPool2d", "positive");
  nn::MaxPool2d pool2d(p);
  TG_EXPECT_ERROR(pool2d(x3), "max_pool2d", "4-D");

  const TensorOptions f64_opts{.dtype = f64};
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::MaxPool2d>(PoolParams{.kernel_size = {2}, .stride = {1}}),
      std::make_shared<nn::AvgPool2d>(PoolParams{.kernel_size = {3}, .stride = {2}, .padding = {1}}),
      std::make_shared<nn::AdaptiveAvgPool2d>(std::vector<int64_t>{2, 3}), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 18, .out_features = 4}, f64_opts)});
  std::vector<std::string> names;
  for (const auto& [name, t] : model->state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"4.weight", "4.bias"}));
  Tensor xi = param({2, 3, 7, 9});
  TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return model->forward(in[0]); }, std::vector<Tensor>({xi}));
}
