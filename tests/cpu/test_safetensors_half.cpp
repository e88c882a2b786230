// Writing F16 and BF16 safetensors entries: the encoders against the (separately tested)
// decoders — every half value round-trips, and random f32 / f64 values go to the nearest
// half value with ties to even, found here by a search over the sorted table of all finite
// half values rather than by the encoders' bit tricks — then files and model checkpoints
// written in half precision and read back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/optim/sgd.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

namespace {

float decode(bool bf16, uint16_t h) { return bf16 ? st::decode_bf16(h) : st::decode_f16(h); }

// Every finite, non-negative half value, ascending, with its bit pattern.
std::vector<std::pair<double, uint16_t>> finite_table(bool bf16) {
  std::vector<std::pair<double, uint16_t>> t;
  for (uint32_t h = 0; h < 0x8000u; ++h) {
    const float v = decode(bf16, static_cast<uint16_t>(h));
    if (std::isfinite(v)) t.push_back({v, static_cast<uint16_t>(h)});
  }
  std::sort(t.begin(), t.end());
  return t;
}

// The nearest half value to x (x finite, any sign), ties to the even pattern; infinity past
// the largest value's upper halfway point (where the next value would be 2^(emax+1)).
uint16_t nearest(const std::vector<std::pair<double, uint16_t>>& table, double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const auto& top = table.back();
  const double ulp_top = top.first - table[table.size() - 2].first;
  const double limit = top.first + ulp_top / 2;  // halfway to the first value past the top
  const uint16_t inf = static_cast<uint16_t>((top.second + 1) | sign);
  if (a > limit || (a == limit && (top.second & 1))) return inf;
  if (a >= top.first) return static_cast<uint16_t>(top.second | sign);
  auto hi = std::lower_bound(table.begin(), table.end(), std::make_pair(a, uint16_t{0}));
  if (hi->first == a) return static_cast<uint16_t>(hi->second | sign);
  auto lo = hi - 1;
  const double mid = (lo->first + hi->first) / 2;  // exact: half values have few bits
  uint16_t pick;
  if (a < mid) pick = lo->second;
  else if (a > mid) pick = hi->second;
  else pick = (lo->second & 1) ? hi->second : lo->second;
  return static_cast<uint16_t>(pick | sign);
}

}  // namespace

TEST(SafetensorsHalf, EveryHalfValueRoundTrips) {
  for (bool bf16 : {false, true}) {
    int nans = 0;
    for (uint32_t h = 0; h <= 0xffffu; ++h) {
      const float v = decode(bf16, static_cast<uint16_t>(h));
      const uint16_t back = bf16 ? st::encode_bf16(v) : st::encode_f16(v);
      if (std::isnan(v)) {
        ++nans;
        ASSERT_TRUE(std::isnan(decode(bf16, back))) << std::hex << h;
        ASSERT_EQ(back & 0x8000, h & 0x8000) << "NaN sign " << std::hex << h;
      } else {
        ASSERT_EQ(back, h) << (bf16 ? "bf16 " : "f16 ") << std::hex << h;
      }
    }
    EXPECT_GT(nans, 0);
  }
}

TEST(SafetensorsHalf, RandomValuesRoundToNearestEven) {
  std::mt19937_64 rng(7);
  for (bool bf16 : {false, true}) {
    const auto table = finite_table(bf16);
    // Magnitudes across the whole range (subnormals, normals, overflow), both signs; plus every
    // exact midpoint between neighbours, where ties must go to the even pattern.
    std::uniform_real_distribution<double> exponent(bf16 ? -140.0 : -27.0, bf16 ? 129.0 : 17.0);
    std::uniform_real_distribution<double> mant(1.0, 2.0);
    for (int i = 0; i < 200000; ++i) {
      const double x = (i % 2 ? -1 : 1) * mant(rng) * std::exp2(std::floor(exponent(rng)));
      const float f = static_cast<float>(x);
      ASSERT_EQ(bf16 ? st::encode_bf16(f) : st::encode_f16(f), nearest(table, f)) << f;
      ASSERT_EQ(st::encode_half(bf16, x), nearest(table, x)) << "f64 " << x;
    }
    for (size_t i = 1; i < table.size(); ++i) {
      const double mid = (table[i - 1].first + table[i].first) / 2;
      ASSERT_EQ(st::encode_half(bf16, mid), nearest(table, mid)) << mid;
      // One f64 ulp off the midpoint: no tie, and f64 -> f32 -> half would round twice wrongly.
      const double above = std::nextafter(mid, 1e300), below = std::nextafter(mid, 0.0);
      ASSERT_EQ(st::encode_half(bf16, above), table[i].second) << above;
      ASSERT_EQ(st::encode_half(bf16, below), table[i - 1].second) << below;
    }
  }
}

