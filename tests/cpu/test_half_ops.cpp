// bf16 and f16 in the elementwise ops and reductions (ops/half_compute.h): results in the
// inputs' half type, computed in f32 and rounded once. Checked against references that do not
// go through the ops: the binary ops bit for bit against scalar f32 arithmetic rounded by
// core/half.h; the unary ops, affine and the reductions against f64 math within half an ulp of
// the half type plus the f32 kernels' own error (a few f32 ulps, so a result within that of a
// rounding midpoint may round either way); f32 accumulation shown by a sum that a 16-bit
// accumulator could not reach; mixed dtypes refused; nothing recorded on a tape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/fixtures.h"
#include "common/half_util.h"
#include "common/test_util.h"
#include "core/autocast.h"
#include "core/half.h"
#include "core/safetensors.h"

using namespace tg;
using namespace tg::test;

namespace {

// Random half values in [-range, range], with zeros, +-inf, and (f16) subnormals mixed in.
Tensor random_half(DType t, const Shape& shape, double range, unsigned seed, bool specials = true) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-range, range);
  std::vector<uint16_t> bits(static_cast<size_t>(shape.numel()));
  for (auto& b : bits) b = encode_half(t, u(rng));
  if (specials && bits.size() > 8) {
    bits[0] = 0x0000;
    bits[1] = 0x8000;
    bits[2] = t == DType::bf16 ? 0x7f80 : 0x7c00;  // +inf
    bits[3] = t == DType::bf16 ? 0x0001 : 0x0003;  // subnormals
  }
  Tensor out = Tensor::empty(shape, {.dtype = t});
  std::memcpy(out.raw_data(), bits.data(), bits.size() * 2);
  return out;
}

float value(const Tensor& t, int64_t i) { return decode_half(t.dtype(), half_bits(t)[static_cast<size_t>(i)]); }

// Spacing of the half type's values at |v| (its ulp), and the same for f32.
double half_ulp(DType t, double v) {
  const int mantissa = t == DType::bf16 ? 7 : 10, min_exp = t == DType::bf16 ? -126 : -14;
  const int e = v == 0 ? min_exp : std::max(min_exp, static_cast<int>(std::floor(std::log2(std::fabs(v)))));
  return std::ldexp(1.0, e - mantissa);
}
double f32_ulp(double v) { return std::ldexp(1.0, std::max(-126, static_cast<int>(std::floor(std::log2(std::fabs(v) + 1e-300)))) - 23); }

// |got - want| within half an ulp of the half type plus `f32_ulps` of f32 error, with
// infinities and NaN required to match exactly.
void expect_rounded(DType t, double got, double want, double f32_ulps, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": want NaN, got " << got;
    return;
  }
  if (std::isinf(want) || std::isinf(got)) {
    // Past the half type's largest value rounding gives infinity; both must agree on that.
    const double big = t == DType::bf16 ? 3.3895313892515355e38 : 65504.0;
    if (std::fabs(want) > big * (1 + std::ldexp(1.0, t == DType::bf16 ? -9 : -12))) {
      EXPECT_TRUE(std::isinf(got) && (got > 0) == (want > 0)) << what << ": want " << want << ", got " << got;
      return;
    }
  }
  EXPECT_LE(std::fabs(got - want), 0.5 * half_ulp(t, want) + f32_ulps * f32_ulp(want)) << what << ": want " << want
                                                                                            << ", got " << got;
}

}  // namespace

TEST(HalfOps, BinaryOpsAreF32ArithmeticRoundedOnce) {
  for (DType t : kHalves) {
    const Tensor a = random_half(t, {7, 33}, 8.0, 1), b = random_half(t, {7, 33}, 8.0, 2, false);
    const Tensor row = random_half(t, {33}, 8.0, 3, false);
    struct Op {
      const char* name;
      std::function<Tensor(const Tensor&, const Tensor&)> op;
      std::function<float(float, float)> ref;
    };
    const Op ops[] = {
        {"add", [](const Tensor& x, const Tensor& y) { return add(x, y); }, [](float x, float y) { return x + y; }},
        {"sub", [](const Tensor& x, const Tensor& y) { return x - y; }, [](float x, float y) { return x - y; }},
        {"mul", [](const Tensor& x, const Tensor& y) { return mul(x, y); }, [](float x, float y) { return x * y; }},
        {"div", [](const Tensor& x, const Tensor& y) { return x / y; }, [](float x, float y) { return x / y; }},
    };
    for (const Op& o : ops) {
      for (const Tensor& other : {b, row}) {
        const Tensor out = o.op(a, other);
        ASSERT_EQ(out.dtype(), t) << o.name;
        ASSERT_EQ(out.shape(), a.shape()) << o.name;
        const std::vector<uint16_t> got = half_bits(out);
        for (int64_t i = 0; i < a.numel(); ++i) {
          const int64_t j = other.dim() == 1 ? i % 33 : i;
          const float want = o.ref(value(a, i), value(other, j));
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(decode_half(t, got[static_cast<size_t>(i)]))) << o.name << " element " << i;
            continue;
          }
          ASSERT_EQ(got[static_cast<size_t>(i)], encode_half(t, static_cast<double>(want)))
              << dtype_name(t) << " " << o.name << " element " << i << ": " << value(a, i) << ", " << value(other, j);
        }
      }
    }
  }
}

