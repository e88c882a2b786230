// Tensor-core (mma.sync TF32) kernels of conv3d_group_norm_mean, used by the launchers in
// ops/cuda/conv3d_gn_mean_{stats,grad}.cu when conv3d_gn_mean_mma_applies() (ops/cuda/fused.h)
// holds.
// Internal: host launchers only, ordered on x's framework stream. `tf32` selects plain TF32
// (one tensor op per product); otherwise FP32-accurate split products: two tensor ops in the
// forward (TF32 hi*hi' + one bf16 op for both cross terms), three TF32 ops in the backward.
#pragma once
#include "../../../core/tensor.h"
#include "../../fused.h"

namespace tg::cuda {

// S1, S2 (N, K) f64, like conv3d_gn_mean_stats.
void conv3d_gn_mean_mma_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                              const Conv3dGnMeanProblem& p, bool tf32);

// dw (K, C, 3, 3, 3) for dL/dy = A[n,c] + B[n,g] y, y recomputed (like conv3d_gn_mean_grad_conv
// without dx).
void conv3d_gn_mean_mma_grad_weight(const Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& b,
                                    const Tensor& A, const Tensor& B, const Conv3dGnMeanProblem& p, bool tf32);

}  // namespace tg::cuda
