#include "ops/norm.h"

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/half_compute.h"
#if TG_CUDA
#include "ops/cuda/norm.h"
#endif

namespace tg {

namespace {

// A half x with f32 statistics: what the CUDA kernels read under Autocast.
bool half_x_with_f32_values(const Tensor& x, const Tensor& mean) {
  return x.defined() && mean.defined() && is_half(x.dtype()) && mean.dtype() == DType::f32;
}

// x against the statistics: the same dtype and device, or a half x on the GPU with f32 ones.
void check_group_norm_x(const char* op, const Tensor& x, const Tensor& mean) {
  if (!half_x_with_f32_values(x, mean)) return check_same_device_dtype(op, x, mean);
  check_floating(op, mean);
  TG_CHECK_AS(DeviceError, x.device() == mean.device(), op, ": tensors on different devices: ", describe(x), " and ",
              describe(mean));
  TG_CHECK_AS(DTypeError, x.device().is_cuda(), op, ": a ", dtype_name(x.dtype()),
              " input with f32 statistics is read by the CUDA kernels only; on the CPU give an f32 input (",
              describe(x), ")");
}

}  // namespace

void check_group_norm_buffers(const char* op, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& gamma, const Tensor& beta, const GroupNormProblem& p) {
  TG_CHECK(p.N >= 0 && p.C > 0 && p.HW > 0 && p.groups > 0 && p.C % p.groups == 0, op,
           ": invalid problem N=", p.N, " C=", p.C, " HW=", p.HW, " groups=", p.groups);
  check_eps(op, p.eps);
  check_group_norm_x(op, x, mean);
  check_same_device_dtype(op, mean, rstd);
  TG_CHECK_AS(ShapeError, x.numel() == p.N * p.C * p.HW, op, ": ", describe(x), " does not hold N*C*HW = ",
              p.N, "*", p.C, "*", p.HW, " elements");
  TG_CHECK_AS(ShapeError, mean.numel() == p.N * p.groups && rstd.numel() == p.N * p.groups, op, ": mean ",
              mean.shape(), " and rstd ", rstd.shape(), " must hold N*groups = ", p.N * p.groups, " elements");
  for (const Tensor* t : {&gamma, &beta}) {
    if (!t->defined()) continue;
    check_same_device_dtype(op, mean, *t);
    TG_CHECK_AS(ShapeError, t->numel() == p.C, op, ": per-channel parameter ", t->shape(), " does not match C=", p.C);
  }
}

void check_group_norm_forward_buffers(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                      const Tensor& gamma, const Tensor& beta, const GroupNormProblem& p,
                                      const Tensor& residual) {
  check_group_norm_buffers("group_norm_forward", x, mean, rstd, gamma, beta, p);
  // y and the residual hold values: the statistics' dtype (x's, or f32 for a half x).
  TG_CHECK(y.shape() == x.shape() && y.dtype() == mean.dtype() && y.device() == x.device(),
           "group_norm_forward: output ", describe(y), " does not match input ", describe(x), " and mean ",
           describe(mean));
  TG_CHECK(!residual.defined() || (residual.numel() == x.numel() && residual.dtype() == mean.dtype() &&
                                   residual.device() == x.device()),
           "group_norm_forward: residual ", describe(residual), " does not match input ", describe(x));
}

void check_group_norm_backward_buffers(const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                                       const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, const GroupNormProblem& p,
                                       const Tensor& y) {
  check_group_norm_buffers("group_norm_backward", x, mean, rstd, gamma, Tensor(), p);
  // dx is x's dtype; dy, y and the parameter gradients the statistics' (the forward's y).
  const DType values = mean.dtype();
  TG_CHECK(dy.shape() == x.shape() && dy.dtype() == values && dy.device() == x.device(),
           "group_norm_backward: gradient ", describe(dy), " does not match input ", describe(x), " and mean ",
           describe(mean));
  TG_CHECK(!dx.defined() || (dx.shape() == x.shape() && dx.dtype() == x.dtype() && dx.device() == x.device()),
           "group_norm_backward: dx ", describe(dx), " does not match input ", describe(x));
  for (const Tensor* t : {&dgamma, &dbeta})
    TG_CHECK(!t->defined() || (t->numel() == p.C && t->dtype() == values && t->device() == x.device()),
             "group_norm_backward: parameter gradient ", describe(*t), " does not match C=", p.C);
  TG_CHECK(!p.relu || (y.defined() && y.shape() == x.shape() && y.dtype() == values && y.device() == x.device()),
           "group_norm_backward: with the ReLU, the forward's output ", describe(y), " must match input ", describe(x));
}

// Profiler costs (core/profiler.h). Forward: 7 FLOPs per element (sum and sum of squares: 3;
// (x - mean) * rstd * gamma + beta: 4); bytes: x, gamma, beta read; y, mean, rstd written.
// Backward: 8 FLOPs per element (the two reductions over dy and dy * x-hat, and dx);
// bytes: dy, x, gamma, mean, rstd read; dx, dgamma, dbeta written.
static profile::OpInfo norm_info(std::initializer_list<const Tensor*> in, const Tensor& x, double per, double written) {
  return {std::vector<const Tensor*>(in), per * static_cast<double>(x.numel()), profile::bytes_of(in) + written};
}

namespace {

// dx, dgamma and dbeta as `needs` asks (the first three inputs: x, gamma, beta), from dy and the
// saved x, gamma, mean, rstd (and with p.relu the forward's output ys, which masks dy).
std::vector<Tensor> group_norm_grads(const Tensor& dy, const Tensor& xs, const Tensor& g, const Tensor& m,
                                     const Tensor& r, const Tensor& ys, const std::vector<bool>& needs,
                                     const GroupNormProblem& p) {
  // dx in x's dtype (a half x's gradient rounded once); the parameters' in the values' (mean's).
  const TensorOptions o{.dtype = m.dtype(), .device = xs.device()};
  Tensor dx, dgamma, dbeta;
  if (needs[0]) dx = Tensor::empty(xs.shape(), {.dtype = xs.dtype(), .device = xs.device()});
  if (needs[1]) dgamma = Tensor::empty({p.C}, o);
  if (needs[2]) dbeta = Tensor::empty({p.C}, o);
  if (dx.defined() || dgamma.defined() || dbeta.defined())
    TG_DISPATCH(xs.device(), group_norm_backward(dx, dgamma, dbeta, dy, xs, g, m, r, p, ys));
  return {dx, dgamma, dbeta};
}

// group_norm, group_norm_relu and group_norm_add_relu: `op` names the op in errors, the tape
// and the profiler; `residual` (undefined but for group_norm_add_relu) is added before the ReLU.
// Inside an Autocast scope the op computes in f32 and returns f32 (core/autocast.h): a half x
// on the GPU is read as it is (the kernels widen it exactly on load, and round its gradient
// once to its type: the values and gradients of an f32 copy, without the copy's passes over
// the activation); elsewhere a half x gets a recorded f32 copy.
Tensor group_norm_op(const char* op, const Tensor& x_in, const Tensor& gamma, const Tensor& beta, int64_t groups,
                     double eps, bool relu, const Tensor& residual_in = Tensor()) {
  const bool reads_half = autocast_enabled() && x_in.defined() && is_half(x_in.dtype()) && x_in.device().is_cuda();
  const Tensor x = reads_half ? x_in : autocast_f32(x_in);
  if (!reads_half) check_floating(op, x);
  const DType values = reads_half ? DType::f32 : x.dtype();  // y's, the statistics' and the parameters'
  // A parameter or residual: on x's device, of the values' dtype.
  auto check_values = [&](const char* name, const Tensor& t) {
    check_floating(op, t);
    TG_CHECK_AS(DeviceError, t.device() == x.device(), op, ": tensors on different devices: ", describe(x), " and ",
                name, " ", describe(t));
    TG_CHECK_AS(DTypeError, t.dtype() == values, op, ": dtypes differ: ", describe(x), " and ", name, " ",
                describe(t));
  };
  TG_CHECK_AS(ShapeError, x.dim() >= 3, op, ": input must be (N, C, *) with at least 3 dims, got ", describe(x));
  const int64_t N = x.size(0), C = x.size(1);
  TG_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
  TG_CHECK_AS(ShapeError, C > 0 && C % groups == 0, op, ": ", C, " channels are not divisible into ", groups,
              " groups");
  check_eps(op, eps);
  const char* names[2] = {"gamma", "beta"};
  const Tensor* params[2] = {&gamma, &beta};
  for (int i = 0; i < 2; ++i) {
    if (!params[i]->defined()) continue;
    check_values(names[i], *params[i]);
    TG_CHECK_AS(ShapeError, params[i]->shape() == Shape({C}), op, ": ", names[i], " ", params[i]->shape(),
                " does not match the ", C, " channels of input ", x.shape(), " (expected [", C, "])");
  }
  int64_t HW = 1;
  for (int64_t d = 2; d < x.dim(); ++d) HW *= x.size(d);
  TG_CHECK_AS(ShapeError, HW > 0, op, ": input ", x.shape(), " has an empty spatial extent");
  const Tensor residual = residual_in.defined() ? autocast_f32(residual_in) : Tensor();
  if (residual.defined()) {
    check_values("residual", residual);
    TG_CHECK_AS(ShapeError, residual.shape() == x.shape(), op, ": residual ", residual.shape(),
                " does not match input ", x.shape());
  }

  const GroupNormProblem p{.N = N, .C = C, .HW = HW, .groups = groups, .eps = eps, .relu = relu};
  profile::OpScope scope(op, [&] {
    const double written = static_cast<double>((x.numel() + 2 * N * groups) * dtype_size(values));
    return norm_info({&x, &gamma, &beta, &residual}, x, 7, written);
  });
  const TensorOptions opts{.dtype = values, .device = x.device()};
  Tensor y = Tensor::empty(x.shape(), opts);
  Tensor mean = Tensor::empty({N, groups}, opts), rstd = Tensor::empty({N, groups}, opts);
  TG_DISPATCH(x.device(), group_norm_forward(y, mean, rstd, x, gamma, beta, p, residual));
  if (residual.defined()) {
    // The backward as the three ops': the ReLU's mask (which is also the residual's gradient),
    // then group_norm's kernels on the masked gradient.
    if (should_record({x, gamma, beta, residual})) {
      GroupNormProblem plain = p;
      plain.relu = false;
      record(op, {x, gamma, beta, residual}, {y}, {x, gamma, mean, rstd, y}, [plain](const BackwardArgs& args) {
        const Tensor &xs = args.saved[0], &g = args.saved[1], &m = args.saved[2], &r = args.saved[3];
        const Tensor masked = relu_backward(args.grad_outputs[0], args.saved[4]);
        profile::OpScope scope("group_norm_add_relu (backward)", [&] {
          return norm_info({&masked, &xs, &g, &m, &r}, xs, 8, static_cast<double>(xs.nbytes()));
        });
        std::vector<Tensor> grads = group_norm_grads(masked, xs, g, m, r, Tensor(), args.needs_grad, plain);
        grads.push_back(args.needs_grad[3] ? masked : Tensor());
        return grads;
      });
    }
    return y;
  }

  if (should_record({x, gamma, beta})) {
    // Saves the statistics, not the normalized tensor: backward recomputes x-hat from x. With
    // the ReLU, also the output, whose zeros mask the gradient (as the relu op saves its own).
    std::vector<Tensor> saved{x, gamma, mean, rstd};
    if (relu) saved.push_back(y);
    record(op, {x, gamma, beta}, {y}, saved, [p](const BackwardArgs& args) {
      const Tensor& dy = args.grad_outputs[0];
      const Tensor &xs = args.saved[0], &g = args.saved[1], &m = args.saved[2], &r = args.saved[3];
      const Tensor ys = p.relu ? args.saved[4] : Tensor();
      // The profiler keeps the name's pointer: a literal.
      profile::OpScope scope(p.relu ? "group_norm_relu (backward)" : "group_norm (backward)", [&] {
        const double e = static_cast<double>(dtype_size(m.dtype()));  // the parameters' gradients
        const double written = (args.needs_grad[0] ? static_cast<double>(xs.nbytes()) : 0) +
                               (args.needs_grad[1] ? p.C * e : 0) + (args.needs_grad[2] ? p.C * e : 0);
        return norm_info({&dy, &xs, &g, &m, &r, &ys}, xs, 8, written);
      });
      return group_norm_grads(dy, xs, g, m, r, ys, args.needs_grad, p);
    });
  }
  return y;
}

}  // namespace

Tensor group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t groups, double eps) {
  return group_norm_op("group_norm", x, gamma, beta, groups, eps, /*relu=*/false);
}

Tensor group_norm_relu(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t groups, double eps) {
  return group_norm_op("group_norm_relu", x, gamma, beta, groups, eps, /*relu=*/true);
}

Tensor group_norm_add_relu(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t groups,
                           const Tensor& residual, double eps) {
  TG_CHECK(residual.defined(), "group_norm_add_relu: the residual is an undefined tensor");
  return group_norm_op("group_norm_add_relu", x, gamma, beta, groups, eps, /*relu=*/true, residual);
}

}  // namespace tg
