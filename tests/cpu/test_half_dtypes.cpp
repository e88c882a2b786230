// bf16 and f16 as tensor dtypes on the CPU: names and sizes, creation, printing, and
// Tensor::to between every pair of f32, f64, i64, bf16 and f16.
//
// Conversions are checked against `reference_round`, an independent rounding written with
// long double arithmetic (scale to the format's quantum, nearbyint ties to even), never
// against the encoders' bit tricks. The one identity that holds only up to a rule: a NaN
// comes back as a NaN of the same sign and payload with its quiet bit set (bf16 0x0040,
// f16 0x0200), so a signalling NaN pattern comes back quieted.
// Ops' errors on half tensors and safetensors files: test_half_storage.cpp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "common/test_util.h"
#include "core/half.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr DType kHalves[] = {DType::bf16, DType::f16};

// A CPU tensor holding these bit patterns.
Tensor from_bits(const std::vector<uint16_t>& bits, DType t) {
  Tensor out = Tensor::empty(Shape{static_cast<int64_t>(bits.size())}, {.dtype = t});
  std::memcpy(out.raw_data(), bits.data(), bits.size() * 2);
  return out;
}
std::vector<uint16_t> bits_of(const Tensor& t) {
  EXPECT_TRUE(is_half(t.dtype())) << describe(t);
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  std::memcpy(out.data(), t.raw_data(), out.size() * 2);
  return out;
}
std::vector<uint16_t> all_patterns() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}
bool is_nan_pattern(DType t, uint16_t h) {
  return t == DType::bf16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}
uint16_t quiet_bit(DType t) { return t == DType::bf16 ? 0x0040u : 0x0200u; }

// x rounded once to the format: nearest, ties to even; +-inf past the largest finite value.
long double reference_round(long double x, DType t) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const int precision = t == DType::bf16 ? 8 : 11;     // significand bits, the implicit one included
  const int min_exponent = t == DType::bf16 ? -126 : -14;
  const long double max = t == DType::bf16 ? std::ldexp(2.0L - std::ldexp(1.0L, -7), 127) : 65504.0L;
  int e;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int exponent = std::max(e - 1, min_exponent);
  const long double quantum = std::ldexp(1.0L, exponent - precision + 1);
  const long double r = std::nearbyint(x / quantum) * quantum;
  if (std::fabs(r) > max) return std::copysign(std::numeric_limits<long double>::infinity(), x);
  return r;
}

// Expects half pattern `got` to hold reference_round(x) (a zero's sign included).
void expect_rounds(DType t, long double x, uint16_t got) {
  const long double want = reference_round(x, t);
  const float v = decode_half(t, got);
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(v)) << dtype_name(t) << " of nan gave " << got;
    return;
  }
  EXPECT_EQ(static_cast<long double>(v), want) << dtype_name(t) << " of " << static_cast<double>(x) << " (pattern "
                                               << got << ")";
  EXPECT_EQ(std::signbit(v), std::signbit(want)) << dtype_name(t) << " of " << static_cast<double>(x);
}

}  // namespace

TEST(HalfDtypes, NamesSizesAndPrinting) {
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_STREQ(dtype_name(tg::bf16), "bf16");
  EXPECT_STREQ(dtype_name(tg::f16), "f16");
  EXPECT_FALSE(is_floating(DType::bf16));  // no kernels: the ops that take it compute in f32
  EXPECT_TRUE(is_half(DType::f16));
  EXPECT_FALSE(is_half(DType::f32));
  std::ostringstream os;
  os << full({3}, 0.1, {.dtype = DType::bf16}) << " | " << full({2}, 0.1, {.dtype = DType::f16}) << " | "
     << DType::f16;
  // bf16(0.1) = 0.10009765625, f16(0.1) = 0.0999755859375: printed as their values.
  EXPECT_EQ(os.str(), "Tensor(bf16[3] on cpu, values [0.100098, 0.100098, 0.100098]) | "
                      "Tensor(f16[2] on cpu, values [0.0999756, 0.0999756]) | f16");
}

