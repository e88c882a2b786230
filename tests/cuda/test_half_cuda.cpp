// bf16 / f16 tensors on a GPU: storage, creation, copies and casts, checked against the CPU
// bit for bit. The GPU's casts call the CPU's element functions (core/half.h), so every pair of
// f32, f64, i64, bf16 and f16 must give the CPU's bits for every input: NaN payloads of both
// signs (signalling ones quieted alike), +-inf, -0, the largest finite values and the first
// ones past them, f16 / bf16 / f32 / f64 subnormals, ties, f64 values that a rounding through
// f32 would round twice, and i64 values past 2^24, 2^53 and i64's float range. Ops on half
// CUDA tensors and Autocast on the GPU: test_half_ops_cuda.cpp.
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_compare.h"
#include "common/expect_message.h"
#include "common/half_util.h"
#include "core/half.h"
#include "core/tensor_kernels.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);
constexpr DType kAll[] = {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16};
constexpr double kTwo63 = 9223372036854775808.0;

// Every special case of the rounding rules, as f64 values.
std::vector<double> special_f64() {
  const double inf = std::numeric_limits<double>::infinity();
  auto bits = [](uint64_t b) { return std::bit_cast<double>(b); };
  auto p2 = [](int e) { return std::ldexp(1.0, e); };
  std::vector<double> v = {
      bits(0x7ff8000000000001), bits(0xfff8000000000000), bits(0x7ff4000000000000), bits(0xfff0000000000001),
      bits(0x7fffffffffffffff), bits(0xfff0000020000000),  // NaNs: payloads, both signs, signalling
      inf, -inf, 0.0, -0.0,
      65504.0, -65504.0, 65519.99, 65520.0, -65520.0, 70000.0,  // f16's largest finite values, and past them
      std::ldexp(255.0, 120), std::ldexp(511.0, 119), std::nextafter(std::ldexp(511.0, 119), 0.0),
      -std::ldexp(511.0, 119), std::numeric_limits<float>::max(), 3.5e38, 1e300, -1e300,  // bf16's and f32's
      // f16 subnormals and its smallest normal
      p2(-24), p2(-25), 3 * p2(-25), 5 * p2(-25), p2(-14), p2(-14) - p2(-25), 1023 * p2(-24), -p2(-24),
      p2(-133), p2(-134), 3 * p2(-134), p2(-126), 1e-40, -1e-45, 1e-310, -1e-320,  // bf16, f32, f64 subnormals
      1 + p2(-8), 1 + 3 * p2(-8), -(1 + p2(-8)), 1 + p2(-11), 1 + 3 * p2(-11), 2049.0, 257.0,  // ties to even
      1 + p2(-8) + p2(-40), 1 + p2(-8) - p2(-40), 1 + p2(-11) + p2(-40), -(1 + p2(-11) - p2(-40)),  // double rounding
      p2(24) + 1, p2(53) + 2, p2(62) + p2(54), kTwo63, -kTwo63, 1e19, -1e19,
      -2.5, -1.5, -0.75, 0.5, 1.75, 300.0, 0.1, 1e6, -3.14159};
  std::mt19937_64 rng(29);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (double scale : {1e-6, 1e-3, 1.0, 1e3, 1e6, 1e20})
    for (int i = 0; i < 64; ++i) v.push_back(normal(rng) * scale);
  return v;
}

// f32 sources: the f64 specials as f32 (NaN payloads pinned as the casts pin them), and
// patterns only f32 holds.
std::vector<float> special_f32() {
  std::vector<float> v;
  for (double d : special_f64()) v.push_back(f64_to_f32(d));
  for (uint32_t b : {0x7fa00001u, 0xffc00123u, 0x7f800001u, 0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u,
                     0x3f801000u, 0x3f803000u, 0x477ff000u, 0x477fefffu, 0x7f7fffffu, 0x7f7f8000u, 0x33000000u,
                     0x33400000u, 0x387fc000u, 0x5f000000u, 0xdf000000u, 0x4b800001u})
    v.push_back(std::bit_cast<float>(b));
  return v;
}

std::vector<int64_t> special_i64() {
  const int64_t one = 1;
  std::vector<int64_t> v = {0, 1, -1, 257, 259, 2049, 2051, 65504, 65519, 65520, -70000, (one << 24) + 1,
                            (one << 53) + 1, -((one << 53) + 3), (one << 62) + (one << 54) + 1,
                            std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                            std::numeric_limits<int64_t>::max() - 1024};
  std::mt19937_64 rng(30);
  for (int i = 0; i < 512; ++i) v.push_back(static_cast<int64_t>(rng()) >> (rng() % 64));
  return v;
}

bool has_i64(double v) { return v >= -kTwo63 && v < kTwo63; }  // false for NaN

