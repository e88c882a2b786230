// GradScaler: dynamic loss scaling, as PyTorch's torch.amp.GradScaler. Small gradients that
// would underflow in a 16-bit type survive when the loss is multiplied by a large scale before
// backward; the grads are divided by it again before the optimizer step, and a step whose grads
// hold an infinity or a NaN (the scale was too large) is skipped and the scale halved. After
// `growth_interval` clean steps in a row the scale doubles again.
//
//   nn::GradScaler scaler;
//   for (...) {
//     tg::Tape tape;
//     tape.backward(scaler.scale(loss_fn(model(x), y)));
//     scaler.unscale_(opt);            // optional: before clipping, which needs true grads
//     nn::clip_grad_norm_(model.parameters(), 1.0);
//     scaler.step(opt);                // opt.step() unless a grad is not finite
//     scaler.update();                 // grow or back off the scale
//     opt.zero_grad();
//   }
//
// The scale stays a power of two (the defaults: 2^16, x2, x0.5), so scaling and unscaling are
// exact: without overflow, training with the scaler gives bit-identical parameters to training
// without it. Finding a non-finite grad reads one value per dtype back to the host (a
// synchronisation, so step() cannot be captured in a CUDA graph: tg::CaptureError).
#pragma once
#include <cstdint>

#include "../../core/tensor.h"
#include "optimizer.h"

namespace tg::nn {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // after growth_interval clean steps
  double backoff_factor = 0.5;  // after a step with a non-finite grad
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: scale() returns the loss, step() is opt.step(), update() nothing
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale (recorded on the tape like any multiplication, so backward yields scaled grads).
  Tensor scale(const Tensor& loss) const;
  // Divides the grads of opt's parameters by the scale (replacing each grad by the quotient)
  // and notes whether any is infinite or NaN. At most once between two update() calls.
  void unscale_(Optimizer& opt);
  // Unscales if unscale_ was not called, then runs opt.step() when every grad is finite.
  // Returns whether the step ran.
  bool step(Optimizer& opt);
  // After step(): halves the scale if the step was skipped, else counts a clean step and grows
  // the scale after growth_interval of them. Ends the iteration (unscale_ may run again).
  void update();

  double get_scale() const { return scale_; }
  bool enabled() const { return options_.enabled; }
  // Clean steps since the last growth or backoff.
  int64_t growth_tracker() const { return growth_tracker_; }
  // For checkpoints: restores the scale and the tracker (both checked: scale finite and > 0,
  // tracker >= 0).
  void load_state(double scale, int64_t growth_tracker);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;   // unscale_ ran this iteration
  bool found_inf_ = false;  // ... and saw a non-finite grad
  bool stepped_ = false;    // step() ran this iteration
};

}  // namespace tg::nn
