// layer_norm's public function: validation, device dispatch, the tape entry.
#include "ops/layer_norm.h"

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/half_compute.h"
#if TG_CUDA
#include "ops/cuda/layer_norm.h"
#endif

namespace tg {
namespace {

// A buffer of the problem's x: same dtype and device, `count` elements.
void check_buffer(const char* op, const char* what, const Tensor& t, const Tensor& x, int64_t count) {
  check_same_device_dtype(op, x, t);
  TG_CHECK_AS(ShapeError, t.numel() == count, op, ": ", what, " ", describe(t), " must hold ", count, " elements");
}

void check_problem(const char* op, const LayerNormProblem& p) {
  TG_CHECK(p.M >= 0 && p.D > 0, op, ": invalid problem M=", p.M, " D=", p.D);
  check_eps(op, p.eps);
}

}  // namespace

void check_layer_norm_forward_buffers(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                      const Tensor& weight, const Tensor& bias, const LayerNormProblem& p) {
  const char* op = "layer_norm_forward";
  check_problem(op, p);
  check_floating(op, x);
  check_buffer(op, "input", x, x, p.M * p.D);
  check_buffer(op, "output", y, x, p.M * p.D);
  check_buffer(op, "mean", mean, x, p.M);
  check_buffer(op, "rstd", rstd, x, p.M);
  if (weight.defined()) check_buffer(op, "weight", weight, x, p.D);
  if (bias.defined()) check_buffer(op, "bias", bias, x, p.D);
}

void check_layer_norm_backward_buffers(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                       const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                       const Tensor& rstd, const LayerNormProblem& p) {
  const char* op = "layer_norm_backward";
  check_problem(op, p);
  check_floating(op, x);
  check_buffer(op, "input", x, x, p.M * p.D);
  check_buffer(op, "gradient", dy, x, p.M * p.D);
  check_buffer(op, "mean", mean, x, p.M);
  check_buffer(op, "rstd", rstd, x, p.M);
  if (dx.defined()) check_buffer(op, "dx", dx, x, p.M * p.D);
  if (weight.defined()) check_buffer(op, "weight", weight, x, p.D);
  if (dweight.defined()) check_buffer(op, "dweight", dweight, x, p.D);
  if (dbias.defined()) check_buffer(op, "dbias", dbias, x, p.D);
}

// Profiler costs (core/profiler.h), as group_norm's. Forward: 7 FLOPs per element (row sum
// and sum of squares: 3; (x - mean) * rstd * weight + bias: 4); bytes: x, weight, bias read;
// y, mean, rstd written. Backward: 8 FLOPs per element; bytes: dy, x, weight, mean, rstd
// read; the grads written.
static profile::OpInfo norm_info(std::initializer_list<const Tensor*> in, const Tensor& x, double per, double written) {
  return {std::vector<const Tensor*>(in), per * static_cast<double>(x.numel()), profile::bytes_of(in) + written};
}

Tensor layer_norm(const Tensor& x_in, const std::vector<int64_t>& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  const Tensor x = autocast_f32(x_in);  // f32 inside an Autocast scope (core/autocast.h)
  const char* op = "layer_norm";
  check_floating(op, x);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  const Shape ns(normalized_shape);
  TG_CHECK_AS(ShapeError, k > 0, op, ": normalized_shape must name at least one dim");
  TG_CHECK_AS(ShapeError, k <= x.dim(), op, ": normalized_shape ", ns, " has more dims than input ", describe(x));
  for (int64_t i = 0; i < k; ++i)
    TG_CHECK_AS(ShapeError, x.size(x.dim() - k + i) == normalized_shape[static_cast<size_t>(i)], op,
                ": normalized_shape ", ns, " does not match the trailing dims of input ", describe(x));
  check_eps(op, eps);
  const char* names[2] = {"weight", "bias"};
  const Tensor* params[2] = {&weight, &bias};
  for (int i = 0; i < 2; ++i) {
    if (!params[i]->defined()) continue;
    check_same_device_dtype(op, x, *params[i]);
    TG_CHECK_AS(ShapeError, params[i]->shape() == ns, op, ": ", names[i], " ", params[i]->shape(),
                " does not match normalized_shape ", ns);
  }
  const int64_t D = ns.numel();
  TG_CHECK_AS(ShapeError, D > 0, op, ": normalized_shape ", ns, " is empty");
  const LayerNormProblem p{.M = x.numel() / D, .D = D, .eps = eps};
  profile::OpScope scope(op, [&] {
    return norm_info({&x, &weight, &bias}, x, 7, static_cast<double>((x.numel() + 2 * p.M) * dtype_size(x.dtype())));
  });

  const TensorOptions opts{.dtype = x.dtype(), .device = x.device()};
  Tensor y = Tensor::empty(x.shape(), opts);
  Tensor mean = Tensor::empty({p.M}, opts), rstd = Tensor::empty({p.M}, opts);
  TG_DISPATCH(x.device(), layer_norm_forward(y, mean, rstd, x, weight, bias, p));

  if (should_record({x, weight, bias})) {
    // Saves the row statistics, not x-hat: backward recomputes it from x.
    record(op, {x, weight, bias}, {y}, {x, weight, mean, rstd}, [p, ns](const BackwardArgs& args) {
      const Tensor& dy = args.grad_outputs[0];
      const Tensor &xs = args.saved[0], &w = args.saved[1], &m = args.saved[2], &r = args.saved[3];
      profile::OpScope scope("layer_norm (backward)", [&] {
        const double e = static_cast<double>(dtype_size(xs.dtype()));
        const double written = (args.needs_grad[0] ? static_cast<double>(xs.numel()) * e : 0) +
                               (args.needs_grad[1] ? p.D * e : 0) + (args.needs_grad[2] ? p.D * e : 0);
        return norm_info({&dy, &xs, &w, &m, &r}, xs, 8, written);
      });
      const TensorOptions o{.dtype = xs.dtype(), .device = xs.device()};
      Tensor dx, dweight, dbias;
      if (args.needs_grad[0]) dx = Tensor::empty(xs.shape(), o);
      if (args.needs_grad[1]) dweight = Tensor::empty(ns, o);
      if (args.needs_grad[2]) dbias = Tensor::empty(ns, o);
      TG_DISPATCH(xs.device(), layer_norm_backward(dx, dweight, dbias, dy, xs, w, m, r, p));
      return std::vector<Tensor>{dx, dweight, dbias};
    });
  }
  return y;
}

}  // namespace tg