TEST(HalfOps, UnaryOpsAndAffineWithinHalfAnUlp) {
  for (DType t : kHalves) {
    const Tensor x = random_half(t, {301}, 6.0, 4, false);
    const Tensor pos = tg::abs(random_half(t, {301}, 60.0, 5, false));  // exact: a sign flip
    struct Op {
      const char* name;
      const Tensor* in;
      std::function<Tensor(const Tensor&)> op;
      std::function<double(double)> ref;
    };
    const Op ops[] = {
        {"exp", &x, [](const Tensor& v) { return tg::exp(v); }, [](double v) { return std::exp(v); }},
        {"tanh", &x, [](const Tensor& v) { return tg::tanh(v); }, [](double v) { return std::tanh(v); }},
        {"sigmoid", &x, [](const Tensor& v) { return sigmoid(v); }, [](double v) { return 1 / (1 + std::exp(-v)); }},
        {"relu", &x, [](const Tensor& v) { return relu(v); }, [](double v) { return v > 0 ? v : 0.0; }},
        {"abs", &x, [](const Tensor& v) { return tg::abs(v); }, [](double v) { return std::fabs(v); }},
        {"leaky_relu", &x, [](const Tensor& v) { return leaky_relu(v, 0.1); }, [](double v) { return v > 0 ? v : 0.1 * v; }},
        {"clamp", &x, [](const Tensor& v) { return clamp(v, -1.5, 2.25); }, [](double v) { return std::clamp(v, -1.5, 2.25); }},
        {"sqrt", &pos, [](const Tensor& v) { return tg::sqrt(v); }, [](double v) { return std::sqrt(v); }},
        {"log", &pos, [](const Tensor& v) { return tg::log(v); }, [](double v) { return std::log(v); }},
        {"affine", &x, [](const Tensor& v) { return affine(v, 0.3, -1.25); }, [](double v) { return 0.3 * v - 1.25; }},
    };
    for (const Op& o : ops) {
      const Tensor out = o.op(*o.in);
      ASSERT_EQ(out.dtype(), t) << o.name;
      for (int64_t i = 0; i < out.numel(); ++i)
        expect_rounded(t, value(out, i), o.ref(value(*o.in, i)), 8,
                       std::string(dtype_name(t)) + " " + o.name + " of " + std::to_string(value(*o.in, i)));
    }
  }
}

TEST(HalfOps, ReductionsAccumulateInF32AndRoundOnce) {
  for (DType t : kHalves) {
    // 4096 ones: a 16-bit accumulator stops at 256 (bf16) or 2048 (f16), where adding 1 no
    // longer changes the sum; the f32 one reaches 4096, which both types represent.
    EXPECT_EQ(sum(ones({4096}, {.dtype = t})).to_vector<float>()[0], 4096.0f) << dtype_name(t);
    EXPECT_EQ(mean(full({3, 2048}, 0.75, {.dtype = t})).to_vector<float>()[0], 0.75f) << dtype_name(t);

    const Tensor x = random_half(t, {5, 64, 9}, 4.0, 6, false);
    const Tensor s = sum(x, {1}), m = mean(x, {0, 2}, true), all = sum(x);
    ASSERT_EQ(s.dtype(), t);
    ASSERT_EQ(s.shape(), Shape({5, 9}));
    ASSERT_EQ(m.shape(), Shape({1, 64, 1}));
    ASSERT_EQ(all.dim(), 0);
    double total = 0, total_abs = 0;
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t k = 0; k < 9; ++k) {
        double want = 0, abs_sum = 0;
        for (int64_t j = 0; j < 64; ++j) {
          const double v = value(x, (i * 64 + j) * 9 + k);
          want += v;
          abs_sum += std::fabs(v);
        }
        total += want;
        total_abs += abs_sum;
        // f32 accumulation of 64 terms: error below 64 f32 ulps of the terms' magnitude.
        expect_rounded(t, value(s, i * 9 + k), want, 64 * abs_sum / std::max(std::fabs(want), 1e-30),
                       std::string(dtype_name(t)) + " sum over dim 1");
      }
    expect_rounded(t, value(all, 0), total, 5 * 64 * 9 * total_abs / std::max(std::fabs(total), 1e-30),
                   std::string(dtype_name(t)) + " sum of all");
    for (int64_t j = 0; j < 64; ++j) {
      double want = 0, abs_sum = 0;
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t k = 0; k < 9; ++k) {
          const double v = value(x, (i * 64 + j) * 9 + k);
          want += v;
          abs_sum += std::fabs(v);
        }
      expect_rounded(t, value(m, j), want / 45, 64 * abs_sum / std::max(std::fabs(want), 1e-30),
                     std::string(dtype_name(t)) + " mean over dims 0, 2");
    }
  }
}

