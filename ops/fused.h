// Fused ops: several layers computed as one op with one tape entry, for workloads whose
// intermediate tensors are large but whose result needs only a few statistics of them.
//
// conv3d_group_norm_mean (workload C): Conv3d (stride 1, padding 0, dilation 1, bias)
// -> GroupNorm(groups) -> mean over every dim but the batch. x (N, C, D, H, W) -> out (N).
//
// The mean of GroupNorm's output needs only per-(sample, channel) sums of the conv output
// y, and per-(sample, group) sums of squares (for the group variance):
//   S1[n,c] = sum_v y[n,c,v],  S2[n,c] = sum_v y[n,c,v]^2,   V = D'H'W'
//   mu_c = S1/V,  mu_g = mean_{c in g} mu_c,  var_g = sum_{c in g} S2 / (|g| V) - mu_g^2
//   out[n] = (1/K) sum_c [gamma_c (mu_c - mu_g) rstd_g + beta_c],  rstd_g = 1/sqrt(var_g + eps)
// so y never has to exist in memory. Backward: dL/dy[n,c,v] = A[n,c] + B[n,g(c)] y[n,c,v] is
// affine in y (see conv3d_gn_mean_coefficients), so the conv's weight and input gradients
// are reductions in which y is recomputed where it is needed; dgamma, dbeta and the bias
// gradient are closed-form in S1 and the group statistics.
//
// Beware: with gamma equal within each group, out = mean(beta) for every input; tests must
// use non-uniform gamma or they test nothing.
#pragma once
#include <cstdint>

#include "../core/precision.h"
#include "../core/tensor.h"
#include "conv.h"

namespace tg {

// x (N, C, D, H, W); w (K, C, kd, kh, kw); b (K) or undefined (no bias); gamma, beta (K) or
// undefined (no scale / no shift, like group_norm); K % groups == 0. Returns (N).
// Recorded on an active tape as ONE entry "conv3d_group_norm_mean" with inputs
// {x, w, b, gamma, beta}; it saves x, w, b, gamma and the (N, K) / (N, groups) statistics.
Tensor conv3d_group_norm_mean(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gamma,
                              const Tensor& beta, int64_t groups, double eps = 1e-5);

// The problem size shared by the op, the CPU reference and the CUDA kernels.
struct Conv3dGnMeanProblem {
  ConvShape conv;       // a 3-D convolution with stride 1, padding 0, dilation 1
  int64_t groups = 1;   // GroupNorm groups over the conv's K output channels
  double eps = 1e-5;
  // The tensor-core kernels' contract (FP32-accurate split products or one TF32 product), read
  // from tg::precision() when the op describes the problem, so that the backward runs under
  // the forward's. The CPU reference and the FFMA kernels are FP32-accurate under either.
  Precision precision = Precision::FP32;

  int64_t volume() const { return conv.out_volume(); }              // V = D'H'W'
  int64_t channels_per_group() const { return conv.K / groups; }
};

// Validates x, w (and b where defined) and returns the problem; `op` names the caller.
Conv3dGnMeanProblem make_conv3d_gn_mean_problem(const char* op, const Tensor& x, const Tensor& w,
                                                const Tensor& b, int64_t groups, double eps);

}  // namespace tg

// Kernel entry points (outputs, inputs, problem), used by ops/fused.cpp and by tests; the
// CUDA twins with the same signatures are in ops/cuda/fused.h. Statistics (S1, S2, mean,
// rstd) are always f64 on x's device (they are tiny and carry the variance's cancellation);
// A, B, out and the gradients have x's dtype.
namespace tg::cpu {
// S1, S2 (N, K): per-(sample, channel) sum and sum of squares of y = conv3d(x, w) + b.
void conv3d_gn_mean_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                          const Conv3dGnMeanProblem& p);
// out (N); mean, rstd (N, groups) of y's groups (saved for backward).
void conv3d_gn_mean_finish(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& S1,
                           const Tensor& S2, const Tensor& gamma, const Tensor& beta, const Conv3dGnMeanProblem& p);
// From the output's gradient gout (N): dL/dy = A[n,c] + B[n,g] * y with A (N, K), B (N, groups);
// and the closed-form dgamma, dbeta, db (K) (each may be undefined: not computed).
void conv3d_gn_mean_coefficients(const Tensor& A, const Tensor& B, const Tensor& dgamma, const Tensor& dbeta,
                                 const Tensor& db, const Tensor& gout, const Tensor& S1, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& gamma, const Conv3dGnMeanProblem& p);
// dw (K, C, kd, kh, kw) and dx (like x), each may be undefined: the conv's gradients for
// dy = A + B * y, with y = conv3d(x, w) + b recomputed.
void conv3d_gn_mean_grad_conv(const Tensor& dw, const Tensor& dx, const Tensor& x, const Tensor& w,
                              const Tensor& b, const Tensor& A, const Tensor& B, const Conv3dGnMeanProblem& p);
}  // namespace tg::cpu
