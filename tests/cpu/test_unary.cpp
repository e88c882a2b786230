// The unary ops, activations and softmax/log_softmax on the CPU: values against direct
// formulas in f64 (std::erf, std::tanh, not the library's shared formulas) and known PyTorch
// values, gradients against central differences at odd shapes, PyTorch's edge values, the
// typed errors, and the nn modules.
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "common/test_util.h"
#include "ops/cpu/unary_kernels.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo, hi;  // input range: inside the op's domain, where it is differentiable
};

std::vector<UnaryCase> unary_cases() {
  const double k = std::sqrt(2.0 / M_PI);
  return {
      {"exp", [](const Tensor& x) { return exp(x); }, [](double v) { return std::exp(v); }, -3, 3},
      {"log", [](const Tensor& x) { return log(x); }, [](double v) { return std::log(v); }, 0.2, 3},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double v) { return std::sqrt(v); }, 0.2, 3},
      {"pow3", [](const Tensor& x) { return pow(x, 3.0); }, [](double v) { return v * v * v; }, -2, 2},
      {"pow0.5", [](const Tensor& x) { return pow(x, 0.5); }, [](double v) { return std::sqrt(v); }, 0.2, 3},
      {"pow-1.5", [](const Tensor& x) { return pow(x, -1.5); }, [](double v) { return 1.0 / (v * std::sqrt(v)); }, 0.5, 2},
      {"pow0", [](const Tensor& x) { return pow(x, 0.0); }, [](double) { return 1.0; }, -2, 2},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double v) { return std::fabs(v); }, -2, 2},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.7); },
       [](double v) { return std::min(std::max(v, -0.5), 0.7); }, -2, 2},
      {"clamp_min", [](const Tensor& x) { return clamp(x, 0.3, std::nullopt); },
       [](double v) { return std::max(v, 0.3); }, -2, 2},
      {"clamp_max", [](const Tensor& x) { return clamp(x, std::nullopt, -0.2); },
       [](double v) { return std::min(v, -0.2); }, -2, 2},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, [](double v) { return 1.0 / (1.0 + std::exp(-v)); }, -6, 6},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double v) { return std::tanh(v); }, -3, 3},
      {"gelu", [](const Tensor& x) { return gelu(x); },
       [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); }, -4, 4},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApproximate::tanh); },
       [k](double v) { return 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v))); }, -4, 4},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double v) { return v / (1.0 + std::exp(-v)); }, -6, 6},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x); }, [](double v) { return v > 0 ? v : 0.01 * v; }, -2, 2},
      {"leaky_relu0.2", [](const Tensor& x) { return leaky_relu(x, 0.2); }, [](double v) { return v > 0 ? v : 0.2 * v; }, -2, 2},
  };
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// Element (a, b, c) of a (3, 5, 7) tensor, and the flat index of element j along `dim` of
// the row that (a, b, c) belongs to.
int64_t at(int64_t a, int64_t b, int64_t c) { return (a * 5 + b) * 7 + c; }

// softmax (or log_softmax) of a (3, 5, 7) tensor along dim, directly from the definition.
std::vector<double> softmax_ref(const std::vector<double>& x, int dim, bool log) {
  const int64_t sizes[3] = {3, 5, 7};
  std::vector<double> y(x.size());
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t b = 0; b < 5; ++b)
      for (int64_t c = 0; c < 7; ++c) {
        int64_t idx[3] = {a, b, c};
        double den = 0;
        for (int64_t j = 0; j < sizes[dim]; ++j) {
          idx[dim] = j;
          den += std::exp(x[at(idx[0], idx[1], idx[2])]);
        }
        const double v = x[at(a, b, c)];
        y[at(a, b, c)] = log ? v - std::log(den) : std::exp(v) / den;
      }
  return y;
}

}  // namespace

TEST(Unary, ValuesMatchDirectFormulasInF64) {
  manual_seed(11);
  for (const UnaryCase& c : unary_cases()) {
    Tensor x = uniform({7, 9}, c.lo, c.hi, {.dtype = f64});
    Tensor y = c.op(x);
    ASSERT_EQ(y.shape(), x.shape()) << c.name;
    ASSERT_EQ(y.dtype(), f64) << c.name;
    auto vx = values(x), vy = values(y);
    for (size_t i = 0; i < vx.size(); ++i) {
      const double want = c.ref(vx[i]);
      EXPECT_NEAR(vy[i], want, 1e-14 * std::max(1.0, std::fabs(want))) << c.name << " at x = " << vx[i];
    }
  }
}

