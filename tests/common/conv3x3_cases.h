// Shared by the CUDA tests of the 3x3 convolution kernels (mma.sync, wgmma with A in registers,
// wgmma with both operands in shared memory): a test case's shape, its name in failure
// messages, NaN-poisoned outputs, and the run-twice determinism check.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>

#include <cuda_runtime.h>

#include "common/test_util.h"
#include "ops/conv.h"

namespace tg::test::conv3x3 {

inline const Device kGpu = Device::cuda(0);

// x (N, C, H, W), w (K, C, 3, 3), padding (pad_h, pad_w), stride 1.
struct Case {
  int64_t N, C, H, W, K, pad_h, pad_w;
};

inline std::string name(const Case& c) {
  std::ostringstream os;  // (not a chain of string +: GCC 12 warns falsely about it, -Wrestrict)
  os << "N" << c.N << " C" << c.C << " H" << c.H << " W" << c.W << " K" << c.K << " pad (" << c.pad_h << ", "
     << c.pad_w << ")";
  return os.str();
}

inline ConvShape shape_of(const Case& c) {
  return make_conv_shape("test", {c.N, c.C, c.H, c.W}, {c.K, c.C, 3, 3}, ConvParams{.padding = {c.pad_h, c.pad_w}});
}

inline bool is_hopper() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) return false;
  return major == 9 && minor == 0;
}

inline Tensor poisoned(const Shape& s) {
  Tensor t = Tensor::empty(s, {.dtype = f32, .device = kGpu});
  poison(t);
  return t;
}

// Runs `launch` into a fresh NaN-poisoned GPU tensor of shape s twice: returns the first
// result and checks that the second has the same bits.
template <class Launch>
Tensor run_twice(const Shape& s, Launch&& launch) {
  Tensor first = poisoned(s), second = poisoned(s);
  launch(first);
  launch(second);
  EXPECT_EQ(first.to_vector<float>(), second.to_vector<float>()) << "not deterministic";
  return first;
}

}  // namespace tg::test::conv3x3
