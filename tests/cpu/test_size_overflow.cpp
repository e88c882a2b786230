// Hostile sizes: every size, count, byte count and GPU ordinal that does not fit is a
// tg::Error naming the op, raised before anything is allocated or run, never a wrapped
// product (a small buffer that kernels write past) or signed-overflow UB. Probes use the
// boundary values 0, 1, 2^31 +- 1, 2^62, INT64_MAX and negatives; validity is predicted
// from an independent statement of the rule in 128-bit arithmetic. Cases that are valid
// but would need more than a little memory are checked without allocating.
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/fixtures.h"
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t k31 = int64_t{1} << 31;
constexpr int64_t k62 = int64_t{1} << 62;
const std::vector<int64_t> kBoundaries = {0, 1, 2, k31 - 1, k31, k31 + 1, k62, k62 + 1, kMax, -1, -k31, kMin};

// Like TG_EXPECT_ERROR, and the error must not be an out-of-memory one: an allocation was
// attempted, so the size was not rejected up front.
#define EXPECT_SIZE_ERROR(statement, ...)                                                               \
  do {                                                                                                  \
    try {                                                                                               \
      statement;                                                                                        \
      ADD_FAILURE() << "expected tg::Error from: " #statement;                                          \
    } catch (const ::tg::OutOfMemory& e) {                                                              \
      ADD_FAILURE() << "an allocation was attempted before the size was checked: " << e.what();         \
    } catch (const ::tg::Error& e) {                                                                    \
      std::string msg_ = e.what();                                                                      \
      for (const char* frag_ : {__VA_ARGS__})                                                           \
        EXPECT_NE(msg_.find(frag_), std::string::npos) << "message lacks '" << frag_ << "': " << msg_; \
    }                                                                                                   \
  } while (0)

using i128 = __int128;

// The rule, stated independently: no negative dim, and the non-zero dims times the element
// size fit in int64 (so every count, stride and byte offset does). Returns -1 when invalid.
i128 predicted_bytes(const std::vector<int64_t>& dims, int64_t elem_size) {
  i128 extent = elem_size;
  bool zero = false;
  for (int64_t d : dims) {
    if (d < 0) return -1;
    if (d == 0) zero = true;
    else extent *= d;
    if (extent > kMax) return -1;
  }
  return zero ? 0 : extent;
}

// Small enough to allocate in a test.
bool small(i128 bytes) { return bytes >= 0 && bytes <= (1 << 20); }

std::vector<std::vector<int64_t>> boundary_shapes() {
  std::vector<std::vector<int64_t>> out;
  for (int64_t v : kBoundaries) {
    out.push_back({v});
    out.push_back({v, 4});
    out.push_back({v, v});
    out.push_back({0, v, v});  // a zero dim first must not hide the product of the rest
    out.push_back({v, v, 0});
    out.push_back({1, v, 1, 1});
  }
  out.push_back({k31 + 1, k31 - 1});  // 2^62 - 1 elements: 2^64 - 4 bytes in f32
  out.push_back({k31, k31});
  out.push_back({0, k31 - 1, k31 - 1});
  out.push_back({k62 + 1, 4});  // wraps to 4 elements in 64 bits
  out.push_back({kMax, kMax});  // wraps to 1 element
  out.push_back({1, 2, 3, 4, 5, 6, 7});
  return out;
}

std::string str(const std::vector<int64_t>& v) { return Shape(v).str(); }

}  // namespace

// ---- the helpers ------------------------------------------------------------------------