TEST(Unary, F32ValuesMatchTheF64Formulas) {
  manual_seed(12);
  for (const UnaryCase& c : unary_cases()) {
    Tensor x = uniform({13, 9}, c.lo, c.hi);  // f32
    Tensor y = c.op(x);
    ASSERT_EQ(y.dtype(), f32) << c.name;
    auto vx = values(x), vy = values(y);
    for (size_t i = 0; i < vx.size(); ++i) {
      const double want = c.ref(vx[i]);
      EXPECT_NEAR(vy[i], want, 1e-6 * std::max(1.0, std::fabs(want))) << c.name << " at x = " << vx[i];
    }
  }
}

TEST(Unary, KnownPyTorchValues) {
  Tensor x = from_vector(std::vector<double>{1.0, -0.5, 2.0}, {3});
  auto expect = [](const Tensor& y, std::vector<double> want) {
    auto got = values(y);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << i;
  };
  expect(gelu(x), {0.8413447460685429, -0.15426876936299344, 1.9544997361036416});
  expect(gelu(x, GeluApproximate::tanh), {0.8411919906082768, -0.15428599017485606, 1.954597694087775});
  expect(silu(x), {0.7310585786300049, -0.1887703343990727, 1.7615941559557646});
  expect(sigmoid(x), {0.7310585786300049, 0.3775406687981454, 0.8807970779778823});
  expect(leaky_relu(x), {1.0, -0.005, 2.0});
}

TEST(Unary, GradcheckAtOddShapes) {
  manual_seed(13);
  for (const UnaryCase& c : unary_cases()) {
    for (Shape s : {Shape{7, 9}, Shape{3, 5, 7}}) {
      Tensor x = uniform(s, c.lo, c.hi, {.dtype = f64}).requires_grad_();
      auto r = gradcheck([&](const std::vector<Tensor>& in) { return c.op(in[0]); }, {x});
      EXPECT_TRUE(r.ok) << c.name << " " << s << ": " << r.message;
    }
  }
}

TEST(Unary, GradcheckThroughAChain) {
  manual_seed(14);
  Tensor x = param({9, 7});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) {
    return log(sigmoid(gelu(in[0] * 2.0, GeluApproximate::tanh)) + 0.5) * tanh(silu(in[0]));
  }, std::vector<Tensor>({x}));
}

TEST(Unary, EdgeValuesFollowPyTorch) {
  Tensor z = from_vector(std::vector<double>{0.0, -1.0, 4.0}, {3});
  auto l = values(log(z));
  EXPECT_EQ(l[0], -kInf);
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_DOUBLE_EQ(l[2], std::log(4.0));
  auto s = values(sqrt(z));
  EXPECT_EQ(s[0], 0.0);
  EXPECT_TRUE(std::isnan(s[1]));
  EXPECT_EQ(s[2], 2.0);
  // f32 too: log(0) is -inf, not a large negative number.
  EXPECT_EQ(log(z.to(f32)).to_vector<float>()[0], -std::numeric_limits<float>::infinity());

  Tensor big = from_vector(std::vector<double>{-1000.0, 1000.0, -kInf, kInf}, {4});
  EXPECT_EQ(values(exp(big)), (std::vector<double>{0.0, kInf, 0.0, kInf}));
  EXPECT_EQ(values(sigmoid(big)), (std::vector<double>{0.0, 1.0, 0.0, 1.0}));
  EXPECT_EQ(values(tanh(big)), (std::vector<double>{-1.0, 1.0, -1.0, 1.0}));
  auto si = values(silu(big.to(f32)));
  EXPECT_EQ(si[0], 0.0);  // -1000 * sigmoid(-1000): no NaN from -1000 / inf
  EXPECT_EQ(si[1], 1000.0);
  auto ge = values(gelu(from_vector(std::vector<double>{-40.0, 40.0}, {2})));
  EXPECT_EQ(ge[0], 0.0);
  EXPECT_EQ(ge[1], 40.0);

  Tensor p = from_vector(std::vector<double>{-8.0, 0.0, -2.0}, {3});
  auto p3 = values(pow(p, 1.0 / 3.0));
  EXPECT_TRUE(std::isnan(p3[0]));  // fractional power of a negative base
  EXPECT_EQ(p3[1], 0.0);
  EXPECT_EQ(values(pow(p, 2.0)), (std::vector<double>{64.0, 0.0, 4.0}));
  EXPECT_EQ(values(pow(p, -1.0))[1], kInf);

  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor c = from_vector(std::vector<double>{-3.0, 0.0, 3.0, nan}, {4});
  auto cl = values(clamp(c, -1.0, 1.0));
  EXPECT_EQ(cl[0], -1.0);
  EXPECT_EQ(cl[1], 0.0);
  EXPECT_EQ(cl[2], 1.0);
  EXPECT_TRUE(std::isnan(cl[3]));  // NaN is not clamped away
  auto inverted = values(clamp(c, 2.0, 1.0));  // min > max: everything is max
  EXPECT_EQ(inverted[0], 1.0);
  EXPECT_EQ(inverted[1], 1.0);
  EXPECT_EQ(inverted[2], 1.0);
}

