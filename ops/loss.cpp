#include "ops/loss.h"

#include <cmath>

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/half_compute.h"
#if TG_CUDA
#include "ops/cuda/loss.h"
#endif

namespace tg {

void check_mse_buffers(const char* op, const Tensor& pred, const Tensor& target, const Tensor& scalar) {
  check_same_device_dtype(op, pred, target);
  check_same_device_dtype(op, pred, scalar);
  TG_CHECK_AS(ShapeError, pred.shape() == target.shape(), op, ": prediction ", pred.shape(), " and target ",
              target.shape(), " differ");
  TG_CHECK_AS(ShapeError, scalar.numel() == 1, op, ": the loss and its gradient hold one element, got ", describe(scalar));
}

void check_cross_entropy_buffers(const char* op, const Tensor& logits, const Tensor& targets,
                                 const Tensor& lse, const Tensor& scalar) {
  check_same_device_dtype(op, logits, scalar);
  TG_CHECK(lse.defined() && lse.dtype() == DType::f64 && lse.device() == logits.device(), op,
           ": lse must be f64 on ", logits.device(), ", got ", describe(lse));
  TG_CHECK(targets.defined() && targets.dtype() == DType::i64 && targets.device() == logits.device(),
           op, ": targets must be i64 on ", logits.device(), ", got ", describe(targets));
  TG_CHECK_AS(ShapeError, logits.dim() == 2 && targets.shape() == Shape({logits.size(0)}) && lse.shape() == targets.shape(),
              op, ": logits ", logits.shape(), ", targets ", targets.shape(), " and lse ", lse.shape(),
              " do not fit (N, classes), (N), (N)");
  TG_CHECK_AS(ShapeError, scalar.numel() == 1, op, ": the loss and its gradient hold one element, got ", describe(scalar));
}

void check_mse_backward_buffers(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                                const Tensor& pred, const Tensor& target) {
  check_mse_buffers("mse_loss_backward", pred, target, grad_out);
  for (const Tensor* d : {&dpred, &dtarget})
    TG_CHECK(!d->defined() || (d->shape() == pred.shape() && d->dtype() == pred.dtype() && d->device() == pred.device()),
             "mse_loss_backward: gradient buffer ", describe(*d), " does not match ", describe(pred));
}

void check_cross_entropy_backward_buffers(const Tensor& dlogits, const Tensor& grad_out, const Tensor& logits,
                                          const Tensor& targets, const Tensor& lse) {
  check_cross_entropy_buffers("cross_entropy_backward", logits, targets, lse, grad_out);
  TG_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == logits.dtype() &&
               dlogits.device() == logits.device(),
           "cross_entropy_backward: dlogits ", describe(dlogits), " does not match logits ", describe(logits));
}

// Profiler costs (core/profiler.h), per element of the prediction. mse: forward 3 FLOPs
// (sub, square, sum), backward 3 per grad asked for (sub, times 2/n, times the seed).
// cross_entropy: forward 4 (max, sub, exp, sum), backward 3 (exp, sub, scale). The
// pointwise losses: 4 forward, 4 per grad backward. Bytes: inputs read once, outputs (and
// the grads asked for) written once.
static profile::OpInfo loss_info(std::initializer_list<const Tensor*> in, int64_t elements, double per, double written) {
  return {std::vector<const Tensor*>(in), per * static_cast<double>(elements), profile::bytes_of(in) + written};
}
// Backward of a loss of (pred, target): the grads `needs` asks for, each of pred's shape.
static profile::OpInfo loss_backward_info(const BackwardArgs& a, double per) {
  const Tensor &x = a.saved[0], &y = a.saved[1];
  const int grads = int(a.needs_grad[0]) + int(a.needs_grad[1]);
  return loss_info({&a.grad_outputs[0], &x, &y}, x.numel() * grads, per, grads * static_cast<double>(x.nbytes()));
}

