// bf16 and f16 outside the ops that compute in them (elementwise, reductions, conv, linear,
// matmul: test_half_ops.cpp, test_autocast.cpp): every other op refuses them with a DTypeError
// that names the op and the dtype and says how to convert; half leaves take no gradient; a
// missing GPU is a clear error for them as for f32; the shape family moves their bits on the
// CPU (on the GPU: tests/cuda/test_half_cuda.cpp); and safetensors files keep them bit for
// bit (NaN payloads, infinities, subnormals, -0). Conversions: test_half_dtypes.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/fixtures.h"
#include "common/half_util.h"
#include "common/test_util.h"
#include "core/half.h"
#include "core/safetensors.h"
#include "nn/layers.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

namespace {

// Random finite values of both signs, and every kind of special pattern.
Tensor awkward_halves(DType t, int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (auto& b : bits) b = static_cast<uint16_t>(rng());
  const std::vector<uint16_t> special =
      t == DType::bf16 ? std::vector<uint16_t>{0x7f80, 0xff80, 0x8000, 0x0000, 0x0001, 0x807f, 0x7fc1, 0xff81, 0x7f7f}
                       : std::vector<uint16_t>{0x7c00, 0xfc00, 0x8000, 0x0000, 0x0001, 0x83ff, 0x7e01, 0xfc01, 0x7bff};
  std::copy(special.begin(), special.end(), bits.begin());
  Tensor out = Tensor::empty({n}, {.dtype = t});
  std::memcpy(out.raw_data(), bits.data(), bits.size() * 2);
  return out;
}

struct OpCase {
  const char* name;  // as the op's message names it
  std::function<void(const Tensor& h, const Tensor& f)> call;  // h: a half tensor, f: f32 alike
};

// Every public op family without half kernels, handed a half tensor where it takes a
// floating one.
std::vector<OpCase> op_cases() {
  return {
      {"softmax", [](const Tensor& h, const Tensor&) { softmax(h, 1); }},
      {"mse_loss", [](const Tensor& h, const Tensor& f) { mse_loss(h, f); }},
      {"l1_loss", [](const Tensor& h, const Tensor& f) { l1_loss(f, h); }},
      {"cross_entropy", [](const Tensor& h, const Tensor&) {
         cross_entropy(h.reshape({6, 5}), from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0}, {6}));
       }},
      {"group_norm", [](const Tensor& h, const Tensor&) {
         group_norm(h.reshape({1, 2, 15}), ones({2}), zeros({2}), 1);
       }},
      {"layer_norm", [](const Tensor& h, const Tensor&) { layer_norm(h, {5}); }},
      {"max_pool2d", [](const Tensor& h, const Tensor&) { max_pool2d(h.reshape({1, 2, 3, 5}), {.kernel_size = {2, 2}}); }},
      {"upsample", [](const Tensor& h, const Tensor&) { upsample_nearest(h.reshape({1, 2, 3, 5}), {2.0, 2.0}); }},
      {"dropout", [](const Tensor& h, const Tensor&) { dropout(h, 0.5); }},
  };
}

}  // namespace

TEST(HalfStorage, EveryOpRefusesHalfTensorsWithTheConversionHint) {
  manual_seed(3);
  const Tensor f = randn({6, 5});
  for (DType t : kHalves) {
    const Tensor h = f.to(t);
    for (const OpCase& c : op_cases()) {
      SCOPED_TRACE(c.name);
      try {
        c.call(h, f);
        ADD_FAILURE() << c.name << " accepted a " << dtype_name(t) << " tensor";
      } catch (const DTypeError& e) {
        const std::string msg = e.what();
        for (const std::string& frag : {std::string("no ") + dtype_name(t) + " kernels", std::string("to(DType::f32)")})
          EXPECT_NE(msg.find(frag), std::string::npos) << msg;
      } catch (const Error& e) {
        ADD_FAILURE() << c.name << ": not a DTypeError: " << e.what();
      }
    }
  }
}

TEST(HalfStorage, LayersRefuseThemAndHalfLeavesTakeNoGradient) {
  manual_seed(4);
  nn::Linear lin({.in_features = 5, .out_features = 3});
  const Tensor x = randn({2, 5});
  for (DType t : kHalves) {
    TG_EXPECT_ERROR(lin(x.to(t)), "linear", dtype_name(t), "dtypes differ");  // f32 weight, half input
    EXPECT_THROW(lin.to(t), DTypeError);
    EXPECT_EQ(lin.weight.dtype(), DType::f32);  // refused before any parameter moved
    Tensor h = x.to(t);
    TG_EXPECT_ERROR(h.requires_grad_(), "requires_grad_", dtype_name(t), "leaf takes no gradient");
    EXPECT_THROW(h.requires_grad_(), DTypeError);
    EXPECT_FALSE(h.requires_grad());
    // A cast to a half type is recorded like any cast (the gradient goes back cast to f32:
    // test_autocast.cpp) ...
    Tensor p = randn({3}).requires_grad_();
    {
      Tape tape;
      const Tensor ph = p.to(t);
      EXPECT_EQ(ph.dtype(), t);
      EXPECT_TRUE(ph.requires_grad());
    }
    // ... and outside a tape nothing is recorded.
    const Tensor outside = p.to(t);
    EXPECT_EQ(outside.dtype(), t);
    EXPECT_FALSE(outside.requires_grad());
  }
}