TEST(Unary, GradientsAtEdgesFollowPyTorch) {
  auto grad_of = [](const std::function<Tensor(const Tensor&)>& f, std::vector<double> at) {
    Tensor x = from_vector(at, {static_cast<int64_t>(at.size())}).requires_grad_();
    Tape tape;
    tape.backward(sum(f(x)));
    return values(x.grad());
  };
  // |x|' = sign(x), 0 at 0.
  EXPECT_EQ(grad_of([](const Tensor& x) { return abs(x); }, {-2, 0, 3}), (std::vector<double>{-1, 0, 1}));
  // clamp passes the gradient where min <= x <= max, bounds included.
  EXPECT_EQ(grad_of([](const Tensor& x) { return clamp(x, -1.0, 1.0); }, {-2, -1, 0, 1, 2}),
            (std::vector<double>{0, 1, 1, 1, 0}));
  // leaky_relu at 0 takes the negative slope (x > 0 is false).
  EXPECT_EQ(grad_of([](const Tensor& x) { return leaky_relu(x, 0.2); }, {-1, 0, 1}),
            (std::vector<double>{0.2, 0.2, 1}));
  // d/dx x^0 = 0 everywhere, also at 0.
  EXPECT_EQ(grad_of([](const Tensor& x) { return pow(x, 0.0); }, {-1, 0, 2}), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(grad_of([](const Tensor& x) { return pow(x, 2.0); }, {-1.5, 0, 2}), (std::vector<double>{-3, 0, 4}));
  // sqrt and log at 0: inf, as PyTorch.
  EXPECT_EQ(grad_of([](const Tensor& x) { return sqrt(x); }, {0, 4})[0], kInf);
  EXPECT_EQ(grad_of([](const Tensor& x) { return sqrt(x); }, {0, 4})[1], 0.25);
  EXPECT_EQ(grad_of([](const Tensor& x) { return log(x); }, {0, 4})[0], kInf);
  // Saturated activations: gradient 0, never NaN.
  for (double g : grad_of([](const Tensor& x) { return sigmoid(x); }, {-1000, 1000})) EXPECT_EQ(g, 0.0);
  for (double g : grad_of([](const Tensor& x) { return tanh(x); }, {-1000, 1000})) EXPECT_EQ(g, 0.0);
  auto sg = grad_of([](const Tensor& x) { return silu(x); }, {-1000, 1000});
  EXPECT_EQ(sg[0], 0.0);
  EXPECT_EQ(sg[1], 1.0);
  // GELU'(0) = 0.5 in both forms.
  EXPECT_NEAR(grad_of([](const Tensor& x) { return gelu(x); }, {0})[0], 0.5, 1e-15);
  EXPECT_NEAR(grad_of([](const Tensor& x) { return gelu(x, GeluApproximate::tanh); }, {0})[0], 0.5, 1e-15);
}

TEST(Unary, OutputSavingOpsRefuseAModifiedOutput) {
  // exp saves its output for backward; writing into it afterwards must be caught.
  Tensor x = param({3, 4});
  Tape tape;
  Tensor y = exp(x);
  Tensor loss = sum(y * 1.0);
  y.fill_(0.0);
  TG_EXPECT_ERROR(tape.backward(loss), "exp", "modified in place");
}

TEST(Unary, ErrorsAreTypedAndNameTheOp) {
  Tensor idx = from_vector(std::vector<int64_t>{1, 2}, {2});
  EXPECT_THROW(exp(idx), DTypeError);
  TG_EXPECT_ERROR(gelu(idx), "gelu", "i64[2]");
  TG_EXPECT_ERROR(sqrt(Tensor()), "sqrt", "undefined");
  TG_EXPECT_ERROR(clamp(random({2}), std::nullopt, std::nullopt), "clamp", "min", "max");

  // Backward with a gradient of another dtype or shape.
  const UnaryParams tanh_p{.op = UnaryOp::tanh};
  EXPECT_THROW(unary_backward(random({2, 3}, f32), random({2, 3}), tanh_p), DTypeError);
  TG_EXPECT_ERROR(unary_backward(random({2, 3}, f32), random({2, 3}), tanh_p), "tanh_backward", "f32[2, 3]", "f64[2, 3]");
  EXPECT_THROW(unary_backward(random({3, 2}), random({2, 3}), tanh_p), ShapeError);
  TG_EXPECT_ERROR(unary_backward(random({3, 2}), random({2, 3}), tanh_p), "tanh_backward", "[3, 2]", "[2, 3]");

  // The kernels check their buffers themselves before touching memory.
  Tensor x = random({4, 5});
  Tensor small = Tensor::empty({4, 4}, {.dtype = f64});
  EXPECT_THROW(cpu::unary(small, x, {.op = UnaryOp::exp}), ShapeError);
  EXPECT_THROW(cpu::unary(Tensor::empty({4, 5}), x, {.op = UnaryOp::exp}), DTypeError);
  EXPECT_THROW(cpu::unary_backward(x, x, small, {.op = UnaryOp::silu}), ShapeError);
}

// ---- softmax / log_softmax --------------------------------------------------------------

TEST(Softmax, ValuesMatchTheDefinitionOnEveryDim) {
  manual_seed(21);
  Tensor x = uniform({3, 5, 7}, -3, 3, {.dtype = f64});
  auto vx = values(x);
  for (int64_t dim : {0, 1, 2, -1, -2, -3}) {
    const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
    for (bool log : {false, true}) {
      Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
      auto vy = values(y), want = softmax_ref(vx, d, log);
      for (size_t i = 0; i < vy.size(); ++i) EXPECT_NEAR(vy[i], want[i], 1e-14) << "dim " << dim << " log " << log;
    }
  }
  // Rows along dim 1 sum to 1.
  auto s = values(sum(softmax(x, 1), {1}));
  for (double v : s) EXPECT_NEAR(v, 1.0, 1e-14);
}

TEST(Softmax, GradcheckOnEveryDimAtOddShapes) {
  manual_seed(22);
  Tensor x = uniform({3, 5, 7}, -2, 2, {.dtype = f64}).requires_grad_();
  for (int64_t dim : {0, 1, 2, -1, -2}) {
    for (bool log : {false, true}) {
      auto r = gradcheck([&](const std::vector<Tensor>& in) { return log ? log_softmax(in[0], dim) : softmax(in[0], dim); },
                         {x});
      EXPECT_TRUE(r.ok) << "dim " << dim << " log " << log << ": " << r.message;
    }
  }
  Tensor v = uniform({13}, -2, 2, {.dtype = f64}).requires_grad_();
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return log_softmax(softmax(in[0], 0) * 3.0, -1); },
                      std::vector<Tensor>({v}));
}

