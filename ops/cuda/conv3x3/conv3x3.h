// Fast path for 3x3, stride-1, dilation-1 2-D convolutions in NCHW (workload A):
// implicit GEMM on tensor cores (mma.sync m16n8k8 TF32) that reads NCHW directly, for the
// forward pass, the input gradient (the same kernel on flipped, transposed weights) and the
// weight gradient (a split reduction over positions, partials summed in a fixed order).
//
// Precision is an argument (by default tg::precision() at the call; the dispatcher passes its
// problem's): TF32 -> one TF32 product per term (rel. L2 error ~3e-4); FP32 -> FP32-accurate
// split products (x = hi + lo: a TF32 mma for hi*hi' and one bf16 mma for both cross terms;
// error ~1e-6).
// Every result is the same bits on every run (no atomics). Any padding, batch and spatial
// sizes, channel counts as conv3x3_applies says; f32 tensors (the caller checks the dtype
// before asking conv3x3_applies).
//
// The general launchers in ops/cuda/conv.cu call these when conv3x3_applies(s) is true. On an
// H100 / H200 with sm_90a code they route to the wgmma kernels: forward and input gradient to
// conv3x3_wgmma_ss (TF32) or conv3x3_wgmma (FP32), the TF32 weight gradient to conv3x3_wgmma_dw.
// KernelPolicy::conv3x3 (ops/cuda/policy.h) can pick another of these kernels, for tests and
// the benchmark.
#pragma once
#include <initializer_list>
#include <utility>

#include "../../../core/precision.h"
#include "../../../core/tensor.h"
#include "../../conv.h"

namespace tg::cuda {

// True for a 2-D NCHW convolution with a 3x3 kernel, stride 1 and dilation 1 (any padding,
// batch and spatial sizes, rows up to 2^28 wide), any channel counts under
// Precision::TF32 and at most 128 input and output channels under Precision::FP32 (longer
// tensor-core accumulation chains would exceed FP32 accuracy). Ask and launch with the same
// precision. The dtype (f32) is the caller's to check.
bool conv3x3_applies(const ConvShape& s, Precision precision = tg::precision());

// y (N, K, Ho, Wo) = conv(x (N, C, H, W), w (K, C, 3, 3)) + b (K) or no bias (undefined b).
void conv3x3_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                     Precision precision = tg::precision());
// dx (N, C, H, W) = gradient of the output dy (N, K, Ho, Wo) with respect to x (overwritten).
void conv3x3_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                        Precision precision = tg::precision());
// dw (K, C, 3, 3) = gradient of the output dy with respect to w (overwritten).
void conv3x3_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                         Precision precision = tg::precision());

// The widest copy (4, 2 or 1 floats) that every row of a tensor at `base` with rows of length
// row_len allows when copies start at column first_col of a row, plus multiples of the width.
int row_copy_width(const float* base, int64_t row_len, int64_t first_col = 0);

// The argument checks of every 3x3 launcher (conv3x3*.cu), before any kernel runs: each tensor
// defined; `applies` (does that kernel take problem s on the tensors' device at that
// precision?) or an error that names the op, what the kernel `needs` and the shapes; then each
// tensor f32, on that one GPU and of its expected shape.
using ExpectedTensors = std::initializer_list<std::pair<const Tensor*, Shape>>;
// What the TF32-only wgmma kernels (conv3x3_wgmma_ss, conv3x3_wgmma_dw) need, for their messages.
inline constexpr const char* kNeedsTf32Wgmma =
    "a 3x3 stride-1 NCHW 2-D convolution in TF32 mode on a compute capability 9.0 GPU with sm_90a code";
void check_conv3x3_tensors(const char* op, const ConvShape& s, Precision precision,
                           bool (*applies)(const ConvShape&, Device, Precision), const char* needs, ExpectedTensors ts);

}  // namespace tg::cuda