TEST(SafetensorsHalf, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(st::encode_f16(inf), 0x7c00);
  EXPECT_EQ(st::encode_f16(-inf), 0xfc00);
  EXPECT_EQ(st::encode_bf16(-inf), 0xff80);
  EXPECT_EQ(st::encode_f16(-0.0f), 0x8000);
  EXPECT_EQ(st::encode_bf16(-0.0f), 0x8000);
  EXPECT_EQ(st::encode_f16(65504.0f), 0x7bff);   // the largest f16
  EXPECT_EQ(st::encode_f16(65519.0f), 0x7bff);   // below the halfway point to 65536
  EXPECT_EQ(st::encode_f16(65520.0f), 0x7c00);   // the tie rounds to even: infinity
  EXPECT_EQ(st::encode_f16(1e-8f), 0x0000);      // under half the smallest subnormal
  EXPECT_EQ(st::encode_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(st::encode_half(false, 1e300), 0x7c00);
  EXPECT_EQ(st::encode_half(true, -1e300), 0xff80);
  EXPECT_TRUE(std::isnan(st::decode_f16(st::encode_f16(nan))));
  EXPECT_TRUE(std::isnan(st::decode_bf16(st::encode_bf16(-nan))));
  EXPECT_TRUE(std::signbit(st::decode_bf16(st::encode_bf16(-nan))));
}

TEST(SafetensorsHalf, FilesStoreFloatingTensorsAsHalf) {
  const TempDir dir;
  const std::string path = dir.file("tg_half.safetensors");
  manual_seed(3);
  const Tensor a = randn({3, 5}), b = randn({7}, {.dtype = DType::f64});
  const Tensor c = from_vector(std::vector<int64_t>{1, -2, 3}, {3});
  for (auto [format, code] : {std::pair{st::FloatFormat::f16, "F16"}, std::pair{st::FloatFormat::bf16, "BF16"}}) {
    st::save_file({{"a", a}, {"b", b}, {"c", c}}, path, {{"k", "v"}}, format);
    const st::Header h = st::read_header(path);
    ASSERT_EQ(h.tensors.size(), 3u);
    EXPECT_EQ(h.tensors[0].dtype, code);
    EXPECT_EQ(h.tensors[1].dtype, code);
    EXPECT_EQ(h.tensors[2].dtype, "I64");
    const st::NamedTensors back = st::load_file(path, nullptr, /*widen_half=*/true);
    const bool bf16 = format == st::FloatFormat::bf16;
    const std::vector<float> av = a.to_vector<float>(), got_a = back[0].second.to_vector<float>();
    for (size_t i = 0; i < av.size(); ++i) EXPECT_EQ(got_a[i], decode(bf16, st::encode_half(bf16, av[i]))) << i;
    const std::vector<double> bv = b.to_vector<double>();
    const std::vector<float> got_b = back[1].second.to_vector<float>();
    for (size_t i = 0; i < bv.size(); ++i) EXPECT_EQ(got_b[i], decode(bf16, st::encode_half(bf16, bv[i]))) << i;
    EXPECT_EQ(back[2].second.to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 3}));
  }
}

TEST(SafetensorsHalf, ModelCheckpointsInHalfLoadBackWithConvert) {
  const TempDir dir;
  const std::string path = dir.file("tg_half_model.safetensors");
  manual_seed(4);
  nn::Linear saved({.in_features = 6, .out_features = 4});
  tg::save(saved, path, {.floats = FloatStorage::bf16});
  EXPECT_EQ(st::read_header(path).tensors[0].dtype, "BF16");
  nn::Linear loaded({.in_features = 6, .out_features = 4});
  EXPECT_THROW(tg::load(loaded, path), Error);  // a different dtype needs convert_dtype
  tg::load(loaded, path, {.convert_dtype = true});
  const std::vector<float> w = saved.weight.to_vector<float>(), got = loaded.weight.to_vector<float>();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(got[i], st::decode_bf16(st::encode_bf16(w[i]))) << i;
}

TEST(SafetensorsHalf, OptimizerCheckpointsRefuseHalf) {
  const TempDir dir;
  const std::string path = dir.file("tg_half_opt.safetensors");
  nn::Linear m({.in_features = 2, .out_features = 2});
  nn::SGD opt(m.parameters(), {.lr = 0.1});
  TG_EXPECT_ERROR(tg::save(m, opt, path, {.floats = FloatStorage::f16}), "model files");
  tg::save(m, opt, path, {.model_only = true, .floats = FloatStorage::f16});  // model only: fine
  EXPECT_EQ(st::read_header(path).tensors[0].dtype, "F16");
}