TEST(HalfDtypes, CreationOnTheCpu) {
  for (DType t : kHalves) {
    const bool b = t == DType::bf16;
    Tensor e = Tensor::empty({3, 5}, {.dtype = t});
    EXPECT_EQ(e.nbytes(), 30u);
    EXPECT_EQ(e.dtype(), t);
    EXPECT_EQ(bits_of(zeros({4}, {.dtype = t})), std::vector<uint16_t>(4, 0));
    EXPECT_EQ(bits_of(ones({4}, {.dtype = t})), std::vector<uint16_t>(4, b ? 0x3f80 : 0x3c00));
    EXPECT_EQ(bits_of(full({2}, -2.5, {.dtype = t})), std::vector<uint16_t>(2, b ? 0xc020 : 0xc100));
    EXPECT_EQ(full({}, 1e6, {.dtype = t}).item(), b ? 999424.0 : std::numeric_limits<double>::infinity());
    EXPECT_EQ(arange(300, {.dtype = t}).to_vector<float>()[257], b ? 256.0f : 257.0f);  // bf16: 8 bits
    // Random factories draw in f64 and round once: the same bits as drawing f64, then to().
    manual_seed(11);
    Tensor r = randn({257}, {.dtype = t});
    manual_seed(11);
    Tensor r64 = randn({257}, {.dtype = DType::f64});
    EXPECT_EQ(bits_of(r), bits_of(r64.to(t)));
    int nonzero = 0;
    for (float v : r.to_vector<float>()) nonzero += v != 0;
    EXPECT_GT(nonzero, 250);
    // from_vector(float) rounds each value once.
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 100.0f);
    std::vector<float> values(101);
    for (float& v : values) v = normal(rng);
    Tensor h = from_vector(values, {101}, {.dtype = t});
    EXPECT_EQ(h.dtype(), t);
    const std::vector<uint16_t> hb = bits_of(h);
    for (size_t i = 0; i < values.size(); ++i) expect_rounds(t, values[i], hb[i]);
    const std::vector<float> back = h.to_vector<float>();
    const std::vector<double> back64 = h.to_vector<double>();
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(back[i], decode_half(t, hb[i]));
      EXPECT_EQ(back64[i], static_cast<double>(back[i]));
    }
  }
}

// Every pattern to f32 and f64 and back: identical, NaN quieting aside; the widened values
// are the patterns' values (checked against reference_round being the identity on them).
TEST(HalfDtypes, EveryPatternRoundTripsThroughF32AndF64) {
  for (DType t : kHalves) {
    const std::vector<uint16_t> bits = all_patterns();
    const Tensor h = from_bits(bits, t);
    for (DType wide : {DType::f32, DType::f64}) {
      const Tensor w = h.to(wide);
      const std::vector<double> values = w.to_vector<double>();
      const std::vector<uint16_t> back = bits_of(w.to(t));
      for (uint32_t i = 0; i < 65536; ++i) {
        if (is_nan_pattern(t, bits[i])) {
          ASSERT_TRUE(std::isnan(values[i])) << i;
          ASSERT_EQ(std::signbit(values[i]), (bits[i] & 0x8000u) != 0) << i;
          ASSERT_EQ(back[i], bits[i] | quiet_bit(t)) << dtype_name(t) << " NaN pattern " << i;
        } else {
          ASSERT_EQ(back[i], bits[i]) << dtype_name(t) << " via " << dtype_name(wide) << ", pattern " << i;
          ASSERT_EQ(reference_round(values[i], t), static_cast<long double>(values[i])) << i;
        }
      }
    }
  }
  // The subnormal and limit values themselves.
  EXPECT_EQ(from_bits({0x0001, 0x03ff, 0x0400, 0x7bff, 0x7c00, 0x8000}, DType::f16).to_vector<double>(),
            (std::vector<double>{std::ldexp(1.0, -24), std::ldexp(1023.0, -24), std::ldexp(1.0, -14), 65504.0,
                                 std::numeric_limits<double>::infinity(), -0.0}));
  EXPECT_EQ(from_bits({0x0001, 0x7f7f, 0xff80}, DType::bf16).to_vector<double>(),
            (std::vector<double>{std::ldexp(1.0, -133), std::ldexp(255.0, 120), -std::numeric_limits<double>::infinity()}));
}

// bf16 <-> f16 over every pattern: rounded once from the exact source value.
TEST(HalfDtypes, BetweenTheHalfTypesEveryPattern) {
  for (DType from : kHalves) {
    const DType to = from == DType::bf16 ? DType::f16 : DType::bf16;
    const std::vector<uint16_t> bits = all_patterns();
    const std::vector<uint16_t> got = bits_of(from_bits(bits, from).to(to));
    for (uint32_t i = 0; i < 65536; ++i) expect_rounds(to, decode_half(from, bits[i]), got[i]);
  }
}

