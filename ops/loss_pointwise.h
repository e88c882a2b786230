// The elementwise losses' per-element formulas, compiled into both the CPU reference
// (ops/cpu/loss.cpp, in double) and the CUDA kernels (ops/cuda/loss.cu) so the two run the
// same expressions. d = pred - target.
//   bce_with_logits  x = pred, y = target:  max(x, 0) - x * y + log1p(exp(-|x|))
//                    (never exponentiates a positive number: no overflow for any x)
//                    d/dx = sigmoid(x) - y          d/dy = -x
//   l1               |d|                            d/dpred = sign(d) (0 at d = 0)
//   smooth_l1 (beta) |d| < beta ? d^2 / (2 beta) : |d| - beta / 2;  beta = 0 is l1
//                    d/dpred = |d| < beta ? d / beta : sign(d)
//   huber (delta)    |d| < delta ? d^2 / 2 : delta * (|d| - delta / 2)
//                    d/dpred = |d| < delta ? d : delta * sign(d)
// For the distance losses d/dtarget = -d/dpred.
#pragma once
#include <cmath>

#include "../core/random.h"  // TG_HOST_DEVICE
#include "loss.h"

namespace tg {

template <class C>
TG_HOST_DEVICE C pointwise_loss_value(C x, C y, PointwiseLoss kind, C beta) {
  using std::exp;
  using std::fabs;
  using std::log1p;
  if (kind == PointwiseLoss::bce_with_logits) return (x > C(0) ? x : C(0)) - x * y + log1p(exp(-fabs(x)));
  const C d = x - y, a = fabs(d);
  switch (kind) {
    case PointwiseLoss::smooth_l1: return a < beta ? C(0.5) * d * d / beta : a - C(0.5) * beta;
    case PointwiseLoss::huber: return a < beta ? C(0.5) * d * d : beta * (a - C(0.5) * beta);
    default: return a;  // l1
  }
}

// The derivative with respect to pred; that with respect to target is pointwise_loss_dtarget.
template <class C>
TG_HOST_DEVICE C pointwise_loss_dpred(C x, C y, PointwiseLoss kind, C beta) {
  using std::exp;
  if (kind == PointwiseLoss::bce_with_logits) {
    // sigmoid without overflow: exp of a non-positive number only
    const C e = exp(x > C(0) ? -x : x);
    const C s = x > C(0) ? C(1) / (C(1) + e) : e / (C(1) + e);
    return s - y;
  }
  const C d = x - y;
  const C sign = d > C(0) ? C(1) : d < C(0) ? C(-1) : d * C(0);  // NaN stays NaN
  switch (kind) {
    case PointwiseLoss::smooth_l1: return (d < beta && -d < beta) ? d / beta : sign;
    case PointwiseLoss::huber: return (d < beta && -d < beta) ? d : beta * sign;
    default: return sign;  // l1
  }
}

template <class C>
TG_HOST_DEVICE C pointwise_loss_dtarget(C x, C y, PointwiseLoss kind, C beta) {
  return kind == PointwiseLoss::bce_with_logits ? -x : -pointwise_loss_dpred(x, y, kind, beta);
}

}  // namespace tg