TEST(HalfStorage, AMissingGpuFailsClearlyBeforeAnyAllocation) {
  // Half tensors live on GPUs like the others (tests/cuda/test_half_cuda.cpp); asking for one
  // on a GPU this machine lacks (any GPU, in a build without CUDA) fails naming the op and the
  // device, before anything is allocated, whether or not a GPU is present.
  if (cuda_device_count() >= kMaxCudaDevices) GTEST_SKIP() << "every GPU ordinal exists here";
  const Device missing = Device::cuda(kMaxCudaDevices - 1);
  const std::string name = missing.str();
  const char* why = TG_CUDA ? "no such device" : "built without CUDA";
  for (DType t : kHalves) {
    const TensorOptions there{.dtype = t, .device = missing};
    TG_EXPECT_ERROR(Tensor::empty({4}, there), "Tensor::empty", name.c_str(), why);
    TG_EXPECT_ERROR(zeros({4}, there), "zeros", name.c_str(), why);
    TG_EXPECT_ERROR(full({4}, 1.0, there), "full", name.c_str(), why);
    TG_EXPECT_ERROR(randn({4}, there), "randn", name.c_str(), why);
    TG_EXPECT_ERROR(from_vector(std::vector<float>{1, 2}, {2}, there), "from_vector", name.c_str(), why);
    TG_EXPECT_ERROR(arange(3, there), "arange", name.c_str(), why);
    TG_EXPECT_ERROR(ones({2}, {.dtype = t}).to(missing), "Tensor::to(device)", name.c_str(), why);
  }
}

TEST(HalfStorage, ShapeOpsMoveTheBitsOnTheCpu) {
  for (DType t : kHalves) {
    const Tensor h = awkward_halves(t, 24, 9).reshape({4, 6});
    const std::vector<uint16_t> b = half_bits(h);
    const Tensor r = cat({slice(h, 1, 0, 2), slice(h, 1, 2, 6)}, 1);
    EXPECT_EQ(r.dtype(), t);
    EXPECT_EQ(half_bits(r), b);
    const Tensor p = h.permute({1, 0});
    EXPECT_EQ(half_bits(p)[1], b[6]);  // p[0][1] = h[1][0]
    EXPECT_EQ(half_bits(p.permute({1, 0})), b);
    EXPECT_EQ(half_bits(h.clone()), b);
    EXPECT_EQ(half_bits(flatten(h)), b);
    EXPECT_EQ(half_bits(split(h, 2, 0)[1]), std::vector<uint16_t>(b.begin() + 12, b.end()));
  }
}

TEST(HalfStorage, SafetensorsKeepTheBits) {
  TempDir dir;
  const std::string p = dir.file("half.safetensors");
  const Tensor b = awkward_halves(DType::bf16, 1000, 1).reshape({10, 100});
  const Tensor h = awkward_halves(DType::f16, 333, 2);
  const Tensor f = randn({7});
  st::save_file({{"b", b}, {"h", h}, {"f", f}}, p);
  const st::Header header = st::read_header(p);
  EXPECT_EQ(header.find("b")->dtype, "BF16");
  EXPECT_EQ(header.find("h")->dtype, "F16");
  EXPECT_EQ(header.find("h")->end - header.find("h")->begin, 666u);
  // As stored: the file's dtype and its bits.
  const st::NamedTensors kept = st::load_file(p);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].second.dtype(), DType::bf16);
  EXPECT_EQ(kept[0].second.shape(), b.shape());
  EXPECT_EQ(half_bits(kept[0].second), half_bits(b));
  EXPECT_EQ(kept[1].second.dtype(), DType::f16);
  EXPECT_EQ(half_bits(kept[1].second), half_bits(h));
  EXPECT_EQ(kept[2].second.to_vector<float>(), f.to_vector<float>());
  // Widened for callers that compute (what tg::load does): the values, exactly.
  const st::NamedTensors wide = st::load_file(p, nullptr, /*widen_half=*/true);
  EXPECT_EQ(wide[0].second.dtype(), DType::f32);
  const std::vector<float> wb = wide[0].second.to_vector<float>(), vb = b.to_vector<float>();
  for (size_t i = 0; i < wb.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(wb[i]), std::bit_cast<uint32_t>(vb[i])) << i;  // NaN payloads too
  // A half format a tensor is already in is a copy; the other one rounds once from its value.
  st::save_file({{"b", b}, {"h", h}}, p, {}, st::FloatFormat::bf16);
  const st::NamedTensors as_bf16 = st::load_file(p);
  EXPECT_EQ(half_bits(as_bf16[0].second), half_bits(b));
  EXPECT_EQ(as_bf16[1].second.dtype(), DType::bf16);
  const std::vector<uint16_t> hb = half_bits(h), got = half_bits(as_bf16[1].second);
  for (size_t i = 0; i < hb.size(); ++i) ASSERT_EQ(got[i], encode_bf16(decode_f16(hb[i]))) << i;
  EXPECT_EQ(got, half_bits(h.to(DType::bf16)));
}
