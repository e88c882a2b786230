#include "ops/elementwise.h"

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/broadcast.h"
#include "ops/checks.h"
#include "ops/cpu/kernels.h"
#include "ops/dispatch.h"
#include "ops/half_compute.h"
#include "ops/reduce.h"
#if TG_CUDA
#include "ops/cuda/kernels.h"
#endif

namespace tg {

Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  int64_t r = std::max(a.rank(), b.rank());
  std::vector<int64_t> out(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.rank() ? 1 : a[i - (r - a.rank())];
    int64_t db = i < r - b.rank() ? 1 : b[i - (r - b.rank())];
    TG_CHECK_AS(ShapeError, da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b, " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return Shape(out);
}

BroadcastIndex make_broadcast_index(const Shape& out, const Shape& a, const Shape& b) {
  BroadcastIndex ix;
  ix.rank = static_cast<int>(out.rank());
  auto sa = contiguous_strides(a), sb = contiguous_strides(b);
  for (int d = 0; d < ix.rank; ++d) {
    ix.out_sizes[d] = out[d];
    int64_t ia = d - (out.rank() - a.rank()), ib = d - (out.rank() - b.rank());
    ix.a_strides[d] = (ia >= 0 && a[ia] != 1) ? sa[ia] : 0;
    ix.b_strides[d] = (ib >= 0 && b[ib] != 1) ? sb[ib] : 0;
  }
  return ix;
}

namespace {

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    default: return "div";
  }
}

// Profiler costs (core/profiler.h): elementwise ops are 1 FLOP per output element (relu,
// affine and its two operations counted as one); bytes: inputs read once, output written
// once. Backward, per input whose grad is needed and per gradient element: add 0 (its grad
// is the incoming one, passed on without a copy) and sub 0 for a, 1 for b (a negation);
// mul 1 (g times the other input), div 1 for a, 4 for b; plus 1 where the input was
// broadcast (the sum back to its shape). Bytes: what that reads (g, the other input) and
// writes (the grad); nothing for a grad passed on as is; relu 1 FLOP per element.
double binary_backward_cost(BinaryOp op, int input, const Tensor& g, const Shape& s, const Tensor* other,
                            double& bytes) {
  const double n = static_cast<double>(g.numel()), e = static_cast<double>(dtype_size(g.dtype()));
  const bool broadcast = s != g.shape();
  double per = 0;
  switch (op) {
    case BinaryOp::add: break;
    case BinaryOp::sub: per = input == 1 ? 1 : 0; break;
    case BinaryOp::mul: per = 1; break;
    case BinaryOp::div: per = input == 1 ? 4 : 1; break;
  }
  if (per == 0 && !broadcast) return 0;  // the gradient itself
  bytes += n * e + static_cast<double>(s.numel()) * e + (other ? static_cast<double>(other->nbytes()) : 0);
  return (per + (broadcast ? 1 : 0)) * n;
}
profile::OpInfo elementwise_info(std::initializer_list<const Tensor*> in, const Shape& out, DType dt, double per = 1) {
  const double n = static_cast<double>(out.numel());
  return {std::vector<const Tensor*>(in), per * n, profile::bytes_of(in) + n * static_cast<double>(dtype_size(dt))};
}
const char* backward_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add (backward)";
    case BinaryOp::sub: return "sub (backward)";
    case BinaryOp::mul: return "mul (backward)";
    default: return "div (backward)";
  }
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  if (any_half(a, b)) {
    // Inside an Autocast scope f32 meeting a half type computes in f32 (core/autocast.h).
    if (a.defined() && b.defined() && a.dtype() != b.dtype()) {
      const Tensor af = autocast_f32(a), bf = autocast_f32(b);
      if (!any_half(af, bf)) return binary(op, af, bf);
    }
    return compute_in_f32(name, {a, b}, [op](const std::vector<Tensor>& v) { return binary(op, v[0], v[1]); });
  }
  check_same_device_dtype(name, a, b);
  Shape out_shape = broadcast_shape(name, a.shape(), b.shape());
  profile::OpScope scope(name, [&] { return elementwise_info({&a, &b}, out_shape, a.dtype()); });
  Tensor out = Tensor::empty(out_shape, {.dtype = a.dtype(), .device = a.device()});
  TG_DISPATCH(a.device(), binary(op, out, a, b));
  if (should_record({a, b})) {
    // mul and div need their inputs; add and sub need nothing.
    std::vector<Tensor> saved;
    if (op == BinaryOp::mul || op == BinaryOp::div) saved = {a, b};
    record(name, {a, b}, {out}, saved, [op, sa = a.shape(), sb = b.shape()](const BackwardArgs& args) {
      const Tensor& g = args.grad_outputs[0];
      profile::OpScope scope(backward_name(op), [&] {
        const bool saved = !args.saved.empty();  // mul and div: the other input is read
        double bytes = 0, flops = 0;
        if (args.needs_grad[0]) flops += binary_backward_cost(op, 0, g, sa, saved ? &args.saved[1] : nullptr, bytes);
        if (args.needs_grad[1]) flops += binary_backward_cost(op, 1, g, sb, saved ? &args.saved[0] : nullptr, bytes);
        return profile::OpInfo{{&g}, flops, bytes};
      });
      Tensor ga, gb;
      switch (op) {
        case BinaryOp::add:
          if (args.needs_grad[0]) ga = sum_to(g, sa);
          if (args.needs_grad[1]) gb = sum_to(g, sb);
          break;
        case BinaryOp::sub:
          if (args.needs_grad[0]) ga = sum_to(g, sa);
          if (args.needs_grad[1]) gb = sum_to(neg(g), sb);
          break;
        case BinaryOp::mul:
          if (args.needs_grad[0]) ga = sum_to(mul(g, args.saved[1]), sa);
          if (args.needs_grad[1]) gb = sum_to(mul(g, args.saved[0]), sb);
          break;
        case BinaryOp::div: {
          const Tensor& x = args.saved[0];
          const Tensor& y = args.saved[1];
          if (args.needs_grad[0]) ga = sum_to(div(g, y), sa);
          // d(x/y)/dy = -x / y^2
          if (args.needs_grad[1]) gb = sum_to(neg(div(mul(g, x), mul(y, y))), sb);
          break;
        }
      }
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }

Tensor affine(const Tensor& a, double scale, double shift) {
  if (any_half(a))
    return compute_in_f32("affine", {a}, [=](const std::vector<Tensor>& v) { return affine(v[0], scale, shift); });
  check_floating("affine", a);
  profile::OpScope scope("affine", [&] { return elementwise_info({&a}, a.shape(), a.dtype()); });
  Tensor out = Tensor::empty(a.shape(), {.dtype = a.dtype(), .device = a.device()});
  TG_DISPATCH(a.device(), affine(out, a, scale, shift));
  if (should_record({a})) {
    record("affine", {a}, {out}, {}, [scale](const BackwardArgs& args) {
      const Tensor& g = args.grad_outputs[0];
      profile::OpScope scope("affine (backward)", [&] { return elementwise_info({&g}, g.shape(), g.dtype()); });
      return std::vector<Tensor>{affine(args.grad_outputs[0], scale, 0.0)};
    });
  }
  return out;
}

Tensor relu(const Tensor& x) {
  if (any_half(x)) return compute_in_f32("relu", {x}, [](const std::vector<Tensor>& v) { return relu(v[0]); });
  check_floating("relu", x);
  profile::OpScope scope("relu", [&] { return elementwise_info({&x}, x.shape(), x.dtype()); });
  Tensor out = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  TG_DISPATCH(x.device(), relu(out, x));
  if (should_record({x})) {
    // Saving the output instead of the input works too (y > 0 iff x > 0) and lets the
    // input be freed; the output is kept alive by the tape anyway.
    record("relu", {x}, {out}, {out}, [](const BackwardArgs& args) {
      const Tensor &g = args.grad_outputs[0], &y = args.saved[0];
      profile::OpScope scope("relu (backward)", [&] { return elementwise_info({&g, &y}, g.shape(), g.dtype()); });
      return std::vector<Tensor>{relu_backward(args.grad_outputs[0], args.saved[0])};
    });
  }
  return out;
}

Tensor relu_backward(const Tensor& dy, const Tensor& x) {
  check_same_device_dtype("relu_backward", dy, x);
  TG_CHECK_AS(ShapeError, dy.shape() == x.shape(), "relu_backward: gradient ", describe(dy), " does not match input ", describe(x));
  profile::OpScope scope("relu_backward", [&] { return elementwise_info({&dy, &x}, x.shape(), x.dtype()); });
  Tensor dx = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  TG_DISPATCH(x.device(), relu_backward(dx, dy, x));
  return dx;
}

}  // namespace tg
