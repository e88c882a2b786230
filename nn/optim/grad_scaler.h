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
//
// Several optimizers, as PyTorch: each optimizer has its own state in an iteration
// (unscaled or not, stepped or not, and whether its own grads held a non-finite value),
// keyed by the optimizer's identity, so unscale_(a) never stands in for unscale_(b), and
// step(b) skips only when b's grads are bad. update() backs off when any optimizer's grads
// were bad, and forgets every optimizer's state.
//
// The scale must be finite and > 0 with a finite inverse (a scale below ~5.6e-309 would
// make 1 / scale infinite). Backing off never goes below such a scale: where the next
// smaller scale's inverse would overflow (or the scale would reach 0), the scale stays, and
// steps whose grads are not finite keep being skipped (step() returns false), as growth
// stops below the largest double.
#pragma once
#include <cstdint>
#include <map>

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
  // and notes whether any quotient is infinite or NaN. At most once per optimizer between
  // two update() calls, and not after step(opt). All or nothing: every grad is checked
  // first (same shape, dtype and device as its parameter, else a ShapeError, DTypeError or
  // DeviceError naming GradScaler::unscale_ and the parameter index) and every quotient is
  // computed before any grad is replaced, so a call that throws leaves the grads and the
  // scaler as they were (for that while, the grads and their quotients are both held).
  void unscale_(Optimizer& opt);
  // Unscales opt's grads if unscale_(opt) was not called, then runs opt.step() when every
  // one of them is finite. Once per optimizer between two update() calls. Returns whether
  // the step ran.
  bool step(Optimizer& opt);
  // After step() of at least one optimizer: backs off the scale if any optimizer's grads
  // were not finite, else counts a clean step and grows the scale after growth_interval of
  // them. Ends the iteration (every optimizer may be unscaled and stepped again).
  void update();

  double get_scale() const { return scale_; }
  bool enabled() const { return options_.enabled; }
  // Clean steps since the last growth or backoff.
  int64_t growth_tracker() const { return growth_tracker_; }
  // For checkpoints: restores the scale and the tracker (both checked: scale finite and > 0
  // with a finite inverse, tracker in [0, growth_interval)).
  void load_state(double scale, int64_t growth_tracker);

 private:
  // One optimizer's progress through the current iteration.
  struct OptimizerState {
    bool unscaled = false;   // unscale_ ran for it
    bool found_inf = false;  // ... and one of its unscaled grads was not finite
    bool stepped = false;    // step() ran for it
  };
  // Throws tg::Error naming `op` unless `scale` is usable: finite, > 0, finite inverse.
  static void check_scale(const char* op, const char* what, double scale);
  // Throws (ShapeError, DTypeError or DeviceError) unless every grad of opt fits its parameter.
  static void check_grads(const Optimizer& opt);
  // The scale after a backoff, or the current one where backing off would leave a scale
  // whose inverse overflows.
  double backed_off_scale() const;

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  // Keyed by identity: the optimizers unscaled or stepped since the last update().
  std::map<const Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace tg::nn
