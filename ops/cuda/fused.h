// CUDA launchers of conv3d_group_norm_mean; same names, signatures and meaning as tg::cpu in
// ops/fused.h. Ordered on the framework stream of x's device; deterministic (fixed-order
// reductions, no atomics). Each launcher chooses, by default, the tensor-core kernels when
// conv3d_gn_mean_mma_applies() holds (ops/cuda/conv3d_gn_mean/mma_sm80.h), else the FFMA fused
// kernels when conv3d_gn_mean_applies() holds, else a materialized path (y = conv3d through
// the general convolution kernels, then the same statistics), so every problem is handled.
#pragma once
#include "../../core/tensor.h"
#include "../fused.h"

namespace tg::cuda {

// The fused kernels' shape class: f32, a 3x3x3 kernel (stride 1, padding 0, dilation 1 is the
// op's only geometry), N >= 1, and small enough channel counts for the weights and tiles to
// live in shared memory (e.g. C_in 3 with K <= 72, C_in 1 with K <= 224, C_in 4 with K <= 56).
bool conv3d_gn_mean_applies(const Conv3dGnMeanProblem& p, DType dtype);

// The tensor-core kernels' shape class: f32, the same geometry, C_in 1 or 3 and K = 24 (the
// instantiated tiles), any N, D, H, W. tg::precision() TF32 -> one TF32 tensor op per product;
// FP32 -> FP32-accurate split products: the forward statistics use two tensor ops per product
// (TF32 hi*hi' + one bf16 op for both cross terms), the backward three (split-TF32).
bool conv3d_gn_mean_mma_applies(const Conv3dGnMeanProblem& p, DType dtype);

// Kernel family of conv3d_gn_mean_stats and conv3d_gn_mean_grad_conv. automatic: tensor cores
// where they apply (for grad_conv: when dx is not wanted; with dx the FFMA kernel computes both
// in one pass), else FFMA, else materialized. ffma / tensor_core force a family (tests), and
// fail when it does not apply; tensor_core with dx computes dw on tensor cores and dx apart.
enum class Conv3dGnMeanKernels { automatic, ffma, tensor_core };

void conv3d_gn_mean_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                          const Conv3dGnMeanProblem& p,
                          Conv3dGnMeanKernels kernels = Conv3dGnMeanKernels::automatic);
void conv3d_gn_mean_finish(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& S1,
                           const Tensor& S2, const Tensor& gamma, const Tensor& beta, const Conv3dGnMeanProblem& p);
void conv3d_gn_mean_coefficients(const Tensor& A, const Tensor& B, const Tensor& dgamma, const Tensor& dbeta,
                                 const Tensor& db, const Tensor& gout, const Tensor& S1, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& gamma, const Conv3dGnMeanProblem& p);
void conv3d_gn_mean_grad_conv(const Tensor& dw, const Tensor& dx, const Tensor& x, const Tensor& w,
                              const Tensor& b, const Tensor& A, const Tensor& B, const Conv3dGnMeanProblem& p,
                              Conv3dGnMeanKernels kernels = Conv3dGnMeanKernels::automatic);

}  // namespace tg::cuda