// The source values of dtype `s` on the CPU: its specials, or every bit pattern of a half type.
// For an i64 target, only values that have an i64: the CPU's float -> i64 conversion of the
// others is undefined (C++), and half -> i64 refuses them (HalfToI64RefusesTheSameElement).
Tensor sources(DType s, bool for_i64) {
  auto keep = [&](double v) { return !for_i64 || has_i64(v); };
  if (s == DType::f64 || s == DType::f32) {
    std::vector<double> d;
    std::vector<float> f;
    if (s == DType::f64) {
      for (double v : special_f64()) if (keep(v)) d.push_back(v);
      return from_vector(d, {static_cast<int64_t>(d.size())});
    }
    for (float v : special_f32()) if (keep(v)) f.push_back(v);
    return from_vector(f, {static_cast<int64_t>(f.size())});
  }
  if (s == DType::i64) {
    const std::vector<int64_t> v = special_i64();
    return from_vector(v, {static_cast<int64_t>(v.size())});
  }
  std::vector<uint16_t> patterns;
  for (uint32_t i = 0; i < 65536; ++i)
    if (keep(decode_half(s, static_cast<uint16_t>(i)))) patterns.push_back(static_cast<uint16_t>(i));
  Tensor out = Tensor::empty({static_cast<int64_t>(patterns.size())}, {.dtype = s});
  std::memcpy(out.raw_data(), patterns.data(), patterns.size() * 2);
  return out;
}

// Expects the two tensors (any devices) to hold the same bytes, element by element.
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const Tensor g = got.detach().cpu(), w = want.detach().cpu();
  const size_t size = dtype_size(g.dtype());
  const auto* pg = static_cast<const unsigned char*>(g.raw_data());
  const auto* pw = static_cast<const unsigned char*>(w.raw_data());
  int reported = 0;
  for (int64_t i = 0; i < g.numel() && reported < 5; ++i) {
    if (std::memcmp(pg + i * size, pw + i * size, size) == 0) continue;
    uint64_t a = 0, b = 0;
    std::memcpy(&a, pg + i * size, size);
    std::memcpy(&b, pw + i * size, size);
    ADD_FAILURE() << what << ": element " << i << " is 0x" << std::hex << a << ", the CPU's 0x" << b;
    ++reported;
  }
}

}  // namespace

TEST(HalfCuda, EveryCastMatchesTheCpuBitForBit) {
  TG_REQUIRE_GPU();
  for (DType s : kAll) {
    for (DType d : kAll) {
      if (s == d) continue;
      const std::string what = std::string(dtype_name(s)) + " -> " + dtype_name(d);
      SCOPED_TRACE(what);
      const Tensor src = sources(s, d == DType::i64);
      const Tensor want = src.to(d);
      const Tensor src_gpu = src.to(kGpu);
      expect_same_bits(src_gpu, src, what + " (the copy to the GPU)");
      // The kernel itself, into an output poisoned first, then the public path.
      Tensor out = poisoned_gpu(src.shape(), d);
      cuda::cast(out, src_gpu);
      expect_same_bits(out, want, what + " (cuda::cast)");
      const Tensor via_to = src_gpu.to(d);
      EXPECT_TRUE(via_to.device().is_cuda());
      expect_same_bits(via_to, want, what + " (Tensor::to)");
    }
  }
}

// f32 <-> half casts run four elements per step, the last n % 4 one by one: every length from 1
// to 9 and a few long ones (the last past one pass of the grid-stride loop), whose elements
// cycle through the specials and random values within f16's range, must give the CPU's bits in
// both directions.
TEST(HalfCuda, CastsOfEveryLengthMatchTheCpu) {
  TG_REQUIRE_GPU();
  const std::vector<float> specials = special_f32();
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-6e4f, 6e4f);
  for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 1027, 262147, 4325379}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = i % 3 == 0 ? specials[(i / 3) % specials.size()] : dist(gen);
    const Tensor src = from_vector(v, {n});
    const Tensor src_gpu = src.to(kGpu);
    for (DType h : kHalves) {
      const std::string what = "f32 <-> " + std::string(dtype_name(h)) + ", " + std::to_string(n) + " elements";
      SCOPED_TRACE(what);
      const Tensor want = src.to(h);
      Tensor half_out = poisoned_gpu(src.shape(), h);
      cuda::cast(half_out, src_gpu);
      expect_same_bits(half_out, want, what + " (to the half type)");
      Tensor f32_out = poisoned_gpu(src.shape(), DType::f32);
      cuda::cast(f32_out, half_out);
      expect_same_bits(f32_out, want.to(DType::f32), what + " (back to f32)");
    }
  }
}