TEST(CheckedArithmetic, MultiplyAddAndCountsThrowNamingTheOp) {
  EXPECT_EQ(checked_mul(k31, k31, "t"), k62);
  EXPECT_EQ(checked_add(kMax - 1, 1, "t"), kMax);
  EXPECT_SIZE_ERROR(checked_mul(kMax, 2, "my_op"), "my_op", "overflows int64");
  EXPECT_SIZE_ERROR(checked_mul(kMin, -1, "my_op"), "my_op");
  EXPECT_SIZE_ERROR(checked_add(kMax, 1, "my_op"), "my_op", "overflows int64");
  EXPECT_SIZE_ERROR(checked_sub(kMin, 1, "my_op"), "my_op", "overflows int64");

  const std::vector<int64_t> wrap = {k62 + 1, 4};
  EXPECT_SIZE_ERROR(checked_numel(wrap, "my_op"), "my_op", "[4611686018427387905, 4]");
  const std::vector<int64_t> neg = {2, -3};
  EXPECT_SIZE_ERROR(checked_numel(neg, "my_op"), "my_op", "negative size");
  const std::vector<int64_t> zero_first = {0, k62, k62};
  EXPECT_SIZE_ERROR(checked_numel(zero_first, "my_op"), "my_op");
  const std::vector<int64_t> max1 = {kMax, 1};
  EXPECT_EQ(checked_numel(max1, "t"), kMax);
  EXPECT_EQ(checked_bytes(int64_t{1} << 60, 4, "t"), k62);
  EXPECT_SIZE_ERROR(checked_bytes(int64_t{1} << 61, 4, "my_op"), "my_op", "byte count");
  EXPECT_SIZE_ERROR(checked_bytes(-1, 4, "my_op"), "my_op");
}

TEST(SizeOverflow, ShapeNumelNeverWraps) {
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(Shape{0}.numel(), 0);
  EXPECT_EQ((Shape{k31 + 1, k31 - 1}.numel()), k62 - 1);
  EXPECT_EQ(Shape{kMax}.numel(), kMax);
  EXPECT_SIZE_ERROR((Shape{k62 + 1, 4}.numel()), "Shape::numel", "overflows int64");
  EXPECT_SIZE_ERROR((Shape{kMax, kMax}.numel()), "Shape::numel");
  EXPECT_SIZE_ERROR((Shape{k31, k31, 2}.numel()), "Shape::numel");
  // Both orders fail alike: the check does not depend on where the zero is.
  EXPECT_SIZE_ERROR((Shape{0, k62, k62}.numel()), "Shape::numel");
  EXPECT_SIZE_ERROR((Shape{k62, k62, 0}.numel()), "Shape::numel");
  EXPECT_SIZE_ERROR((Shape{3, -1}.numel()), "Shape::numel", "negative size");
}

// ---- the repro and reshape --------------------------------------------------------------

TEST(SizeOverflow, ReshapeToAWrappedCountIsRejected) {
  // 2^62 + 1 rows of 4 wrap to 4 elements in 64 bits: viewing a 16-byte buffer this way
  // let sum write far past it.
  EXPECT_THROW(tg::sum(tg::ones({4}).reshape({(1LL << 62) + 1, 4}), {1}), tg::Error);
  EXPECT_SIZE_ERROR(ones({4}).reshape({k62 + 1, 4}), "reshape");
  EXPECT_SIZE_ERROR(ones({1}).reshape({kMax, kMax}), "reshape");  // wraps to 1
  EXPECT_SIZE_ERROR(zeros({0}).reshape({0, k62, k62}), "reshape");
  EXPECT_SIZE_ERROR(zeros({0}).reshape({k62, k62, 0}), "reshape");
  EXPECT_SIZE_ERROR(ones({4}).reshape({-1, k62, 4}), "reshape");
  EXPECT_SIZE_ERROR(ones({4}).reshape({-4, -1}), "reshape", "negative");
  EXPECT_SIZE_ERROR(ones({4}).reshape({kMin, -1}), "reshape");
  EXPECT_SIZE_ERROR(ones({4}).reshape({-1, -1}), "reshape", "more than one -1");
  // The -1 is inferred from the checked product of the others.
  EXPECT_EQ(ones({6}).reshape({-1, 2}).shape(), (Shape{3, 2}));
  EXPECT_EQ(zeros({0}).reshape({-1, 2}).shape(), (Shape{0, 2}));
  EXPECT_EQ(zeros({0}).reshape({0, k31 - 1}).shape(), (Shape{0, k31 - 1}));
  EXPECT_EQ(zeros({0}).reshape({0, k31 + 1, 3}).shape(), (Shape{0, k31 + 1, 3}));
}

