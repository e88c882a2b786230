// The exception family (core/error.h): each kind of bad input gets its own subclass of
// tg::Error, so a caller can catch what it can handle; messages name the file relative to
// the project; and the timing / device-error API behaves on the CPU (and without CUDA).
#include <cstring>
#include <string>
#include <type_traits>
#include <typeinfo>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

// Runs `fn` and expects it to throw exactly E (not a sibling, not the bare base class).
// Returns the message so a test can look at it.
template <class E, class Fn>
std::string expect_throws_exactly(Fn&& fn, const char* what) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_TRUE(typeid(e) == typeid(E)) << what << ": expected " << typeid(E).name() << ", got "
                                        << typeid(e).name() << ": " << e.what();
    return e.what();
  }
  ADD_FAILURE() << what << ": nothing was thrown";
  return {};
}

// The project root as this test was compiled: __FILE__ is <root>/tests/cpu/<this file>.
std::string source_root() {
  const std::string file = __FILE__, self = "tests/cpu/test_error_types.cpp";
  return file.size() > self.size() ? file.substr(0, file.size() - self.size()) : std::string();
}

}  // namespace

static_assert(std::is_base_of_v<Error, ShapeError> && std::is_base_of_v<Error, DTypeError> &&
              std::is_base_of_v<Error, DeviceError> && std::is_base_of_v<Error, IOError> &&
              std::is_base_of_v<Error, UnsupportedError> && std::is_base_of_v<Error, CudaError> &&
              std::is_base_of_v<Error, OutOfMemory>);

TEST(ErrorTypes, ShapeMismatchesAreShapeErrors) {
  expect_throws_exactly<ShapeError>([] { add(random({2, 3}), random({4})); }, "add broadcast");
  expect_throws_exactly<ShapeError>([] { matmul(random({2, 3}), random({4, 5})); }, "matmul");
  expect_throws_exactly<ShapeError>([] { conv2d(random({1, 3, 8}), random({4, 3, 3, 3})); }, "conv2d rank");
  expect_throws_exactly<ShapeError>([] { conv2d(random({1, 3, 8, 8}), random({4, 2, 3, 3})); }, "conv2d channels");
  expect_throws_exactly<ShapeError>([] { mse_loss(random({3}), random({4})); }, "mse_loss");
  expect_throws_exactly<ShapeError>([] { random({2, 3}).reshape({7}); }, "reshape");
  expect_throws_exactly<ShapeError>([] { mean(random({2, 3}), {5}); }, "mean dim");
}

TEST(ErrorTypes, DTypeMismatchesAreDTypeErrors) {
  expect_throws_exactly<DTypeError>([] { add(random({2}, f32), random({2}, f64)); }, "add f32 + f64");
  expect_throws_exactly<DTypeError>(
      [] { cross_entropy(random({2, 3}), from_vector(std::vector<double>{0, 1}, {2})); }, "cross_entropy f64 targets");
}

TEST(ErrorTypes, DeviceMismatchesAreDeviceErrors) {
  if (!cuda_available()) GTEST_SKIP() << "needs a GPU to hold one operand (no usable CUDA device)";
  const Device gpu = Device::cuda();
  expect_throws_exactly<DeviceError>([&] { add(random({2}, f32), random({2}, f32, gpu)); }, "add cpu + cuda");
  expect_throws_exactly<DeviceError>(
      [&] { cross_entropy(random({2, 3}, f32, gpu), from_vector(std::vector<int64_t>{0, 1}, {2}, {.dtype = i64})); },
      "cross_entropy targets on the CPU");
}

// A GPU that is not there: DeviceError where CUDA is built but that ordinal is missing,
// UnsupportedError in a build without CUDA. Either way before anything is allocated.
TEST(ErrorTypes, MissingDevicesAreDeviceOrUnsupportedErrors) {
#if TG_CUDA
  const Device beyond = Device::cuda(cuda_device_count());  // one past the last visible GPU
  expect_throws_exactly<DeviceError>([&] { zeros({2}, {.device = beyond}); }, "zeros on a missing GPU");
  expect_throws_exactly<DeviceError>([&] { random({2}, f32).to(beyond); }, "to() a missing GPU");
#else
  expect_throws_exactly<UnsupportedError>([] { zeros({2}, {.device = Device::cuda(0)}); }, "zeros on cuda, no CUDA");
#endif
}