// Half -> i64 of a value without an i64 (NaN, +-inf, past 2^63) is the CPU's DTypeError,
// naming the same (first) element.
TEST(HalfCuda, HalfToI64RefusesTheSameElement) {
  TG_REQUIRE_GPU();
  for (DType t : kHalves) {
    const Tensor all = sources(t, false);
    auto element_named = [](const std::string& msg) {
      const size_t at = msg.find("element ");
      return at == std::string::npos ? std::string() : msg.substr(at, msg.find(' ', at + 8) - at);
    };
    const std::string cpu = message_of<DTypeError>([&] { all.to(DType::i64); });
    const std::string gpu = message_of<DTypeError>([&] { all.to(kGpu).to(DType::i64); });
    EXPECT_FALSE(element_named(cpu).empty()) << cpu;
    EXPECT_EQ(element_named(gpu), element_named(cpu)) << gpu;
    EXPECT_TRUE(contains(gpu, "no i64 value") && contains(gpu, "cuda:0")) << gpu;
    const Tensor bad = from_vector(std::vector<float>{1.0f, std::numeric_limits<float>::infinity()}, {2},
                                   {.dtype = t, .device = kGpu});
    TG_EXPECT_ERROR(bad.to(DType::i64), "Tensor::to(i64)", "element 1", "no i64 value");
    TG_EXPECT_ERROR(bad.to_vector<int64_t>(), "element 1");
  }
}

TEST(HalfCuda, FactoriesGiveTheCpusBits) {
  TG_REQUIRE_GPU();
  for (DType t : kHalves) {
    SCOPED_TRACE(dtype_name(t));
    const TensorOptions gpu{.dtype = t, .device = kGpu}, cpu{.dtype = t};
    const Tensor e = Tensor::empty({3, 5}, gpu);
    EXPECT_EQ(e.dtype(), t);
    EXPECT_TRUE(e.device().is_cuda());
    EXPECT_EQ(e.nbytes(), 30u);
    for (double value : {0.0, 1.0, -2.5, 0.1, 1e6, -1e-7, std::numeric_limits<double>::quiet_NaN()})
      expect_same_bits(full({7}, value, gpu), full({7}, value, cpu), "full " + std::to_string(value));
    expect_same_bits(zeros({5}, gpu), zeros({5}, cpu), "zeros");
    expect_same_bits(ones({5}, gpu), ones({5}, cpu), "ones");
    expect_same_bits(arange(3000, gpu), arange(3000, cpu), "arange");
    const std::vector<float> values = {0.1f, -3.7f, 65519.0f, 1e-6f, 300.5f};
    expect_same_bits(from_vector(values, {5}, gpu), from_vector(values, {5}, cpu), "from_vector");
    // Uniform draws: one counter-based generator on both devices, each f64 draw rounded once.
    manual_seed(5);
    const Tensor r = rand({4099}, gpu), u = uniform({4099}, -0.3, 0.7, gpu);
    manual_seed(5);
    expect_same_bits(r, rand({4099}, cpu), "rand");
    expect_same_bits(u, uniform({4099}, -0.3, 0.7, cpu), "uniform");
    // Normal draws: the GPU's Box-Muller uses the device's log and cospi, so its f64 draw may
    // differ from the CPU's in the last bits. The rule that holds: the half draw is the
    // GPU's own f64 draw rounded once; and against the CPU at most one half ulp apart.
    manual_seed(6);
    const Tensor n = randn({4099}, gpu);
    manual_seed(6);
    const Tensor n64 = randn({4099}, {.dtype = DType::f64, .device = kGpu});
    manual_seed(6);
    const Tensor n_cpu = randn({4099}, cpu);
    expect_same_bits(n, n64.cpu().to(t), "randn (the GPU's f64 draw, rounded once)");
    const std::vector<uint16_t> a = half_bits(n), b = half_bits(n_cpu);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i] & 0x8000, b[i] & 0x8000) << i;
      ASSERT_LE(std::abs(static_cast<int>(a[i] & 0x7fff) - static_cast<int>(b[i] & 0x7fff)), 1) << i;
    }
  }
}

TEST(HalfCuda, PrintingItemAndToVectorConvert) {
  TG_REQUIRE_GPU();
  std::ostringstream os;
  os << full({3}, 0.1, {.dtype = DType::bf16, .device = kGpu}) << " | "
     << full({2}, 0.1, {.dtype = DType::f16, .device = kGpu});
  EXPECT_EQ(os.str(), "Tensor(bf16[3] on cuda:0, values [0.100098, 0.100098, 0.100098]) | "
                      "Tensor(f16[2] on cuda:0, values [0.0999756, 0.0999756])");
  for (DType t : kHalves) {
    const Tensor h = sources(t, false).reshape({256, 256});
    const Tensor g = h.to(kGpu);
    const std::vector<float> want = h.to_vector<float>(), got = g.to_vector<float>();
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << i;  // NaN payloads too
    const std::vector<double> want64 = h.to_vector<double>(), got64 = g.to_vector<double>();
    EXPECT_EQ(std::memcmp(got64.data(), want64.data(), want64.size() * 8), 0);
    EXPECT_EQ(full({}, -2.5, {.dtype = t, .device = kGpu}).item(), -2.5);
  }
}

