// The unary family's public functions: validation, device dispatch, the tape entry.
#include "ops/unary.h"

#include <string>

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/cpu/unary_kernels.h"
#include "ops/dispatch.h"
#include "ops/half_compute.h"
#if TG_CUDA
#include "ops/cuda/unary_kernels.h"
#endif

namespace tg {

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::pow: return "pow";
    case UnaryOp::abs: return "abs";
    case UnaryOp::clamp: return "clamp";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::gelu: return "gelu";
    case UnaryOp::silu: return "silu";
    case UnaryOp::leaky_relu: return "leaky_relu";
  }
  return "unary";
}

namespace {

// Profiler costs (core/profiler.h): FLOPs per element {forward, backward}, a transcendental
// (exp, log, tanh, erf) counted as one; bytes: x (or dy and the saved tensor) read once,
// the result written once.
struct UnaryCost {
  double forward, backward;
  const char* backward_name;
};
UnaryCost unary_cost(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp: return {1, 1, "exp (backward)"};            // dy * y
    case UnaryOp::log: return {1, 1, "log (backward)"};            // dy / x
    case UnaryOp::sqrt: return {1, 2, "sqrt (backward)"};          // dy * 0.5 / y
    case UnaryOp::pow: return {1, 3, "pow (backward)"};            // dy * e * x^(e-1)
    case UnaryOp::abs: return {1, 1, "abs (backward)"};
    case UnaryOp::clamp: return {2, 1, "clamp (backward)"};
    case UnaryOp::sigmoid: return {3, 3, "sigmoid (backward)"};    // 1 / (1 + exp(-x)); dy * y * (1 - y)
    case UnaryOp::tanh: return {1, 3, "tanh (backward)"};          // dy * (1 - y^2)
    case UnaryOp::gelu: return {8, 12, "gelu (backward)"};         // x * Phi(x), and its derivative
    case UnaryOp::silu: return {4, 7, "silu (backward)"};          // x * sigmoid(x)
    case UnaryOp::leaky_relu: return {1, 1, "leaky_relu (backward)"};
  }
  return {1, 1, "unary (backward)"};
}

}  // namespace

bool unary_saves_output(UnaryOp op) {
  return op == UnaryOp::exp || op == UnaryOp::sqrt || op == UnaryOp::sigmoid || op == UnaryOp::tanh;
}

void check_unary_params(const UnaryParams& p) {
  TG_CHECK(p.op != UnaryOp::clamp || p.min.has_value() || p.max.has_value(),
           "clamp: at least one of min and max must be given");
}

void check_unary_buffers(const char* op, const Tensor& out, const Tensor& x) {
  check_same_device_dtype(op, out, x);
  TG_CHECK_AS(ShapeError, out.shape() == x.shape(), op, ": output ", describe(out), " does not match input ",
              describe(x));
}

void check_unary_backward_buffers(const char* op, const Tensor& dx, const Tensor& dy, const Tensor& saved) {
  check_same_device_dtype(op, dy, saved);
  check_same_device_dtype(op, dx, saved);
  TG_CHECK_AS(ShapeError, dy.shape() == saved.shape() && dx.shape() == saved.shape(), op, ": gradient ",
              describe(dy), " and gradient buffer ", describe(dx), " do not match the saved tensor ",
              describe(saved));
}

Tensor unary(const Tensor& x, const UnaryParams& p) {
  const char* name = unary_name(p.op);
  if (any_half(x)) {
    check_unary_params(p);
    return compute_in_f32(name, {x}, [&p](const std::vector<Tensor>& v) { return unary(v[0], p); });
  }
  check_floating(name, x);
  check_unary_params(p);
  profile::OpScope scope(name, [&] {
    return profile::OpInfo{{&x}, unary_cost(p.op).forward * static_cast<double>(x.numel()), 2.0 * x.nbytes()};
  });
  Tensor out = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  TG_DISPATCH(x.device(), unary(out, x, p));
  if (should_record({x})) {
    // Ops whose derivative is a function of y save y (kept alive by the tape anyway), so
    // the input can be freed after the forward.
    const Tensor& saved = unary_saves_output(p.op) ? out : x;
    record(name, {x}, {out}, {saved}, [p](const BackwardArgs& args) {
      const Tensor &dy = args.grad_outputs[0], &s = args.saved[0];
      profile::OpScope scope(unary_cost(p.op).backward_name, [&] {
        return profile::OpInfo{{&dy, &s}, unary_cost(p.op).backward * static_cast<double>(dy.numel()), 3.0 * dy.nbytes()};
      });
      return std::vector<Tensor>{unary_backward(args.grad_outputs[0], args.saved[0], p)};
    });
  }
  return out;
}

Tensor unary_backward(const Tensor& dy, const Tensor& saved, const UnaryParams& p) {
  profile::OpScope scope("unary_backward", [&] {
    return profile::OpInfo{{&dy, &saved}, unary_cost(p.op).backward * static_cast<double>(dy.numel()), 3.0 * dy.nbytes()};
  });
  const std::string name = std::string(unary_name(p.op)) + "_backward";
  check_unary_params(p);
  check_same_device_dtype(name.c_str(), dy, saved);
  TG_CHECK_AS(ShapeError, dy.shape() == saved.shape(), name, ": gradient ", describe(dy),
              " does not match the saved tensor ", describe(saved));
  Tensor dx = Tensor::empty(saved.shape(), {.dtype = saved.dtype(), .device = saved.device()});
  TG_DISPATCH(saved.device(), unary_backward(dx, dy, saved, p));
  return dx;
}

Tensor exp(const Tensor& x) { return unary(x, {.op = UnaryOp::exp}); }
Tensor log(const Tensor& x) { return unary(x, {.op = UnaryOp::log}); }
Tensor sqrt(const Tensor& x) { return unary(x, {.op = UnaryOp::sqrt}); }
Tensor pow(const Tensor& x, double exponent) { return unary(x, {.op = UnaryOp::pow, .exponent = exponent}); }
Tensor abs(const Tensor& x) { return unary(x, {.op = UnaryOp::abs}); }
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  return unary(x, {.op = UnaryOp::clamp, .min = min, .max = max});
}
Tensor sigmoid(const Tensor& x) { return unary(x, {.op = UnaryOp::sigmoid}); }
Tensor tanh(const Tensor& x) { return unary(x, {.op = UnaryOp::tanh}); }
Tensor gelu(const Tensor& x, GeluApproximate approximate) {
  return unary(x, {.op = UnaryOp::gelu, .approximate = approximate});
}
Tensor silu(const Tensor& x) { return unary(x, {.op = UnaryOp::silu}); }
Tensor leaky_relu(const Tensor& x, double negative_slope) {
  return unary(x, {.op = UnaryOp::leaky_relu, .negative_slope = negative_slope});
}

}  // namespace tg