TEST(SizeOverflow, ReshapeOfAnEmptyTensorAtBoundaryShapes) {
  // zeros({0}) can be viewed as any valid shape with a zero dim; one -1 (among non-zero
  // dims) is inferred as 0.
  int valid = 0, invalid = 0;
  for (const auto& dims : boundary_shapes()) {
    std::vector<int64_t> target = dims;
    int infer = 0;
    i128 known = 1;
    for (int64_t& d : target) {
      if (d == -1) ++infer, d = 0;
      else known *= d;
    }
    const bool inferable = infer == 0 || (infer == 1 && known > 0);
    const i128 bytes = inferable ? predicted_bytes(target, 4) : -1;
    bool zero = false;
    for (int64_t d : target) zero = zero || d == 0;
    SCOPED_TRACE(str(dims));
    if (bytes < 0 || !zero || dims.size() > kMaxDims) {
      EXPECT_SIZE_ERROR(zeros({0}).reshape(Shape(dims)), "reshape");
      ++invalid;
    } else {
      EXPECT_EQ(zeros({0}).reshape(Shape(dims)).shape(), Shape(target));
      ++valid;
    }
  }
  EXPECT_GT(valid, 10);
  EXPECT_GT(invalid, 30);
}

// ---- factories --------------------------------------------------------------------------

TEST(SizeOverflow, FactoriesRejectOverflowingAndNegativeShapes) {
  struct Factory {
    const char* name;
    std::function<Tensor(const Shape&)> make;
    DType dtype;
  };
  const std::vector<Factory> factories = {
      {"zeros", [](const Shape& s) { return zeros(s); }, f32},
      {"ones", [](const Shape& s) { return ones(s, {.dtype = f64}); }, f64},
      {"full", [](const Shape& s) { return full(s, 2.5); }, f32},
      {"rand", [](const Shape& s) { return rand(s); }, f32},
      {"randn", [](const Shape& s) { return randn(s, {.dtype = f64}); }, f64},
      {"uniform", [](const Shape& s) { return uniform(s, -1, 1); }, f32},
      {"Tensor::empty", [](const Shape& s) { return Tensor::empty(s, {.dtype = i64}); }, i64},
      {"from_vector", [](const Shape& s) { return from_vector(std::vector<float>{}, s); }, f32},
  };
  int rejected = 0, made = 0;
  for (const Factory& f : factories) {
    for (const auto& dims : boundary_shapes()) {
      SCOPED_TRACE(std::string(f.name) + " " + str(dims));
      const i128 bytes = predicted_bytes(dims, static_cast<int64_t>(dtype_size(f.dtype)));
      if (bytes < 0 || dims.size() > kMaxDims) {
        EXPECT_SIZE_ERROR(f.make(Shape(dims)), f.name);
        ++rejected;
      } else if (small(bytes) && (std::string(f.name) != "from_vector" || bytes == 0)) {
        Tensor t = f.make(Shape(dims));
        EXPECT_EQ(t.shape(), Shape(dims));
        EXPECT_EQ(static_cast<i128>(t.nbytes()), bytes);
        ++made;
      } else {
        // Valid but large: the size is accepted without allocating it here.
        EXPECT_EQ(static_cast<i128>(checked_tensor_bytes(f.name, Shape(dims), f.dtype)), bytes);
      }
    }
  }
  EXPECT_GT(rejected, 300);
  EXPECT_GT(made, 50);

  // A wrapped element count no longer matches the number of values given.
  EXPECT_SIZE_ERROR(from_vector(std::vector<float>{1, 2, 3, 4}, {k62 + 1, 4}), "from_vector");
  EXPECT_SIZE_ERROR(from_vector(std::vector<double>{1}, {kMax, kMax}), "from_vector");
  EXPECT_SIZE_ERROR(from_vector(std::vector<int64_t>{1, 2}, {-1, -2}), "from_vector", "negative");
  EXPECT_SIZE_ERROR(zeros({k62}), "zeros", "byte count");  // 2^62 elements fit, 2^64 bytes do not
  EXPECT_SIZE_ERROR(zeros({1, 2, 3, 4, 5, 6, 7}), "zeros", "dims");
}