// Bytes copied as they are, signalling NaN patterns included; the shape family moves them on
// the GPU as on the CPU.
TEST(HalfCuda, DeviceCopiesAndShapeOpsKeepTheBits) {
  TG_REQUIRE_GPU();
  for (DType t : kHalves) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor h = sources(t, false).reshape({64, 1024});
    const Tensor g = h.to(kGpu);
    EXPECT_EQ(half_bits(g.cpu()), half_bits(h));
    EXPECT_EQ(half_bits(g.clone()), half_bits(h));
    EXPECT_EQ(half_bits(g.to(kGpu)), half_bits(h));
    EXPECT_EQ(half_bits(g.permute({1, 0})), half_bits(h.permute({1, 0})));
    EXPECT_EQ(half_bits(g.reshape({8, 8, 1024}).permute({2, 0, 1}).contiguous()),
              half_bits(h.reshape({8, 8, 1024}).permute({2, 0, 1})));
    EXPECT_EQ(half_bits(cat({slice(g, 1, 0, 300), slice(g, 1, 300, 1024)}, 1)), half_bits(h));
    EXPECT_EQ(half_bits(split(g, 16, 0)[2]), half_bits(split(h, 16, 0)[2]));
    EXPECT_EQ(half_bits(narrow(g, 1, 5, 17)), half_bits(narrow(h, 1, 5, 17)));
  }
}

TEST(HalfCuda, CastsCaptureIntoGraphsButTheI64CheckDoesNot) {
  TG_REQUIRE_GPU();
  manual_seed(7);
  const Tensor x = randn({1000}, {.device = kGpu});
  Tensor out = Tensor::empty({1000}, {.dtype = DType::bf16, .device = kGpu});
  cuda::Graph g;
  g.capture([&] { out.copy_(x.to(DType::bf16)); });
  g.replay();
  EXPECT_EQ(half_bits(out), half_bits(x.cpu().to(DType::bf16)));
  const Tensor h = x.to(DType::bf16);
  cuda::Graph refused;
  const std::string msg = message_of<CaptureError>([&] { refused.capture([&] { h.to(DType::i64); }); });
  EXPECT_TRUE(contains(msg, "Tensor::to(i64)") && contains(msg, "cannot be captured")) << msg;
}

// What still throws: a half leaf takes no gradient, ops without half kernels refuse half
// tensors with the CPU's DTypeError, mixing dtypes outside Autocast, and a missing GPU.
TEST(HalfCuda, TheRemainingErrorsAreTheCpus) {
  TG_REQUIRE_GPU();
  manual_seed(8);
  const Tensor f = randn({6, 5}, {.device = kGpu});
  for (DType t : kHalves) {
    SCOPED_TRACE(dtype_name(t));
    Tensor h = f.to(t);
    TG_EXPECT_ERROR(h.requires_grad_(), "requires_grad_", dtype_name(t), "leaf takes no gradient");
    EXPECT_THROW(h.requires_grad_(), DTypeError);
    const std::string no_kernels = std::string("no ") + dtype_name(t) + " kernels";
    const Tensor targets = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0}, {6}, {.device = kGpu});
    const TensorOptions on{.device = kGpu};
    const std::vector<std::pair<const char*, std::function<void()>>> refused = {
        {"softmax", [&] { softmax(h, 1); }},
        {"mse_loss", [&] { mse_loss(h, f); }},
        {"cross_entropy", [&] { cross_entropy(h, targets); }},
        {"group_norm", [&] { group_norm(h.reshape({1, 2, 15}), ones({2}, on), zeros({2}, on), 1); }},
        {"layer_norm", [&] { layer_norm(h, {5}); }},
        {"max_pool2d", [&] { max_pool2d(h.reshape({1, 2, 3, 5}), {.kernel_size = {2, 2}}); }},
        {"dropout", [&] { dropout(h, 0.5); }},
    };
    for (const auto& [name, call] : refused) {
      const std::string msg = message_of<DTypeError>(call);
      EXPECT_TRUE(contains(msg, no_kernels) && contains(msg, "to(DType::f32)")) << name << ": " << msg;
    }
    TG_EXPECT_ERROR(add(h, f), "add", "dtypes differ");
  }
  const int count = cuda_device_count();
  if (count < kMaxCudaDevices) {
    const Device missing = Device::cuda(count);
    const std::string name = missing.str();
    TG_EXPECT_ERROR(zeros({2}, {.dtype = DType::bf16, .device = missing}), "zeros", "no such device", name.c_str());
    TG_EXPECT_ERROR(f.to(DType::bf16).to(missing), "Tensor::to(device)", "no such device", name.c_str());
  }
}