// Layers check their input's shape as the ops do: ShapeError, naming the layer.
TEST(ErrorTypes, LayerInputShapesAreShapeErrors) {
  nn::Linear linear({.in_features = 3, .out_features = 2});
  expect_throws_exactly<ShapeError>([&] { linear.forward(random({2, 5, 4}, f32)); }, "Linear (..., in)");
  nn::GroupNorm norm({.num_groups = 2, .num_channels = 4});
  expect_throws_exactly<ShapeError>([&] { norm.forward(random({2, 6, 3}, f32)); }, "GroupNorm channels");
  nn::Flatten flatten;
  expect_throws_exactly<ShapeError>([&] { flatten.forward(random({}, f32)); }, "Flatten of a 0-d tensor");
}

// A mixed-precision pair names both types, the half one first.
TEST(ErrorTypes, MixedHalfAndF32NamesBothTypes) {
  const std::string msg = expect_throws_exactly<DTypeError>(
      [] { add(random({2, 3}, f32), random({2, 3}, f32).to(DType::bf16)); }, "add f32 + bf16");
  EXPECT_NE(msg.find("bf16[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[2, 3]"), std::string::npos) << msg;
}

TEST(ErrorTypes, FileProblemsAreIOErrors) {
  const std::string missing = ::testing::TempDir() + "tg_no_such_dir/none.safetensors";
  const std::string msg =
      expect_throws_exactly<IOError>([&] { safetensors::load_file(missing); }, "load of a missing file");
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  expect_throws_exactly<IOError>([&] { safetensors::save_file({{"x", random({2})}}, missing); },
                                 "save into a missing directory");
}

TEST(ErrorTypes, UnsupportedRequestsAreUnsupportedErrors) {
  ConvParams nhwc;
  nhwc.layout = Layout::NHWC;
  expect_throws_exactly<UnsupportedError>([&] { conv3d(random({1, 4, 4, 4, 2}), random({3, 2, 1, 1, 1}), {}, nhwc); },
                                          "conv3d channels-last");
#if !TG_CUDA
  expect_throws_exactly<UnsupportedError>([] { GpuTimer timer(Device::cuda()); }, "GpuTimer without CUDA");
#endif
}

TEST(ErrorTypes, CheckMacrosThrowTheirClass) {
  expect_throws_exactly<Error>([] { TG_CHECK(false, "plain"); }, "TG_CHECK");
  expect_throws_exactly<ShapeError>([] { TG_CHECK_AS(ShapeError, 1 + 1 == 3, "typed"); }, "TG_CHECK_AS");
  expect_throws_exactly<IOError>([] { TG_FAIL_AS(IOError, "typed failure"); }, "TG_FAIL_AS");
  EXPECT_NO_THROW(TG_CHECK_AS(ShapeError, true, "never"));
}

// A user's bug report should show where in tapegrad the check is, not where the library
// was built: "[ops/elementwise.cpp:32]", never "[/home/builder/src/tapegrad/ops/...]".
TEST(ErrorTypes, MessagesNameTheFileRelativeToTheProject) {
  const std::string root = source_root();
  ASSERT_FALSE(root.empty());
  const std::string msg = expect_throws_exactly<ShapeError>([] { add(random({2, 3}), random({4})); }, "add");
  EXPECT_NE(msg.find("[ops/"), std::string::npos) << msg;
  EXPECT_EQ(msg.find(root + "ops/"), std::string::npos) << msg;
  // The same for a check expanded in this file (compiled outside the library).
  const std::string here = expect_throws_exactly<Error>([] { TG_CHECK(false, "here"); }, "TG_CHECK here");
  EXPECT_NE(here.find("[tests/cpu/test_error_types.cpp:"), std::string::npos) << here;
}

TEST(ErrorTypes, CpuTimerAndErrorCheckWork) {
  GpuTimer timer(Device::cpu());
  expect_throws_exactly<Error>([&] { timer.elapsed_ms(); }, "elapsed before start");
  timer.start();
  Tensor y = matmul(random({64, 64}), random({64, 64}));
  timer.stop();
  EXPECT_GE(timer.elapsed_ms(), 0.0);
  tg::cuda::Timer also_a_timer(Device::cpu());  // the alias a CUDA user looks for
  EXPECT_EQ(also_a_timer.device(), Device::cpu());
  EXPECT_NO_THROW(check_errors(Device::cpu()));
  EXPECT_NO_THROW(synchronize(Device::cpu()));
}