TEST(SizeOverflow, ArangeChecksItsByteCount) {
  EXPECT_EQ(arange(0).numel(), 0);
  EXPECT_EQ(arange(1).numel(), 1);
  EXPECT_SIZE_ERROR(arange(kMax), "arange", "byte count");
  EXPECT_SIZE_ERROR(arange(k62, {.dtype = f64}), "arange", "byte count");
  EXPECT_SIZE_ERROR(arange(int64_t{1} << 61), "arange", "byte count");
  EXPECT_SIZE_ERROR(arange(-1), "arange", "negative");
  EXPECT_SIZE_ERROR(arange(kMin), "arange", "negative");
}

// ---- expand and permute -----------------------------------------------------------------

TEST(SizeOverflow, ExpandChecksTheTargetShape) {
  Tensor one = ones({1, 1});
  EXPECT_SIZE_ERROR(expand(one, {k62, 4}), "expand");          // 2^64 elements, wraps to 0
  EXPECT_SIZE_ERROR(expand(one, {k31 + 1, k31 - 1}), "expand");  // 2^62 - 1 elements, 2^64 - 4 bytes
  EXPECT_SIZE_ERROR(expand(one, {kMax, kMax}), "expand");
  EXPECT_SIZE_ERROR(expand(ones({1}), {kMax}), "expand", "byte count");
  EXPECT_SIZE_ERROR(expand(one, {-1, 4}), "expand", "negative");
  EXPECT_SIZE_ERROR(expand(one, {0, k62, k62}), "expand");
  EXPECT_SIZE_ERROR(expand(one, {kMin, 1}), "expand");
  EXPECT_EQ(expand(one, {0, 3}).shape(), (Shape{0, 3}));
  EXPECT_EQ(expand(one, {0, k31 + 1}).shape(), (Shape{0, k31 + 1}));
  std::vector<double> v = expand(ones({1, 1}, {.dtype = f64}), {2, 3}).to_vector<double>();
  EXPECT_EQ(v, std::vector<double>(6, 1.0));
}

TEST(SizeOverflow, PermuteRejectsHostileDimsAndHugeEmptyShapes) {
  Tensor x = ones({2, 3});
  EXPECT_SIZE_ERROR(x.permute({kMin, 0}), "permute", "[-9223372036854775808, 0]");
  EXPECT_SIZE_ERROR(x.permute({kMax, 0}), "permute", "[9223372036854775807, 0]");
  EXPECT_SIZE_ERROR(x.permute({0, 0}), "permute", "[0, 0]");
  EXPECT_SIZE_ERROR(x.permute({0, 1, 2}), "permute");
  EXPECT_EQ(x.permute({-1, -2}).shape(), (Shape{3, 2}));
  // A huge empty tensor permutes without allocating; one whose strides overflow cannot exist.
  Tensor e = zeros({0, k31 - 1, 1 << 20});
  EXPECT_EQ(e.permute({2, 0, 1}).shape(), (Shape{1 << 20, 0, k31 - 1}));
  EXPECT_SIZE_ERROR(zeros({0}).reshape({0, k62, k62}).permute({2, 1, 0}), "reshape");
}

// ---- convolution geometry ---------------------------------------------------------------

TEST(SizeOverflow, ConvOutputSizeIsChecked) {
  EXPECT_EQ(conv_output_size(13, 3, 2, 1, 2), 6);
  EXPECT_EQ(conv_output_size(5, 3, kMax, 0, 1), 1);
  EXPECT_SIZE_ERROR(conv_output_size(5, 3, 1, k62, 1), "conv_output_size", "padding");
  EXPECT_SIZE_ERROR(conv_output_size(5, 3, 1, kMax, 1), "conv_output_size", "padding");
  EXPECT_SIZE_ERROR(conv_output_size(5, 3, 1, 0, kMax), "conv_output_size", "dilated kernel");
  EXPECT_SIZE_ERROR(conv_output_size(5, 3, 1, 0, k62), "conv_output_size", "dilated kernel");
  EXPECT_SIZE_ERROR(conv_output_size(5, kMin, 1, 0, 1), "conv_output_size", "kernel size");
  EXPECT_SIZE_ERROR(conv_output_size(kMax, 1, 1, 1, 1), "conv_output_size");
  EXPECT_SIZE_ERROR(conv_output_size(5, 3, 0, 0, 1), "conv_output_size", "stride");
}

