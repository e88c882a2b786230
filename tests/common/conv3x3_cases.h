// Shared by the CUDA tests of the 3x3 convolution kernels (mma.sync, wgmma with A in registers,
// wgmma with both operands in shared memory): a test case's shape, its name in failure
// messages, NaN-poisoned outputs, the run-twice determinism check, and the exact one-hot cases.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/test_util.h"
#include "ops/conv.h"
#include "ops/cpu/conv.h"

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

// Exact case: integer inputs and one-hot weights (output channel k reads input channel k % C
// at tap k % 9) make every product and sum exact in TF32 / fp32 (truncation changes nothing on
// small integers), so the GPU must match the reference bit for bit. A wrong descriptor,
// register, shared-memory layout or fragment mapping moves values between channels, taps or
// pixels; the first mismatch is reported with its coordinates.
inline Tensor one_hot_weights(int64_t K, int64_t C) {
  std::vector<float> w(K * C * 9, 0.f);
  for (int64_t k = 0; k < K; ++k) w[(k * C + k % C) * 9 + k % 9] = 1.f;
  return from_vector(w, {K, C, 3, 3});
}
inline Tensor small_integers(const Shape& s) {
  const int64_t n = s.numel();
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7919) % 61 - 30);  // exact in TF32
  return from_vector(v, s);
}
inline void expect_exact(const Tensor& got, const Tensor& want, const char* what) {
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  const Shape& s = want.shape();  // (N, channels, H, W)
  for (size_t i = 0; i < w.size(); ++i) {
    if (g[i] == w[i]) continue;
    const int64_t col = i % s[3], row = i / s[3] % s[2], ch = i / (s[3] * s[2]) % s[1], n = i / (s[3] * s[2] * s[1]);
    ADD_FAILURE() << what << ": first mismatch at (n " << n << ", channel " << ch << ", row " << row << ", column "
                  << col << "): got " << g[i] << ", want " << w[i];
    return;
  }
}
// The exact one-hot check of a forward launcher, forward(y, x, w, s) on GPU tensors (y poisoned).
template <class Forward>
void expect_forward_one_hot_exact(const Case& c, Forward&& forward) {
  const ConvShape s = shape_of(c);
  Tensor x = small_integers(s.x_shape()), w = one_hot_weights(c.K, c.C);
  Tensor want = Tensor::empty(s.y_shape(), {.dtype = f64});
  cpu::conv_forward(want, x.to(f64), w.to(f64), Tensor(), s);
  Tensor y = poisoned(s.y_shape());
  forward(y, x.to(kGpu), w.to(kGpu), s);
  expect_exact(y, want, "forward");
}
// The same for a grad-input launcher, grad_input(dx, dy, w, s).
template <class GradInput>
void expect_grad_input_one_hot_exact(const Case& c, GradInput&& grad_input) {
  const ConvShape s = shape_of(c);
  Tensor dy = small_integers(s.y_shape()), w = one_hot_weights(c.K, c.C);
  Tensor want = Tensor::empty(s.x_shape(), {.dtype = f64});
  cpu::conv_grad_input(want, dy.to(f64), w.to(f64), s);
  Tensor dx = poisoned(s.x_shape());
  grad_input(dx, dy.to(kGpu), w.to(kGpu), s);
  expect_exact(dx, want, "grad_input");
}

}  // namespace tg::test::conv3x3