TEST(Softmax, LargeLogitsStayFinite) {
  for (DType dt : {f32, f64}) {
    Tensor x = from_vector(std::vector<double>{1000, 1001, 999, -999, -998, -1000}, {2, 3}).to(dt);
    auto y = values(softmax(x, 1)), ly = values(log_softmax(x, 1));
    auto want = values(softmax(from_vector(std::vector<double>{1, 2, 0}, {3}), 0));
    auto lwant = values(log_softmax(from_vector(std::vector<double>{1, 2, 0}, {3}), 0));
    const double tol = dt == f32 ? 1e-6 : 1e-14;
    for (int r = 0; r < 2; ++r)
      for (int j = 0; j < 3; ++j) {
        EXPECT_NEAR(y[r * 3 + j], want[j], tol) << dtype_name(dt);
        EXPECT_NEAR(ly[r * 3 + j], lwant[j], tol) << dtype_name(dt);
      }
  }
}

TEST(Softmax, RowsWithMinusInfinity) {
  // A row with some -inf: 0 there (log_softmax: -inf); gradients stay finite.
  Tensor x = from_vector(std::vector<double>{-kInf, 0.0, 1.0, -kInf, -kInf, -kInf}, {2, 3}).requires_grad_();
  Tensor y, ly;
  {
    Tape tape;
    y = softmax(x, 1);
    tape.backward(sum(y * from_vector(std::vector<double>{1, 2, 3, 1, 1, 1}, {2, 3})));
  }
  auto vy = values(y);
  EXPECT_EQ(vy[0], 0.0);
  EXPECT_NEAR(vy[1], 1.0 / (1.0 + std::exp(1.0)), 1e-15);
  EXPECT_NEAR(vy[2], std::exp(1.0) / (1.0 + std::exp(1.0)), 1e-15);
  for (int j = 3; j < 6; ++j) EXPECT_TRUE(std::isnan(vy[j])) << "an all -inf row is NaN, as in PyTorch";
  auto g = values(x.grad());
  for (int j = 0; j < 3; ++j) EXPECT_TRUE(std::isfinite(g[j])) << j;
  EXPECT_EQ(g[0], 0.0);
  // d/dx1 of (2 y1 + 3 y2) = y1 (2 - (2 y1 + 3 y2))
  EXPECT_NEAR(g[1], vy[1] * (2.0 - (2.0 * vy[1] + 3.0 * vy[2])), 1e-15);

  Tensor x2 = from_vector(std::vector<double>{-kInf, 0.0, 1.0}, {3}).requires_grad_();
  {
    Tape tape;
    ly = log_softmax(x2, 0);
    tape.backward(sum(ly * from_vector(std::vector<double>{0.0, 1.0, 1.0}, {3})));
  }
  auto vly = values(ly);
  EXPECT_EQ(vly[0], -kInf);
  EXPECT_NEAR(vly[2], -std::log1p(std::exp(-1.0)), 1e-15);
  for (double v : values(x2.grad())) EXPECT_TRUE(std::isfinite(v));
}