Tensor mse_loss(const Tensor& pred_in, const Tensor& target_in) {
  const Tensor pred = autocast_f32(pred_in);  // f32 inside an Autocast scope (core/autocast.h)
  const Tensor target = autocast_f32(target_in);  // f32 inside an Autocast scope (core/autocast.h)
  check_same_device_dtype("mse_loss", pred, target);
  TG_CHECK_AS(ShapeError, pred.shape() == target.shape(), "mse_loss: prediction ", pred.shape(), " and target ",
              target.shape(), " differ");
  TG_CHECK(pred.numel() > 0, "mse_loss: the mean of an empty prediction ", describe(pred), " is undefined");
  profile::OpScope scope("mse_loss", [&] {
    return loss_info({&pred, &target}, pred.numel(), 3, static_cast<double>(dtype_size(pred.dtype())));
  });
  Tensor out = Tensor::empty(Shape{}, {.dtype = pred.dtype(), .device = pred.device()});
  TG_DISPATCH(pred.device(), mse_loss_forward(out, pred, target));
  if (should_record({pred, target})) {
    record("mse_loss", {pred, target}, {out}, {pred, target}, [](const BackwardArgs& args) {
      profile::OpScope scope("mse_loss (backward)", [&] { return loss_backward_info(args, 3); });
      const Tensor &p = args.saved[0], &t = args.saved[1];
      const TensorOptions o{.dtype = p.dtype(), .device = p.device()};
      Tensor dpred, dtarget;
      if (args.needs_grad[0]) dpred = Tensor::empty(p.shape(), o);
      if (args.needs_grad[1]) dtarget = Tensor::empty(t.shape(), o);
      TG_DISPATCH(p.device(), mse_loss_backward(dpred, dtarget, args.grad_outputs[0], p, t));
      return std::vector<Tensor>{dpred, dtarget};
    });
  }
  return out;
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets) {
  const Tensor logits = autocast_f32(logits_in);  // f32 inside an Autocast scope (core/autocast.h)
  check_floating("cross_entropy", logits);
  TG_CHECK(targets.defined(), "cross_entropy: targets is an undefined tensor");
  TG_CHECK_AS(ShapeError, logits.dim() == 2, "cross_entropy: logits must be (N, classes), got ", describe(logits));
  TG_CHECK_AS(DTypeError, targets.dtype() == DType::i64, "cross_entropy: targets must be i64 class indices, got ",
              describe(targets));
  TG_CHECK_AS(DeviceError, targets.device() == logits.device(), "cross_entropy: logits ", describe(logits),
              " and targets ", describe(targets), " are on different devices");
  const int64_t N = logits.size(0), classes = logits.size(1);
  TG_CHECK_AS(ShapeError, targets.dim() == 1 && targets.size(0) == N, "cross_entropy: logits ", logits.shape(), " have ", N,
              " rows but targets ", targets.shape(), " is not a vector of ", N, " class indices");
  TG_CHECK(N > 0 && classes > 0, "cross_entropy: empty logits ", describe(logits));
  // Target values: on the CPU they are checked here, before anything runs. On the GPU, a
  // check here would copy them to the host and wait for the device at every call (a sync per
  // training step), so the kernel checks them: a bad target makes the loss NaN and is
  // reported by the next cross_entropy on that device or by check_errors (ops/cuda/loss.cu).
  // Either way no kernel reads out of bounds.
  if (logits.device().is_cpu()) {
    const int64_t* t = targets.data<int64_t>();
    for (int64_t i = 0; i < N; ++i)
      TG_CHECK(t[i] >= 0 && t[i] < classes, "cross_entropy: target ", t[i], " at row ", i,
               " is out of range [0, ", classes, ") for logits ", logits.shape());
  }

  profile::OpScope scope("cross_entropy", [&] {
    return loss_info({&logits, &targets}, logits.numel(), 4, static_cast<double>(dtype_size(logits.dtype()) + 8 * N));
  });
  const TensorOptions opts{.dtype = logits.dtype(), .device = logits.device()};
  Tensor out = Tensor::empty(Shape{}, opts);
  Tensor lse = Tensor::empty({N}, {.dtype = DType::f64, .device = logits.device()});
  TG_DISPATCH(logits.device(), cross_entropy_forward(out, lse, logits, targets));
  if (should_record({logits})) {
    record("cross_entropy", {logits, targets}, {out}, {logits, targets, lse}, [](const BackwardArgs& args) {
      const Tensor &x = args.saved[0], &tgt = args.saved[1], &lse = args.saved[2];
      profile::OpScope scope("cross_entropy (backward)", [&] {
        return loss_info({&args.grad_outputs[0], &x, &tgt, &lse}, x.numel(), 3, static_cast<double>(x.nbytes()));
      });
      Tensor dlogits;
      if (args.needs_grad[0]) {
        dlogits = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
        TG_DISPATCH(x.device(), cross_entropy_backward(dlogits, args.grad_outputs[0], x, tgt, lse));
      }
      return std::vector<Tensor>{dlogits, Tensor()};
    });
  }
  return out;
}

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::mean: return "mean";
    case Reduction::sum: return "sum";
    case Reduction::none: return "none";
  }
  return "unknown";
}