TEST(HalfDtypes, TiesGoToEvenAtTheBoundaries) {
  auto f32_to = [](DType t, std::vector<float> v) { return bits_of(from_vector(v, {(int64_t)v.size()}).to(t)); };
  const float u8 = std::ldexp(1.0f, -8), u11 = std::ldexp(1.0f, -11);
  // bf16 around 1 (ulp 2^-7): midpoints go to the even neighbour, either way.
  EXPECT_EQ(f32_to(DType::bf16, {1 + u8, 1 + 3 * u8, -(1 + u8), std::nextafter(1 + u8, 2.0f)}),
            (std::vector<uint16_t>{0x3f80, 0x3f82, 0xbf80, 0x3f81}));
  // f16 around 1 (ulp 2^-10), its largest values, and the subnormal range (quantum 2^-24).
  EXPECT_EQ(f32_to(DType::f16, {1 + u11, 1 + 3 * u11, 65504 + 16, std::nextafter(65520.0f, 0.0f), -65520,
                                std::ldexp(1.0f, -25), std::ldexp(3.0f, -25), std::ldexp(5.0f, -25),
                                std::nextafter(std::ldexp(1.0f, -25), 1.0f), std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)}),
            (std::vector<uint16_t>{0x3c00, 0x3c02, 0x7c00, 0x7bff, 0xfc00, 0x0000, 0x0002, 0x0002, 0x0001, 0x0400}));
  // bf16's largest finite value and the first value that rounds past it.
  const float bf16_max = std::ldexp(255.0f, 120), bf16_mid = std::ldexp(511.0f, 119);
  EXPECT_EQ(f32_to(DType::bf16, {bf16_max, std::nextafter(bf16_mid, 0.0f), bf16_mid, std::numeric_limits<float>::max()}),
            (std::vector<uint16_t>{0x7f7f, 0x7f7f, 0x7f80, 0x7f80}));
}

TEST(HalfDtypes, SpecialValuesAndRandomF32) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (DType t : kHalves) {
    const std::vector<uint16_t> got = bits_of(from_vector(std::vector<float>{inf, -inf, -0.0f, nan, -nan, 1e-45f}, {6}).to(t));
    EXPECT_EQ(got[0], t == DType::bf16 ? 0x7f80 : 0x7c00);
    EXPECT_EQ(got[1], t == DType::bf16 ? 0xff80 : 0xfc00);
    EXPECT_EQ(got[2], 0x8000);
    EXPECT_TRUE(is_nan_pattern(t, got[3]) && (got[3] & quiet_bit(t)) && !(got[3] & 0x8000));
    EXPECT_TRUE(is_nan_pattern(t, got[4]) && (got[4] & 0x8000));
    EXPECT_EQ(got[5], t == DType::bf16 ? 0x0000 : 0x0000);  // the smallest f32 subnormal is below both halves
    // Random f32 over the whole exponent range, both signs.
    std::mt19937 rng(7);
    std::vector<float> v(20000);
    for (float& x : v) {
      do x = std::bit_cast<float>(static_cast<uint32_t>(rng())); while (std::isnan(x));
    }
    const std::vector<uint16_t> h = bits_of(from_vector(v, {20000}).to(t));
    for (size_t i = 0; i < v.size(); ++i) expect_rounds(t, v[i], h[i]);
  }
}

// f64 values just past a half-type midpoint by less than f32 can hold: a conversion through
// f32 would round them onto the midpoint, then to even, the wrong way.
TEST(HalfDtypes, F64IsRoundedOnceNotTwice) {
  for (DType t : kHalves) {
    const int precision = t == DType::bf16 ? 8 : 11;
    std::mt19937_64 rng(t == DType::bf16 ? 5 : 6);
    std::vector<double> v;
    for (int i = 0; i < 4000; ++i) {
      // an even half value in [1, 2) scaled by 2^k, plus half an ulp, plus or minus a hair
      const int k = static_cast<int>(rng() % 20) - 10;
      const double mantissa = 1.0 + std::ldexp(static_cast<double>(2 * (rng() % (1u << (precision - 2)))), 1 - precision);
      const double ulp = std::ldexp(1.0, 1 - precision);
      const double hair = std::ldexp(ulp, -30) * ((rng() & 1) ? 1 : -1);
      v.push_back(std::ldexp(mantissa + ulp / 2 + hair, k) * ((rng() & 2) ? 1 : -1));
    }
    std::uniform_real_distribution<double> any(-70000.0, 70000.0);
    for (int i = 0; i < 4000; ++i) v.push_back(any(rng));
    v.push_back(1e300);
    v.push_back(-1e-300);
    const std::vector<uint16_t> h = bits_of(from_vector(v, {(int64_t)v.size()}).to(t));
    int through_f32_differs = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      expect_rounds(t, v[i], h[i]);
      const float f = static_cast<float>(v[i]);
      through_f32_differs += (t == DType::bf16 ? encode_bf16(f) : encode_f16(f)) != h[i];
    }
    EXPECT_GT(through_f32_differs, 1000) << "the inputs do not exercise double rounding";
  }
}