TEST(SizeOverflow, ConvParamsAtBoundaryValues) {
  // conv2d of x (1, 1, 5, 5) and w (1, 1, 3, 3), one parameter at a boundary value.
  const Shape xs{1, 1, 5, 5}, ws{1, 1, 3, 3};
  int valid = 0, invalid = 0;
  for (const char* which : {"stride", "padding", "dilation"}) {
    for (int64_t v : kBoundaries) {
      ConvParams p;
      i128 stride = 1, pad = 0, dil = 1;
      if (std::string(which) == "stride") p.stride = {v}, stride = v;
      if (std::string(which) == "padding") p.padding = {v}, pad = v;
      if (std::string(which) == "dilation") p.dilation = {v}, dil = v;
      const i128 padded = 5 + 2 * pad, extent = dil * 2 + 1;
      const bool ok = stride >= 1 && pad >= 0 && dil >= 1 && padded <= kMax && 2 * pad <= kMax &&
                      extent <= kMax && extent <= padded;
      i128 out = ok ? (padded - extent) / stride + 1 : 0;
      const bool fits = ok && out * out <= kMax;
      SCOPED_TRACE(std::string(which) + " " + std::to_string(v));
      if (!ok) {
        EXPECT_SIZE_ERROR(make_conv_shape("conv2d", xs, ws, p), "conv2d", which);
        ++invalid;
        continue;
      }
      if (!fits) {  // the parameters are fine, the output is too large to count
        EXPECT_SIZE_ERROR(make_conv_shape("conv2d", xs, ws, p), "conv2d", "too large");
        ++invalid;
        continue;
      }
      const ConvShape s = make_conv_shape("conv2d", xs, ws, p);
      EXPECT_EQ(static_cast<i128>(s.out[1]), out);
      EXPECT_EQ(static_cast<i128>(s.out[2]), out);
      if (out <= 64) {
        Tensor y = conv2d(random(xs), random(ws), Tensor(), p);
        EXPECT_EQ(y.shape(), (Shape{1, 1, static_cast<int64_t>(out), static_cast<int64_t>(out)}));
      }
      ++valid;
    }
  }
  EXPECT_GT(valid, 5);
  EXPECT_GT(invalid, 20);

  // Terms near INT64_MAX: an error naming the overflowing term, never a wrapped extent.
  EXPECT_SIZE_ERROR(make_conv_shape("conv2d", xs, ws, {.dilation = {kMax}}), "conv2d", "dilated kernel",
                    "overflows int64");
  EXPECT_SIZE_ERROR(make_conv_shape("conv2d", xs, ws, {.padding = {k62}}), "conv2d", "padding",
                    "overflows int64");
  EXPECT_SIZE_ERROR(make_conv_shape("conv2d", xs, ws, {.padding = {k62 - 1}}), "conv2d", "padded input",
                    "overflows int64");
  EXPECT_SIZE_ERROR(conv2d(random(xs), random(ws), Tensor(), {.dilation = {kMax}}), "conv2d",
                    "overflows int64");
  EXPECT_SIZE_ERROR(conv3d(random({1, 1, 3, 3, 3}), random({1, 1, 3, 3, 3}), Tensor(),
                           {.padding = {0, kMax / 2, 0}}),
                    "conv3d", "padded input");
  // A huge output (2^61 + 2)^2 elements: rejected before any allocation.
  EXPECT_SIZE_ERROR(conv2d(random(xs), random(ws), Tensor(), {.padding = {int64_t{1} << 61}}), "conv2d");
  // Huge but valid: stride 2^62 over padding 2^61 leaves a 2 x 2 output.
  const ConvShape s = make_conv_shape("conv2d", xs, ws, {.stride = {k62}, .padding = {int64_t{1} << 61}});
  EXPECT_EQ(s.out[1], 2);
  // Shapes given to the backward pieces are checked like tensors' shapes.
  EXPECT_SIZE_ERROR(make_conv_shape("conv_backward_input", {1, 1, k62, k62}, ws, {}), "conv_backward_input");
  EXPECT_SIZE_ERROR(make_conv_shape("conv_backward_input", {-1, 1, 5, 5}, ws, {}), "conv_backward_input",
                    "negative");
}

// ---- layer constructors -----------------------------------------------------------------

