// 3x3 stride-1 NCHW convolutions (workload A): conv3x3_applies, the argument checks shared by
// every 3x3 launcher, and the per-pass dispatch: TF32 on Hopper to the wgmma kernels
// (conv3x3_wgmma*.cu), otherwise the mma.sync kernels (forward / grad-input in conv3x3/fprop_sm80.cu,
// grad-weight in conv3x3/wgrad_sm80.cu). Design and precision: docs/kernels/conv3x3.md.
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv3x3/pipeline_sm80.cuh"
#include "ops/cuda/conv3x3/fprop_sm90.h"
#include "ops/cuda/conv3x3/wgrad_tf32_sm90.h"
#include "ops/cuda/conv3x3/fprop_tf32_sm90.h"
#include "ops/cuda/policy.h"

namespace tg::cuda {

using conv3x3_detail::forward_params;
using conv3x3_detail::grad_input_params;
using conv3x3_detail::run_gemm;
using conv3x3_detail::run_wgrad;

namespace {

bool takes_3x3(const ConvShape& s, Device, Precision precision) { return conv3x3_applies(s, precision); }
void check_tensors(const char* op, const ConvShape& s, Precision precision, ExpectedTensors ts) {
  check_conv3x3_tensors(op, s, precision, takes_3x3, "a 3x3 stride-1 NCHW 2-D convolution", ts);
}

}  // namespace

// FP32 mode: the forward / grad-input tensor-core chains run over all input channels (2
// accumulating mma per 8 channels and tap; truncating adds, ~1.9e-8 rel. error each, see
// conv3x3_wgrad_kernel): 128 channels -> 288 adds, ~5e-6. More
// channels would exceed 1e-5, so those go to the general (FFMA) kernels.
constexpr int64_t kMaxFp32Channels = 128;
int row_copy_width(const float* base, int64_t row_len, int64_t first_col) {
  const auto a = reinterpret_cast<uintptr_t>(base);
  for (int vec : {4, 2})
    if (a % (4 * vec) == 0 && row_len % vec == 0 && ((first_col % vec) + vec) % vec == 0) return vec;
  return 1;
}

void check_conv3x3_tensors(const char* op, const ConvShape& s, Precision precision,
                           bool (*applies)(const ConvShape&, Device, Precision), const char* needs, ExpectedTensors ts) {
  for (const auto& [t, shape] : ts) TG_CHECK(t->defined(), op, ": undefined tensor where ", shape, " was expected");
  const Device d = ts.begin()->first->device();
  TG_CHECK(applies(s, d, precision), op, ": needs ", needs, "; got x ", s.x_shape(), ", w ", s.w_shape(), " on ", d);
  for (const auto& [t, shape] : ts) {
    TG_CHECK(t->dtype() == DType::f32, op, ": expected f32 tensors, got ", describe(*t));
    TG_CHECK(t->device() == d && d.is_cuda(), op, ": expected every tensor on one GPU (", d, "), got ", describe(*t));
    TG_CHECK(t->shape() == shape, op, ": tensor ", describe(*t), " does not match the problem x ", s.x_shape(),
             ", w ", s.w_shape(), " -> y ", s.y_shape(), ": expected ", shape);
  }
}


bool conv3x3_applies(const ConvShape& s, Precision precision) {
  if (precision == Precision::FP32 && (s.C > kMaxFp32Channels || s.K > kMaxFp32Channels)) return false;
  return s.spatial_dims == 2 && s.layout == Layout::NCHW && s.kernel[0] == 1 && s.kernel[1] == 3 &&
         s.kernel[2] == 3 && s.stride[0] == 1 && s.stride[1] == 1 && s.stride[2] == 1 && s.dilation[0] == 1 &&
         s.dilation[1] == 1 && s.dilation[2] == 1 && s.in[0] == 1 && s.out[0] == 1 && s.pad[0] == 0 &&
         s.pad[1] >= 0 && s.pad[2] >= 0 && s.N >= 1 && s.C >= 1 && s.K >= 1 && s.in[1] >= 1 && s.in[2] >= 1 &&
         s.out[1] >= 1 && s.out[2] >= 1 &&
         // In-tile pixel offsets are 32-bit (rows x width): rows up to 2^28 wide.
         s.in[2] + 2 * s.pad[2] <= (int64_t{1} << 28);
}

// Forward and grad-input: TF32 on Hopper has two wgmma kernels, both operands from shared memory
// (conv3x3_wgmma_ss, the default) or activations from registers (conv3x3_wgmma, which also serves
// FP32 mode); the mma.sync kernel (run_gemm) serves other GPUs. KernelPolicy::conv3x3 (tests,
// benchmark) can pick the register-A or the mma.sync kernel instead.
void conv3x3_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                     Precision precision) {
  check_tensors("conv3x3_forward", s, precision, {{&y, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}});
  if (b.defined()) check_tensors("conv3x3_forward", s, precision, {{&y, s.y_shape()}, {&b, Shape{s.K}}});
  const Conv3x3Policy::Data data = kernel_policy().conv3x3.data;
  if (data == Conv3x3Policy::Data::Auto && conv3x3_wgmma_ss_applies(s, y.device(), precision))
    return conv3x3_wgmma_ss_forward(y, x, w, b, s, precision);
  if (data != Conv3x3Policy::Data::MmaSync && conv3x3_wgmma_applies(s, y.device(), precision))
    return conv3x3_wgmma_forward(y, x, w, b, s, precision);  // sm_90a, both modes
  run_gemm(y, x, w, b.defined() ? b.data<float>() : nullptr,
           forward_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
           /*for_grad_input=*/false, precision);
}

void conv3x3_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                        Precision precision) {
  check_tensors("conv3x3_grad_input", s, precision, {{&dx, s.x_shape()}, {&dy, s.y_shape()}, {&w, s.w_shape()}});
  const Conv3x3Policy::Data data = kernel_policy().conv3x3.data;
  if (data == Conv3x3Policy::Data::Auto && conv3x3_wgmma_ss_applies(s, dx.device(), precision))
    return conv3x3_wgmma_ss_grad_input(dx, dy, w, s, precision);
  if (data != Conv3x3Policy::Data::MmaSync && conv3x3_wgmma_applies(s, dx.device(), precision))
    return conv3x3_wgmma_grad_input(dx, dy, w, s, precision);  // sm_90a, both modes
  run_gemm(dx, dy, w, nullptr,
           grad_input_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
           /*for_grad_input=*/true, precision);
}

void conv3x3_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                         Precision precision) {
  check_tensors("conv3x3_grad_weight", s, precision, {{&dw, s.w_shape()}, {&dy, s.y_shape()}, {&x, s.x_shape()}});
  if (precision == Precision::FP32) return run_wgrad<true>(dw, dy, x, s);
  // TF32 on Hopper: the wgmma kernel, unless KernelPolicy::conv3x3 asks for the mma.sync one.
  if (kernel_policy().conv3x3.weight == Conv3x3Policy::Weight::Auto &&
      conv3x3_wgmma_dw_applies(s, dw.device(), precision)) {
    return conv3x3_wgmma_grad_weight(dw, dy, x, s, precision);
  }
  run_wgrad<false>(dw, dy, x, s);
}

}  // namespace tg::cuda