TEST(HalfOps, MixedDtypesAreRefusedAndNothingIsRecorded) {
  const Tensor f = randn({4, 3});
  const Tensor h = f.to(DType::bf16), g = f.to(DType::f16);
  TG_EXPECT_ERROR(add(h, f), "add", "dtypes differ", "bf16", "f32");
  TG_EXPECT_ERROR(mul(g, h), "mul", "dtypes differ", "f16", "bf16");
  EXPECT_THROW(add(f, h), DTypeError);
  // Under a tape, with a parameter in play elsewhere: the half results take no part.
  Tensor p = randn({4, 3}).requires_grad_();
  Tape tape;
  const Tensor y = sum(relu(h * h) + h);
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_FALSE(y.requires_grad());
  const Tensor loss = sum(p * p);
  tape.backward(loss);
  ASSERT_TRUE(p.grad().defined());
  EXPECT_LE(rel_l2(p.grad(), p.detach() * 2.0), 1e-7);
}

// The file make_interop.py --check-roundtrip compares with PyTorch's own results: f32 values
// (random, and every kind of special) with tapegrad's bf16 / f16 roundings of them, the bf16 /
// f16 elementwise ops and reductions on random half inputs, and linear and conv2d under a bf16
// Autocast scope on f32 inputs. Written bit for bit (checked by reading it back) into a
// temporary directory, and into $TG_INTEROP_ROUNDTRIP_DIR when that is set.
TEST(HalfOps, ResultsForThePyTorchComparisonSurviveTheFile) {
  manual_seed(29);
  std::vector<float> v = (randn({4096}) * 1000.0).to_vector<float>();
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, 65519.99f, 6.0e-8f, 3.0e-8f,
                            1.0e-45f, 3.3895314e38f, 3.40e38f, 1.00390625f, 1.01171875f, -2.0039062f};
  std::copy(std::begin(specials), std::end(specials), v.begin());
  const Tensor x = from_vector(v, {4096});
  safetensors::NamedTensors out{{"x.f32", x}, {"x.bf16", x.to(DType::bf16)}, {"x.f16", x.to(DType::f16)}};
  for (DType t : kHalves) {
    const std::string s = std::string(".") + dtype_name(t);
    const Tensor a = (randn({64, 64}) * 3.0).to(t), b = (randn({64, 64}) * 3.0).to(t);
    out.insert(out.end(), {{"a" + s, a},
                           {"b" + s, b},
                           {"add" + s, a + b},
                           {"sub" + s, a - b},
                           {"mul" + s, a * b},
                           {"div" + s, a / b},
                           {"exp" + s, tg::exp(a)},
                           {"tanh" + s, tg::tanh(a)},
                           {"sum" + s, sum(a, {1})},
                           {"mean" + s, mean(a, {0})}});
  }
  const Tensor lx = randn({32, 48}), lw = randn({24, 48}), lb = randn({24});
  const Tensor cx = randn({2, 6, 9, 9}), cw = randn({5, 6, 3, 3}), cb = randn({5});
  Tensor lin, conv;
  {
    Autocast ac(DType::bf16);
    lin = linear(lx, lw, lb);
    conv = conv2d(cx, cw, cb, {.padding = {1}});
  }
  out.insert(out.end(), {{"autocast.linear.x", lx},
                         {"autocast.linear.w", lw},
                         {"autocast.linear.b", lb},
                         {"autocast.linear.y", lin},
                         {"autocast.conv.x", cx},
                         {"autocast.conv.w", cw},
                         {"autocast.conv.b", cb},
                         {"autocast.conv.y", conv}});

  TempDir dir;
  safetensors::save_file(out, dir.file("tg_half.safetensors"));
  const safetensors::NamedTensors back = safetensors::load_file(dir.file("tg_half.safetensors"));
  ASSERT_EQ(back.size(), out.size());
  std::map<std::string, Tensor> read(back.begin(), back.end());
  for (const auto& [name, t] : out) {
    ASSERT_EQ(read.count(name), 1u) << name;
    ASSERT_EQ(read[name].dtype(), t.dtype()) << name;
    ASSERT_EQ(read[name].shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(read[name].raw_data(), t.raw_data(), t.nbytes()), 0) << name;
  }
  if (const char* dest = std::getenv("TG_INTEROP_ROUNDTRIP_DIR"))
    safetensors::save_file(out, std::string(dest) + "/tg_half.safetensors");
}
