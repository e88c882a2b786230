// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_: in place on the
// grads of `params`; parameters without a grad are skipped. Every grad must be on one
// device (all CPU or all on one GPU), f32 or f64 (mixed dtypes are fine).
//
// On a GPU each call is one fused kernel over every grad (a device table of (pointer,
// length) entries) for the norm and one for the scaling, whatever the number of
// parameters. The norm is reduced in a fixed order (per-block partials in double, summed by
// one block in index order; no atomics), so it is the same bit for bit on every run. The
// host waits only to read back the returned norm, after both kernels are queued.
#pragma once
#include <vector>

#include "../../core/tensor.h"

namespace tg::nn {

// The norm of all grads taken together, as if concatenated into one vector:
// (sum |g|^norm_type)^(1/norm_type), or max |g| for norm_type = infinity. Then, as
// PyTorch, scale = max_norm / (norm + 1e-6), and every grad is multiplied by it only when
// scale < 1. Returns the norm before clipping (0 when no parameter has a grad).
// A NaN or infinite norm leaves the grads as they are and is returned (the caller decides
// to skip the step), or with error_if_nonfinite throws tg::Error after leaving them so.
// Throws tg::Error for a max_norm that is negative or NaN, a norm_type that is not > 0 (or
// is NaN), grads on different devices or not floating point.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// Clamps every grad element into [-clip_value, clip_value] (NaN stays NaN). Throws
// tg::Error for a clip_value that is negative or NaN, or grads on different devices.
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace tg::nn

namespace tg::cuda {

// One entry per grad, all on `device` (checked by the callers in clip.cpp).
// Returns the norm (waits for it); norm_type as above (infinity for the max norm).
// The grads are scaled only when the norm is finite and max_norm / (norm + 1e-6) < 1.
double clip_grad_norm(int device, const std::vector<Tensor>& grads, double max_norm, double norm_type);
void clip_grad_value(int device, const std::vector<Tensor>& grads, double clip_value);

}  // namespace tg::cuda
