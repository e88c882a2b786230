// softmax / log_softmax: validation, device dispatch, the tape entry.
#include "ops/softmax.h"

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

SoftmaxProblem make_softmax_problem(const char* op, const Shape& shape, int64_t dim, bool log) {
  const int64_t rank = shape.rank();
  const int64_t r = rank == 0 ? 1 : rank;  // a 0-d tensor reads as one element along dim 0
  TG_CHECK_AS(ShapeError, dim >= -r && dim < r, op, ": dim ", dim, " out of range for shape ", shape,
              " (expected in [", -r, ", ", r - 1, "])");
  SoftmaxProblem p;
  p.log = log;
  if (rank == 0) return p;
  const int64_t d = dim < 0 ? dim + rank : dim;
  for (int64_t k = 0; k < d; ++k) p.outer = checked_mul(p.outer, shape[k], op, ": shape ", shape);
  p.dim_size = shape[d];
  for (int64_t k = d + 1; k < rank; ++k) p.inner = checked_mul(p.inner, shape[k], op, ": shape ", shape);
  return p;
}

namespace {

bool fits(const Tensor& t, const SoftmaxProblem& p) {
  if (p.outer < 0 || p.dim_size < 0 || p.inner < 0) return false;
  // Checked: the problem may come from a caller of the kernels, not from t's shape.
  return checked_mul(checked_mul(p.outer, p.dim_size, "softmax: problem"), p.inner, "softmax: problem") == t.numel();
}

}  // namespace

void check_softmax_buffers(const char* op, const Tensor& out, const Tensor& x, const SoftmaxProblem& p) {
  check_same_device_dtype(op, out, x);
  TG_CHECK_AS(ShapeError, out.shape() == x.shape() && fits(x, p), op, ": output ", describe(out), " and input ",
              describe(x), " do not fit the problem (outer ", p.outer, ", dim ", p.dim_size, ", inner ", p.inner, ")");
}

void check_softmax_backward_buffers(const char* op, const Tensor& dx, const Tensor& dy, const Tensor& y,
                                    const SoftmaxProblem& p) {
  check_same_device_dtype(op, dy, y);
  check_same_device_dtype(op, dx, y);
  TG_CHECK_AS(ShapeError, dy.shape() == y.shape() && dx.shape() == y.shape() && fits(y, p), op, ": gradient ",
              describe(dy), ", gradient buffer ", describe(dx), " and output ", describe(y),
              " do not fit the problem (outer ", p.outer, ", dim ", p.dim_size, ", inner ", p.inner, ")");
}

namespace {

// Profiler costs (core/profiler.h), per element: forward 5 FLOPs (max, subtract, exp, sum,
// divide or log-subtract), backward 4 (the row's dot of dy and y: 2; subtract, multiply).
// Bytes: x (or dy and y) read once, the result written once.
constexpr double kSoftmaxFlops = 5, kSoftmaxBackwardFlops = 4;

Tensor softmax_impl(const char* op, const Tensor& x_in, int64_t dim, bool log) {
  const Tensor x = autocast_f32(x_in);  // f32 inside an Autocast scope (core/autocast.h)
  check_floating(op, x);
  const SoftmaxProblem p = make_softmax_problem(op, x.shape(), dim, log);
  profile::OpScope scope(op, [&] {
    return profile::OpInfo{{&x}, kSoftmaxFlops * static_cast<double>(x.numel()), 2.0 * x.nbytes()};
  });
  Tensor out = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  // An empty tensor may still have ~2^40 rows (outer * inner) of no elements: skip the kernels.
  if (x.numel() > 0) TG_DISPATCH(x.device(), softmax(out, x, p));
  if (should_record({x})) {
    // Both backwards need only the output.
    record(op, {x}, {out}, {out}, [dim, log](const BackwardArgs& args) {
      const Tensor &dy = args.grad_outputs[0], &y = args.saved[0];
      profile::OpScope scope(log ? "log_softmax (backward)" : "softmax (backward)", [&] {
        return profile::OpInfo{{&dy, &y}, kSoftmaxBackwardFlops * static_cast<double>(dy.numel()), 3.0 * dy.nbytes()};
      });
      return std::vector<Tensor>{softmax_backward(args.grad_outputs[0], args.saved[0], dim, log)};
    });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl("softmax", x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl("log_softmax", x, dim, true); }

Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t dim, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_same_device_dtype(op, dy, y);
  TG_CHECK_AS(ShapeError, dy.shape() == y.shape(), op, ": gradient ", describe(dy), " does not match output ",
              describe(y));
  const SoftmaxProblem p = make_softmax_problem(op, y.shape(), dim, log);
  profile::OpScope scope(op, [&] {
    return profile::OpInfo{{&dy, &y}, kSoftmaxBackwardFlops * static_cast<double>(dy.numel()), 3.0 * dy.nbytes()};
  });
  Tensor dx = Tensor::empty(y.shape(), {.dtype = y.dtype(), .device = y.device()});
  if (y.numel() > 0) TG_DISPATCH(y.device(), softmax_backward(dx, dy, y, p));  // as the forward
  return dx;
}

}  // namespace tg
