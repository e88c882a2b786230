// Helpers shared by the tests of the engine's TMA convolution kernel (test_conv_tma_cuda.cpp,
// test_conv_tma_quads_cuda.cpp) and of its few-channel grad-input (test_dgrad_columns_cuda.cpp):
// a case, the tolerances by precision, the f64 reference copy, and the check that the GPU runs
// the kernel at all.
#pragma once
#include <cstddef>
#include <string>

#include "common/test_util.h"
#include "ops/cpu/conv.h"
#include "ops/cuda/gemm/engine.h"

namespace tg::test::conv_tma {

inline const Device kGpu = Device::cuda(0);
constexpr double kTf32Tolerance = 1e-3;
// FP32 mode (split TF32, three products per step): FP32-accurate.
constexpr double kFp32Tolerance = 1e-5;
inline const Precision kPrecisions[] = {Precision::TF32, Precision::FP32};
inline double tolerance(Precision p) { return p == Precision::FP32 ? kFp32Tolerance : kTf32Tolerance; }
inline const char* name_of(Precision p) { return p == Precision::FP32 ? "fp32" : "tf32"; }

struct ConvCase {
  const char* name;
  Shape x, w;  // x in the layout of p
  ConvParams p;
};

struct Variant {
  const char* name;
  cuda::EnginePolicy policy;
};

// The tilings the TMA convolution tests run under: the automatic plan, each tile width, split and
// unsplit reductions, two blocks per SM, and the element-wise stores.
inline const Variant kTilingVariants[] = {
    {"auto", {}},
    {"128 wide, unsplit", {.tile = 128, .splits = 1}},
    {"128 wide, split 3", {.tile = 128, .splits = 3}},
    {"256 wide, split 2", {.tile = 256, .splits = 2}},
    {"128 wide, two blocks per SM", {.tile = 128, .splits = 1, .blocks_per_sm = 2}},
    {"128 wide, split 2, stores through the output map", {.tile = 128, .splits = 2, .tma_store = -1}},
};

inline Tensor ref(const Tensor& t) { return t.detach().cpu().to(DType::f64); }

// Whether the engine's TMA convolution kernel runs on this GPU (an sm_90a device).
inline bool hopper() {
  return cuda::engine_conv_forward_uses_tma(make_conv_shape("probe", {1, 16, 4, 4}, {1, 16, 3, 3}, {}),
                                            Tensor::empty({1, 16, 4, 4}, {.device = kGpu}), Precision::TF32);
}

// The forward (with a bias) on the TMA kernel for every precision and each policy variant (its
// tma_quads set to `tma_quads`), against the f64 reference; outputs poisoned first. FP32 runs
// one block per SM on 64-wide tiles for 64 or fewer outputs (128-wide where a variant asks for
// 128), else 128-wide, whatever a variant asks of the width.
inline void expect_forward_on_tma(const ConvCase& c, const Variant* variants, size_t count, int tma_quads = 0) {
  const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
  Tensor x = random(c.x, DType::f32, kGpu), w = random(c.w, DType::f32, kGpu), b = random({s.K}, DType::f32, kGpu);
  Tensor y_ref = Tensor::empty(s.y_shape(), {.dtype = DType::f64});
  cpu::conv_forward(y_ref, ref(x), ref(w), ref(b), s);
  for (Precision prec : kPrecisions)
    for (size_t i = 0; i < count; ++i) {
      cuda::EnginePolicy policy = variants[i].policy;
      policy.tma_quads = tma_quads;
      const std::string where = std::string(c.name) + ", " + name_of(prec) + ", " + variants[i].name;
      ASSERT_TRUE(cuda::engine_conv_forward_uses_tma(s, x, prec, policy)) << where;
      Tensor y = Tensor::empty(s.y_shape(), {.device = kGpu});
      poison(y);
      cuda::engine_conv_forward(y, x, w, b, s, prec, policy);
      EXPECT_LE(rel_l2(y, y_ref), tolerance(prec)) << where;
    }
}

// Grad-input on the TMA kernel for every precision and each policy variant (its tma_quads set to
// `tma_quads`), against the f64 reference; outputs poisoned first.
inline void expect_grad_input_on_tma(const ConvCase& c, const Variant* variants, size_t count, int tma_quads = 0) {
  const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
  Tensor w = random(c.w, DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
  Tensor dx_ref = Tensor::empty(c.x, {.dtype = DType::f64});
  cpu::conv_grad_input(dx_ref, ref(dy), ref(w), s);
  for (Precision prec : kPrecisions)
    for (size_t i = 0; i < count; ++i) {
      const std::string where = std::string(c.name) + ", " + name_of(prec) + ", " + variants[i].name;
      cuda::EnginePolicy policy = variants[i].policy;
      policy.tma_quads = tma_quads;
      ASSERT_TRUE(cuda::engine_conv_grad_input_uses_tma(s, dy, prec, policy)) << where;
      Tensor dx = Tensor::empty(c.x, {.device = kGpu});
      poison(dx);
      cuda::engine_conv_grad_input(dx, dy, w, s, prec, policy);
      EXPECT_LE(rel_l2(dx, dx_ref), tolerance(prec)) << where;
    }
}

// Grad-weight on the TMA product for every precision and each policy variant (its wgrad_shifted
// set to `wgrad_shifted`: 1 the shifted rows of the padded input, -1 the written-out columns),
// against the f64 reference; outputs poisoned first.
inline void expect_grad_weight_on_tma(const ConvCase& c, const Variant* variants, size_t count, int wgrad_shifted) {
  const ConvShape s = make_conv_shape("test", c.x, c.w, c.p);
  Tensor x = random(c.x, DType::f32, kGpu), dy = random(s.y_shape(), DType::f32, kGpu);
  Tensor dw_ref = Tensor::empty(c.w, {.dtype = DType::f64});
  cpu::conv_grad_weight(dw_ref, ref(dy), ref(x), s);
  for (Precision prec : kPrecisions)
    for (size_t i = 0; i < count; ++i) {
      const std::string where = std::string(c.name) + ", " + name_of(prec) + ", " + variants[i].name;
      cuda::EnginePolicy policy = variants[i].policy;
      policy.wgrad_shifted = wgrad_shifted;
      Tensor dw = Tensor::empty(c.w, {.device = kGpu});
      ASSERT_TRUE(cuda::engine_conv_grad_weight_uses_tma(s, dw, prec, policy)) << where;
      ASSERT_EQ(cuda::engine_conv_grad_weight_uses_shifted_rows(s, dw, prec, false, policy), wgrad_shifted > 0)
          << where;
      poison(dw);
      cuda::engine_conv_grad_weight(dw, dy, x, s, prec, policy);
      EXPECT_LE(rel_l2(dw, dw_ref), tolerance(prec)) << where;
    }
}

}  // namespace tg::test::conv_tma

#define TG_REQUIRE_TMA()                                                            \
  TG_REQUIRE_GPU();                                                                 \
  if (!::tg::test::conv_tma::hopper()) GTEST_SKIP() << "the TMA convolution kernel needs an sm_90a GPU"