TEST(Softmax, LongRowsScalarsAndEmptyTensors) {
  manual_seed(23);
  Tensor x = uniform({2, 100003}, -5, 5, {.dtype = f64});
  for (double v : values(sum(softmax(x, -1), {1}))) EXPECT_NEAR(v, 1.0, 1e-12);
  Tensor lx = log_softmax(x, 1);
  auto vx = values(x), vl = values(lx);
  double m = -kInf, s = 0;
  for (int64_t j = 0; j < 100003; ++j) m = std::max(m, vx[j]);
  for (int64_t j = 0; j < 100003; ++j) s += std::exp(vx[j] - m);
  EXPECT_NEAR(vl[12345], vx[12345] - m - std::log(s), 1e-12);

  EXPECT_EQ(softmax(full({}, 3.0, {.dtype = f64}), 0).item(), 1.0);  // 0-d: one element along dim 0
  EXPECT_EQ(log_softmax(full({}, 3.0, {.dtype = f64}), -1).item(), 0.0);
  EXPECT_EQ(softmax(Tensor::empty({0, 5}), 1).shape(), Shape({0, 5}));
  EXPECT_EQ(log_softmax(Tensor::empty({4, 0}), 1).shape(), Shape({4, 0}));
}

// [2^20, 0, 2^20] has no elements but 2^40 rows (outer * inner) along dim 1: the forward
// and backward must skip them, not loop over them (days of empty rows).
TEST(Softmax, EmptyTensorsWithManyRowsFinishAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t big = int64_t(1) << 20;
  const Shape shape{big, 0, big};
  for (bool log : {false, true}) {
    Tensor x = Tensor::empty(shape, {.dtype = f64}).requires_grad_();
    Tape tape;
    Tensor y = log ? log_softmax(x, 1) : softmax(x, 1);
    EXPECT_EQ(y.shape(), shape);
    tape.backward(sum(y));
    EXPECT_EQ(x.grad().shape(), shape);
    EXPECT_EQ(softmax_backward(y, y, 1, log).shape(), shape);
    Tensor out = Tensor::empty(shape, {.dtype = f64});
    cpu::softmax(out, x, make_softmax_problem("softmax", shape, 1, log));  // the kernel entry itself
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

TEST(Softmax, ErrorsAreTypedAndNameTheOp) {
  Tensor x = random({3, 5, 7});
  EXPECT_THROW(softmax(x, 3), ShapeError);
  TG_EXPECT_ERROR(softmax(x, 3), "softmax", "dim 3", "[3, 5, 7]");
  TG_EXPECT_ERROR(log_softmax(x, -4), "log_softmax", "dim -4", "[3, 5, 7]");
  TG_EXPECT_ERROR(softmax(full({}, 1.0), 1), "softmax", "dim 1");
  Tensor idx = from_vector(std::vector<int64_t>{1, 2}, {2});
  EXPECT_THROW(softmax(idx, 0), DTypeError);
  TG_EXPECT_ERROR(log_softmax(idx, 0), "log_softmax", "i64[2]");

  Tensor y = softmax(x, 1);
  EXPECT_THROW(softmax_backward(random({3, 5, 7}, f32), y, 1, false), DTypeError);
  TG_EXPECT_ERROR(softmax_backward(random({3, 5, 7}, f32), y, 1, false), "softmax_backward", "f32[3, 5, 7]",
                  "f64[3, 5, 7]");
  EXPECT_THROW(softmax_backward(random({3, 7, 5}), y, 1, true), ShapeError);
  TG_EXPECT_ERROR(softmax_backward(random({3, 7, 5}), y, 1, true), "log_softmax_backward", "[3, 7, 5]", "[3, 5, 7]");
  TG_EXPECT_ERROR(softmax_backward(random({3, 5, 7}), y, 5, false), "softmax_backward", "dim 5");

  // The kernels check their buffers against the problem.
  SoftmaxProblem p = make_softmax_problem("test", x.shape(), 1, false);
  EXPECT_EQ(p.outer, 3);
  EXPECT_EQ(p.dim_size, 5);
  EXPECT_EQ(p.inner, 7);
  SoftmaxProblem wrong = p;
  wrong.inner = 8;
  Tensor out = Tensor::empty(x.shape(), {.dtype = f64});
  EXPECT_THROW(cpu::softmax(out, x, wrong), ShapeError);
  EXPECT_THROW(cpu::softmax(Tensor::empty(x.shape()), x, p), DTypeError);
  EXPECT_THROW(cpu::softmax_backward(out, x, Tensor::empty({3, 5, 6}, {.dtype = f64}), p), ShapeError);
}

// ---- nn modules -------------------------------------------------------------------------

TEST(Activations, ModulesMatchTheFunctionalOps) {
  manual_seed(31);
  Tensor x = random({4, 6});
  auto same = [](const Tensor& a, const Tensor& b) { return a.to_vector<double>() == b.to_vector<double>(); };
  EXPECT_TRUE(same(nn::Sigmoid()(x), sigmoid(x)));
  EXPECT_TRUE(same(nn::Tanh()(x), tanh(x)));
  EXPECT_TRUE(same(nn::GELU()(x), gelu(x)));
  nn::GELU approx({.approximate = GeluApproximate::tanh});
  EXPECT_EQ(approx.options().approximate, GeluApproximate::tanh);
  EXPECT_TRUE(same(approx(x), gelu(x, GeluApproximate::tanh)));
  EXPECT_FALSE(same(approx(x), gelu(x)));
  EXPECT_TRUE(same(nn::SiLU()(x), silu(x)));
  EXPECT_TRUE(same(nn::LeakyReLU()(x), leaky_relu(x, 0.01)));
  nn::LeakyReLU leaky({.negative_slope = 0.2});
  EXPECT_TRUE(same(leaky(x), leaky_relu(x, 0.2)));
  EXPECT_TRUE(same(nn::Softmax(-1)(x), softmax(x, 1)));
  EXPECT_TRUE(same(nn::LogSoftmax(0)(x), log_softmax(x, 0)));
  EXPECT_EQ(nn::Softmax(1).dim(), 1);
  TG_EXPECT_ERROR(nn::Softmax(2)(x), "softmax", "dim 2", "[4, 6]");
  TG_EXPECT_ERROR(nn::LeakyReLU({.negative_slope = std::nan("")}), "LeakyReLU", "negative_slope");
}

TEST(Activations, HoldNoStateAndTrainInASequential) {
  manual_seed(32);
  const TensorOptions f64_opts{.dtype = f64};
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 5, .out_features = 7}, f64_opts),
      std::make_shared<nn::GELU>(nn::GELUOptions{.approximate = GeluApproximate::tanh}),
      std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 7, .out_features = 9}, f64_opts),
      std::make_shared<nn::SiLU>(), std::make_shared<nn::Tanh>(), std::make_shared<nn::Sigmoid>(),
      std::make_shared<nn::LeakyReLU>(), std::make_shared<nn::Softmax>(1), std::make_shared<nn::LogSoftmax>(-1)});
  std::vector<std::string> names;
  for (const auto& [name, t] : model->state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  Tensor x = param({3, 5});
  TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return model->forward(in[0]); }, std::vector<Tensor>({x}));
  // Parameters get gradients through every activation.
  Tape tape;
  tape.backward(sum(model->forward(x) * random({3, 9})));
  for (const Tensor& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    double norm = 0;
    for (double v : values(p.grad())) norm += v * v;
    EXPECT_GT(norm, 0.0);
  }
}
