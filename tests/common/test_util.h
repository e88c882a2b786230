// Helpers shared by the test programs.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tapegrad/tapegrad.h"

namespace tg::test {

// Relative L2 error ||a - b|| / ||b||, computed in f64 on the host. NaN anywhere -> inf,
// so an unwritten (poisoned) element always fails.
inline double rel_l2(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return std::numeric_limits<double>::infinity();
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Fresh random inputs in [-1, 1): never zeros.
inline Tensor random(const Shape& s, DType dt = DType::f64, Device d = Device::cpu()) {
  return uniform(s, -1.0, 1.0, {.dtype = dt, .device = d});
}

// A leaf that requires grad.
inline Tensor param(const Shape& s, DType dt = DType::f64) { return random(s, dt).requires_grad_(); }

// Poisons a buffer so that any element a kernel fails to write is caught: NaN, or for i64
// (which has no NaN) its lowest value.
inline void poison(Tensor& t) {
  t.fill_(t.dtype() == DType::i64 ? -9223372036854775808.0 : std::numeric_limits<double>::quiet_NaN());
}

// Rows [begin, end) of an (N, ...) tensor, as a new tensor of its dtype on `device` (through
// the host: tests use it to cut batches without any slicing op under test).
inline Tensor rows_of(const Tensor& t, int64_t begin, int64_t end, Device device = Device::cpu()) {
  const int64_t per_row = t.numel() / t.size(0);
  const std::vector<double> v = t.to_vector<double>();
  std::vector<double> part(v.begin() + begin * per_row, v.begin() + end * per_row);
  std::vector<int64_t> dims = t.shape().dims();
  dims[0] = end - begin;
  return from_vector(part, Shape(dims), {.dtype = DType::f64}).to(t.dtype()).to(device);
}

// Expects `statement` to throw tg::Error whose message contains every fragment.
#define TG_EXPECT_ERROR(statement, ...)                                                     \
  do {                                                                                      \
    try {                                                                                   \
      statement;                                                                            \
      ADD_FAILURE() << "expected tg::Error from: " #statement;                              \
    } catch (const ::tg::Error& e) {                                                        \
      std::string msg_ = e.what();                                                          \
      for (const char* frag_ : {__VA_ARGS__})                                               \
        EXPECT_NE(msg_.find(frag_), std::string::npos) << "message lacks '" << frag_ << "': " << msg_; \
    }                                                                                       \
  } while (0)

#define TG_EXPECT_GRADCHECK(fn, inputs)                      \
  do {                                                       \
    auto r_ = ::tg::gradcheck(fn, inputs);                   \
    EXPECT_TRUE(r_.ok) << r_.message;                        \
  } while (0)

// Skips a CUDA test when no usable GPU is present.
#define TG_REQUIRE_GPU()                                                  \
  do {                                                                    \
    if (!::tg::cuda_available()) GTEST_SKIP() << "no usable CUDA device"; \
  } while (0)

// For the tests of an sm_90a kernel: skips by the device, then insists that the kernel takes a
// plain shape there (`takes_plain_shape`), so that a broken _uses_tma check fails the tests
// instead of skipping them. The caller includes ops/cuda/arch/hopper.h.
#define TG_REQUIRE_SM90A_KERNEL(kernel, takes_plain_shape)                                      \
  TG_REQUIRE_GPU();                                                                             \
  if (!::tg::cuda::device_runs_wgmma(0)) GTEST_SKIP() << "the " kernel " needs an sm_90a GPU"; \
  ASSERT_TRUE(takes_plain_shape) << "an sm_90a device, but the " kernel " refuses a plain shape"

}  // namespace tg::test