const char* pointwise_loss_name(PointwiseLoss kind) {
  switch (kind) {
    case PointwiseLoss::bce_with_logits: return "binary_cross_entropy_with_logits";
    case PointwiseLoss::l1: return "l1_loss";
    case PointwiseLoss::smooth_l1: return "smooth_l1_loss";
    case PointwiseLoss::huber: return "huber_loss";
  }
  return "pointwise_loss";
}

namespace {

const char* pointwise_loss_backward_name(PointwiseLoss kind) {  // the profiler's name of its backward
  switch (kind) {
    case PointwiseLoss::bce_with_logits: return "binary_cross_entropy_with_logits (backward)";
    case PointwiseLoss::l1: return "l1_loss (backward)";
    case PointwiseLoss::smooth_l1: return "smooth_l1_loss (backward)";
    case PointwiseLoss::huber: return "huber_loss (backward)";
  }
  return "pointwise_loss (backward)";
}

// The loss's shape: [] when reduced, else pred's.
Shape pointwise_out_shape(const Tensor& pred, Reduction r) { return r == Reduction::none ? pred.shape() : Shape{}; }

void check_pointwise_params(const char* op, const PointwiseLossParams& p) {
  TG_CHECK(p.reduction == Reduction::mean || p.reduction == Reduction::sum || p.reduction == Reduction::none, op,
           ": unknown reduction ", static_cast<int>(p.reduction));
  if (p.kind == PointwiseLoss::smooth_l1)
    TG_CHECK(std::isfinite(p.beta) && p.beta >= 0, op, ": beta ", p.beta, " must be finite and >= 0");
  if (p.kind == PointwiseLoss::huber)
    TG_CHECK(std::isfinite(p.beta) && p.beta > 0, op, ": delta ", p.beta, " must be finite and > 0");
}

}  // namespace

void check_pointwise_loss_buffers(const char* op, const Tensor& out, const Tensor& pred, const Tensor& target,
                                  const PointwiseLossParams& p) {
  check_pointwise_params(op, p);
  check_floating(op, pred);
  check_same_device_dtype(op, pred, target);
  check_same_device_dtype(op, pred, out);
  TG_CHECK_AS(ShapeError, pred.shape() == target.shape(), op, ": prediction ", pred.shape(), " and target ",
              target.shape(), " differ");
  TG_CHECK_AS(ShapeError, out.shape() == pointwise_out_shape(pred, p.reduction), op, ": with reduction '",
              reduction_name(p.reduction), "' the loss and its gradient are ", pointwise_out_shape(pred, p.reduction),
              ", got ", describe(out));
}

void check_pointwise_loss_backward_buffers(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                                           const Tensor& pred, const Tensor& target, const PointwiseLossParams& p) {
  const std::string op = std::string(pointwise_loss_name(p.kind)) + "_backward";
  check_pointwise_loss_buffers(op.c_str(), grad_out, pred, target, p);
  for (const Tensor* d : {&dpred, &dtarget})
    TG_CHECK(!d->defined() || (d->shape() == pred.shape() && d->dtype() == pred.dtype() && d->device() == pred.device()),
             op, ": gradient buffer ", describe(*d), " does not match ", describe(pred));
}

