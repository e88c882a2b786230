// Group normalization (Wu & He, 2018), PyTorch semantics: x (N, C, *) of any rank >= 3 is
// viewed as (N, C, HW) so that 2-D and 3-D inputs share one kernel; each of the `groups`
// groups of C/groups channels is normalized with its biased variance, eps inside the sqrt,
// then scaled and shifted per channel.
#pragma once
#include <cstdint>

#include "../core/tensor.h"

namespace tg {

// gamma, beta (C), or undefined tensors for no scale / no shift.
Tensor group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t groups, double eps = 1e-5);
// relu(group_norm(x, ...)) in the same passes over x: the ReLU's own read and write of the
// activation, forward and backward, are not made. The same values and gradients as the two ops.
Tensor group_norm_relu(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t groups,
                       double eps = 1e-5);
// relu(group_norm(x, ...) + residual), a residual block's tail: the forward in one pass over x
// and residual (the add's and the ReLU's own passes are not made); the backward as the three
// ops' (the ReLU's mask, then group_norm's kernels; the residual's gradient is the masked dy).
Tensor group_norm_add_relu(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t groups,
                           const Tensor& residual, double eps = 1e-5);

// The flattened problem, shared by the CPU reference and the CUDA kernels.
struct GroupNormProblem {
  int64_t N = 0, C = 0, HW = 0;  // x viewed as (N, C, HW)
  int64_t groups = 1;
  double eps = 1e-5;
  bool relu = false;  // y = max(0, the normalized, scaled and shifted x)

  int64_t channels_per_group() const { return C / groups; }
  int64_t group_size() const { return C / groups * HW; }  // elements normalized together
};

// Throws unless the buffers fit the problem: x, y-like (N*C*HW elements), mean and rstd
// (N*groups), gamma and beta (C) where defined; one floating dtype and one device.
void check_group_norm_buffers(const char* op, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& gamma, const Tensor& beta, const GroupNormProblem& p);
// The full checks of the forward and backward kernels' arguments (same order as the kernel
// entry points below), called first by both backends.
void check_group_norm_forward_buffers(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                      const Tensor& gamma, const Tensor& beta, const GroupNormProblem& p,
                                      const Tensor& residual = Tensor());
void check_group_norm_backward_buffers(const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                                       const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, const GroupNormProblem& p,
                                       const Tensor& y = Tensor());

}  // namespace tg

// Kernel entry points (outputs, inputs, params), used by ops/norm.cpp and by tests. The
// CUDA twins with the same signatures are in ops/cuda/norm.h. Tensors keep their own
// shapes (any rank); only element counts matter.
namespace tg::cpu {
// y like x; mean, rstd (N, groups) are saved for backward; gamma, beta (C) or undefined;
// residual (like x, or undefined) is added to the normalized output before the ReLU.
void group_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& gamma, const Tensor& beta, const GroupNormProblem& p,
                        const Tensor& residual = Tensor());
// dx like x, dgamma and dbeta (C): each may be undefined, and is then not computed. With
// p.relu, y is the forward's output: dy counts only where y > 0 (the ReLU's gradient).
void group_norm_backward(const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, const Tensor& dy,
                         const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                         const GroupNormProblem& p, const Tensor& y = Tensor());
}  // namespace tg::cpu