// f32 / f64 to i64 follow the half types' rule: truncated toward zero where the value has an
// i64, a DTypeError for NaN, infinities and values past i64's range (never a wrapped number).
TEST(HalfDtypes, FloatingToI64TruncatesOrRefuses) {
  const std::vector<double> fine = {-3.7, -0.5, 0.0, 0.9, 3.7, 1e18, -9.223372036854775808e18};
  const std::vector<int64_t> want = {-3, 0, 0, 0, 3, 1000000000000000000, std::numeric_limits<int64_t>::min()};
  EXPECT_EQ(from_vector(fine, {7}).to(DType::i64).to_vector<int64_t>(), want);
  EXPECT_EQ(from_vector(fine, {7}).to_vector<int64_t>(), want);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -inf, 1e30, -1e30, 9.223372036854775808e18}) {
    for (DType from : {DType::f32, DType::f64}) {
      Tensor t = from_vector(std::vector<double>{1.0, bad}, {2}).to(from);
      TG_EXPECT_ERROR(t.to(DType::i64), "Tensor::to(i64)", "element 1", "no i64 value");
      EXPECT_THROW(t.to_vector<int64_t>(), DTypeError);
    }
    TG_EXPECT_ERROR(full({2}, bad, {.dtype = DType::i64}), "fill_", "has no i64 value");
  }
  EXPECT_EQ(full({1}, -7.9, {.dtype = DType::i64}).to_vector<int64_t>()[0], -7);
}

TEST(HalfDtypes, IntegersToAndFromHalves) {
  const int64_t big = (int64_t{1} << 62) + (int64_t{1} << 54) + 1;  // just past a bf16 midpoint
  const std::vector<int64_t> ints = {0, -1, 257, 259, 2049, 2051, 65504, 65519, 65520, -70000,
                                     big, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  for (DType t : kHalves) {
    const std::vector<uint16_t> h = bits_of(from_vector(ints, {(int64_t)ints.size()}).to(t));
    for (size_t i = 0; i < ints.size(); ++i) expect_rounds(t, static_cast<long double>(ints[i]), h[i]);
  }
  // A conversion through f64 would have rounded `big` onto the midpoint, then down to 2^62.
  EXPECT_EQ(from_vector(std::vector<int64_t>{big}, {1}).to(DType::bf16).item(), std::ldexp(1.0 + 1.0 / 128, 62));
  // Half to i64 truncates toward zero, as f32 -> i64 does.
  for (DType t : kHalves) {
    Tensor h = from_vector(std::vector<float>{-2.5f, -1.5f, -0.75f, 0.5f, 1.75f, 300.0f, 65504.0f}, {7}, {.dtype = t});
    const std::vector<int64_t> want = {-2, -1, 0, 0, 1, 300, t == DType::bf16 ? 65536 : 65504};
    EXPECT_EQ(h.to(DType::i64).to_vector<int64_t>(), want);
    EXPECT_EQ(h.to_vector<int64_t>(), want);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      Tensor b = from_vector(std::vector<float>{1.0f, bad}, {2}, {.dtype = t});
      TG_EXPECT_ERROR(b.to(DType::i64), "Tensor::to(i64)", "element 1", "no i64 value");
      EXPECT_THROW(b.to(DType::i64), DTypeError);
    }
  }
  EXPECT_EQ(full({1}, -9.223372036854775808e18, {.dtype = DType::bf16}).to_vector<int64_t>()[0],
            std::numeric_limits<int64_t>::min());
  TG_EXPECT_ERROR(full({1}, 1e30, {.dtype = DType::bf16}).to(DType::i64), "no i64 value");
}