TEST(SizeOverflow, LayerConstructorsRejectOverflowingWeights) {
  EXPECT_SIZE_ERROR(nn::Linear({.in_features = k31, .out_features = k31}), "Linear");
  EXPECT_SIZE_ERROR(nn::Linear({.in_features = k31 + 1, .out_features = k31 - 1}), "Linear");
  EXPECT_SIZE_ERROR(nn::Linear({.in_features = k62, .out_features = 4}), "Linear");
  EXPECT_SIZE_ERROR(nn::Linear({.in_features = kMax, .out_features = 1}), "Linear");
  EXPECT_SIZE_ERROR(nn::Linear({.in_features = kMax, .out_features = kMax}), "Linear");
  EXPECT_SIZE_ERROR(nn::Linear({.in_features = -1, .out_features = 4}), "Linear");
  nn::Linear ok({.in_features = 3, .out_features = 2});
  EXPECT_EQ(ok.weight.shape(), (Shape{2, 3}));

  EXPECT_SIZE_ERROR(nn::Conv2d({.in_channels = k31, .out_channels = k31, .kernel_size = 3}), "Conv2d");
  EXPECT_SIZE_ERROR(nn::Conv2d({.in_channels = 1, .out_channels = 1, .kernel_size = {k31, k31}}), "Conv2d");
  EXPECT_SIZE_ERROR(nn::Conv2d({.in_channels = 1, .out_channels = 1, .kernel_size = 3, .dilation = {kMax}}), "Conv2d",
                    "dilated kernel");
  EXPECT_SIZE_ERROR(nn::Conv2d({.in_channels = 1, .out_channels = 1, .kernel_size = 3, .padding = {k62}}), "Conv2d",
                    "padding");
  EXPECT_SIZE_ERROR(nn::Conv2d({.in_channels = 1, .out_channels = 1, .kernel_size = {kMin}}), "Conv2d");
  const int64_t k21 = int64_t{1} << 21;
  EXPECT_SIZE_ERROR(nn::Conv3d({.in_channels = 1, .out_channels = 1, .kernel_size = {k21, k21, k21}}), "Conv3d");
  EXPECT_SIZE_ERROR(nn::Conv3d({.in_channels = k31, .out_channels = k31, .kernel_size = {1}}), "Conv3d");
  nn::Conv2d conv({.in_channels = 2, .out_channels = 3, .kernel_size = 3, .dilation = {k31 - 1}});  // legal, if useless
  EXPECT_EQ(conv.weight.shape(), (Shape{3, 2, 3, 3}));
}

// ---- device ordinals --------------------------------------------------------------------

TEST(DeviceOrdinal, ParseDeviceAcceptsOnlyPlainOrdinalsInRange) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:0"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:15").index, 15);
  for (const char* bad : {"cuda:-1", "cuda:+1", "cuda: 1", "cuda:1x", "cuda:16", "cuda:2147483648",
                          "cuda:99999999999", "cuda:", "cuda:0x1", "cuda:-2147483648", "gpu:0"}) {
    SCOPED_TRACE(bad);
    EXPECT_SIZE_ERROR(parse_device(bad), "parse_device");
  }
  EXPECT_SIZE_ERROR(Device::cuda(-1), "Device::cuda", "-1");
  EXPECT_SIZE_ERROR(Device::cuda(kMaxCudaDevices), "Device::cuda");
  EXPECT_SIZE_ERROR(Device::cuda(std::numeric_limits<int>::min()), "Device::cuda");
  EXPECT_SIZE_ERROR(ones({2}).cuda(-1), "Device::cuda");
}