namespace {

Tensor pointwise_loss(const Tensor& pred_in, const Tensor& target_in, const PointwiseLossParams& p) {
  const Tensor pred = autocast_f32(pred_in);  // f32 inside an Autocast scope (core/autocast.h)
  const Tensor target = autocast_f32(target_in);  // f32 inside an Autocast scope (core/autocast.h)
  const char* op = pointwise_loss_name(p.kind);
  check_pointwise_params(op, p);
  check_floating(op, pred);
  check_same_device_dtype(op, pred, target);
  TG_CHECK_AS(ShapeError, pred.shape() == target.shape(), op, ": ",
              p.kind == PointwiseLoss::bce_with_logits ? "logits " : "prediction ", pred.shape(), " and target ",
              target.shape(), " differ");
  TG_CHECK(p.reduction != Reduction::mean || pred.numel() > 0, op, ": the mean of an empty prediction ",
           describe(pred), " is undefined");
  const Shape out_shape = pointwise_out_shape(pred, p.reduction);
  profile::OpScope scope(op, [&] {
    return loss_info({&pred, &target}, pred.numel(), 4, static_cast<double>(out_shape.numel() * dtype_size(pred.dtype())));
  });
  Tensor out = Tensor::empty(out_shape, {.dtype = pred.dtype(), .device = pred.device()});
  TG_DISPATCH(pred.device(), pointwise_loss_forward(out, pred, target, p));
  if (should_record({pred, target})) {
    record(op, {pred, target}, {out}, {pred, target}, [p](const BackwardArgs& args) {
      profile::OpScope scope(pointwise_loss_backward_name(p.kind), [&] { return loss_backward_info(args, 4); });
      const Tensor &x = args.saved[0], &y = args.saved[1];
      const TensorOptions o{.dtype = x.dtype(), .device = x.device()};
      Tensor dpred, dtarget;
      if (args.needs_grad[0]) dpred = Tensor::empty(x.shape(), o);
      if (args.needs_grad[1]) dtarget = Tensor::empty(y.shape(), o);
      TG_DISPATCH(x.device(), pointwise_loss_backward(dpred, dtarget, args.grad_outputs[0], x, y, p));
      return std::vector<Tensor>{dpred, dtarget};
    });
  }
  return out;
}

}  // namespace

Tensor binary_cross_entropy_with_logits(const Tensor& logits_in, const Tensor& target_in, Reduction reduction) {
  const Tensor logits = autocast_f32(logits_in);  // f32 inside an Autocast scope (core/autocast.h)
  const Tensor target = autocast_f32(target_in);  // f32 inside an Autocast scope (core/autocast.h)
  return pointwise_loss(logits, target, {.kind = PointwiseLoss::bce_with_logits, .reduction = reduction});
}

Tensor l1_loss(const Tensor& pred, const Tensor& target, Reduction reduction) {
  return pointwise_loss(pred, target, {.kind = PointwiseLoss::l1, .reduction = reduction});
}

Tensor smooth_l1_loss(const Tensor& pred, const Tensor& target, SmoothL1Options o) {
  return pointwise_loss(pred, target, {.kind = PointwiseLoss::smooth_l1, .reduction = o.reduction, .beta = o.beta});
}

Tensor huber_loss(const Tensor& pred_in, const Tensor& target_in, HuberOptions o) {
  const Tensor pred = autocast_f32(pred_in);  // f32 inside an Autocast scope (core/autocast.h)
  const Tensor target = autocast_f32(target_in);  // f32 inside an Autocast scope (core/autocast.h)
  return pointwise_loss(pred, target, {.kind = PointwiseLoss::huber, .reduction = o.reduction, .beta = o.delta});
}

void check_errors(Device d) {
  if (!d.is_cuda()) return;  // the CPU ops validate everything before they run
#if TG_CUDA
  synchronize(d);
  cuda::check_target_errors(d.index, /*wait=*/true);
#endif
}

}  // namespace tg
