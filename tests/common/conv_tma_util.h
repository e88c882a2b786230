// Helpers shared by the tests of the engine's TMA convolution kernel (test_conv_tma_cuda.cpp,
// test_conv_tma_quads_cuda.cpp): a case, the tolerances by precision, the f64 reference copy,
// and the check that the GPU runs the kernel at all.
#pragma once
#include "common/test_util.h"
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

inline Tensor ref(const Tensor& t) { return t.detach().cpu().to(DType::f64); }

// Whether the engine's TMA convolution kernel runs on this GPU (an sm_90a device).
inline bool hopper() {
  return cuda::engine_conv_forward_uses_tma(make_conv_shape("probe", {1, 16, 4, 4}, {1, 16, 3, 3}, {}),
                                            Tensor::empty({1, 16, 4, 4}, {.device = kGpu}), Precision::TF32);
}

}  // namespace tg::test::conv_tma

#define TG_REQUIRE_TMA()                                                            \
  TG_REQUIRE_GPU();                                                                 \
  if (!::tg::test::conv_tma::hopper()) GTEST_SKIP() << "the TMA convolution kernel needs an sm_90a GPU"