TEST(DeviceOrdinal, MemoryStatsAndAllocationCheckTheOrdinal) {
  // A Device built field by field skips Device::cuda's check: its users check it.
  for (int index : {-1, kMaxCudaDevices, 1 << 30, std::numeric_limits<int>::min()}) {
    const Device d{Device::Kind::cuda, index};
    SCOPED_TRACE(d.str());
    EXPECT_SIZE_ERROR(memory_stats(d), "memory_stats");
    EXPECT_SIZE_ERROR(reset_peak_memory(d), "reset_peak_memory");
    EXPECT_SIZE_ERROR(zeros({2}, {.device = d}), "zeros");
    EXPECT_SIZE_ERROR(Tensor::empty({2}, {.device = d}), "Tensor::empty");
    EXPECT_SIZE_ERROR(arange(3, {.device = d}), "arange");
    EXPECT_SIZE_ERROR(from_vector(std::vector<float>{1}, {1}, {.device = d}), "from_vector");
  }
  EXPECT_SIZE_ERROR(memory_stats(Device{Device::Kind::cpu, 3}), "memory_stats");
  // A GPU this machine lacks: an error where it is used, not when it is named.
  const int count = cuda_device_count();
  if (count < kMaxCudaDevices) {
    const Device absent = Device::cuda(count);
    EXPECT_SIZE_ERROR(memory_stats(absent), "memory_stats");
    EXPECT_SIZE_ERROR(reset_peak_memory(absent), "reset_peak_memory");
    EXPECT_SIZE_ERROR(zeros({2}, {.device = absent}), "zeros");
  }
  EXPECT_NO_THROW(memory_stats(Device::cpu()));
  EXPECT_NO_THROW(reset_peak_memory(Device::cpu()));
}

// ---- safetensors ------------------------------------------------------------------------

namespace {

void write_file(const std::string& path, const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << out << header << data;
}

std::string entry(const std::string& shape, uint64_t end, const char* dtype = "F32") {
  return "{\"a\":{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":" + shape + ",\"data_offsets\":[0," +
         std::to_string(end) + "]}}";
}

}  // namespace

TEST(SizeOverflow, SafetensorsShapeCheckDoesNotDependOnDimOrder) {
  TempDir dir;
  const std::string p = dir.file("huge.safetensors");
  const std::string big = std::to_string(k62);
  // A zero dim first used to make the product 0 before the huge dims were multiplied.
  write_file(p, entry("[0," + big + "," + big + "]", 0));
  EXPECT_SIZE_ERROR(st::read_header(p), "tensor 'a'", "too large");
  EXPECT_SIZE_ERROR(st::load_file(p), "tensor 'a'", "too large");
  write_file(p, entry("[" + big + "," + big + ",0]", 0));
  EXPECT_SIZE_ERROR(st::load_file(p), "tensor 'a'", "too large");
  write_file(p, entry("[" + big + ",0," + big + "]", 0));
  EXPECT_SIZE_ERROR(st::load_file(p), "tensor 'a'", "too large");
  // 2^62 - 1 elements fit in int64; their 2^64 - 4 bytes do not.
  write_file(p, entry("[0," + std::to_string(k31 + 1) + "," + std::to_string(k31 - 1) + "]", 0));
  EXPECT_SIZE_ERROR(st::load_file(p), "tensor 'a'", "too large");
  write_file(p, entry("[0," + std::to_string(kMax) + "]", 0, "I64"));
  EXPECT_SIZE_ERROR(st::load_file(p), "tensor 'a'", "too large");
  // Valid empty tensors still load, and a huge valid shape is measured against its offsets.
  write_file(p, entry("[0," + std::to_string(k31 + 1) + "]", 0));
  auto loaded = st::load_file(p);
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].second.shape(), (Shape{0, k31 + 1}));
  write_file(p, entry("[" + std::to_string(k31 + 1) + "]", 16));
  EXPECT_SIZE_ERROR(st::read_header(p), "tensor 'a'", "data_offsets");
}

TEST(SizeOverflow, SafetensorsReadTensorsChecksACallersHeader) {
  TempDir dir;
  const std::string p = dir.file("a.safetensors");
  const float data[3] = {1, 2, 3};
  write_file(p, entry("[3]", 12), std::string(reinterpret_cast<const char*>(data), sizeof(data)));
  st::Header h = st::read_header(p);
  EXPECT_EQ(st::read_tensors(p, h, {"a"})[0].second.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  // A header edited by the caller: its byte range no longer matches the shape.
  h.tensors[0].shape = {2};
  EXPECT_SIZE_ERROR(st::read_tensors(p, h, {"a"}), "tensor 'a'", "data_offsets");
  h.tensors[0].shape = {k62 + 1, 4};
  EXPECT_SIZE_ERROR(st::read_tensors(p, h, {"a"}), "Tensor::empty");
}
