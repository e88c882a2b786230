// The dropout family's public functions: validation, the seed, device dispatch, the tape
// entry (which saves nothing: backward regenerates the mask from the seed).
#include "ops/dropout.h"

#include <cmath>
#include <string>

#include "autograd/tape.h"
#include "core/cuda_graph.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#if TG_CUDA
#include "ops/cuda/dropout.h"
#endif

namespace tg {
namespace {

void check_p(const char* op, double p) {
  TG_CHECK(std::isfinite(p) && p >= 0.0 && p <= 1.0, op, ": dropout probability has to be between 0 and 1, but got ", p);
}

// Profiler costs (core/profiler.h): 1 FLOP per element (the masked scale; drawing the mask
// is not counted), forward and backward; bytes: x (or dy) read once, the result written once.
static profile::OpInfo dropout_info(const Tensor& in) {
  return {{&in}, static_cast<double>(in.numel()), 2.0 * static_cast<double>(in.nbytes())};
}

// `spatial` = 0 for elementwise dropout, 2 or 3 for the channel forms.
Tensor dropout_impl(const char* op, const Tensor& x, const DropoutParams& params, int spatial) {
  check_floating(op, x);
  check_p(op, params.p);
  int64_t inner = 1;
  if (spatial > 0) {
    TG_CHECK_AS(ShapeError, x.dim() == spatial + 1 || x.dim() == spatial + 2, op, ": expects a ", spatial + 2,
                "-D (batched) or ", spatial + 1, "-D (unbatched) input, got ", describe(x));
    for (int64_t d = x.dim() - spatial; d < x.dim(); ++d) inner *= x.size(d);
  }
  if (!params.training || params.p == 0.0) return x;

  const int64_t units = inner > 0 ? x.numel() / inner : 0;
  uint64_t seed = 0, offset = params.offset;
  if (params.seed) {
    seed = *params.seed;
  } else {
    const RandomDraw draw = next_random_draw(static_cast<uint64_t>(units));
    seed = draw.seed;
    offset = draw.offset;
  }
  // Under CUDA graph capture: where the kernel finds how far this stream's counters moved
  // at each replay (an explicit seed is taken to be its own stream, as nn::Dropout's is).
  const ReplayShift shift =
      x.device().is_cuda()
          ? cuda::capture_random_draw(x.device().index, {.global = !params.seed, .seed = seed}, static_cast<uint64_t>(units))
          : ReplayShift{};
  const DropoutProblem q{.units = units, .inner = inner, .p = params.p, .seed = seed, .offset = offset, .shift = shift};
  profile::OpScope scope(op, [&] { return dropout_info(x); });
  Tensor y = Tensor::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  TG_DISPATCH(x.device(), dropout_apply(y, x, q));
  if (should_record({x})) {
    record(op, {x}, {y}, {}, [q, spatial](const BackwardArgs& args) {
      const Tensor& dy = args.grad_outputs[0];
      profile::OpScope scope(spatial == 0   ? "dropout (backward)"
                             : spatial == 2 ? "dropout2d (backward)"
                                            : "dropout3d (backward)",
                             [&] { return dropout_info(dy); });
      Tensor dx = Tensor::empty(dy.shape(), {.dtype = dy.dtype(), .device = dy.device()});
      TG_DISPATCH(dy.device(), dropout_apply(dx, dy, q));
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace

void check_dropout_buffers(const Tensor& out, const Tensor& in, const DropoutProblem& q) {
  const char* op = "dropout_apply";
  check_p(op, q.p);
  check_floating(op, in);
  check_same_device_dtype(op, in, out);
  TG_CHECK(q.units >= 0 && q.inner >= 0, op, ": invalid problem units=", q.units, " inner=", q.inner);
  TG_CHECK_AS(ShapeError, in.numel() == q.units * q.inner && out.numel() == in.numel(), op, ": input ",
              describe(in), " and output ", describe(out), " must hold units*inner = ", q.units, "*", q.inner,
              " elements");
}

Tensor dropout(const Tensor& x, const DropoutParams& params) { return dropout_impl("dropout", x, params, 0); }
Tensor dropout(const Tensor& x, double p, bool training) {
  return dropout_impl("dropout", x, {.p = p, .training = training}, 0);
}
Tensor dropout2d(const Tensor& x, const DropoutParams& params) { return dropout_impl("dropout2d", x, params, 2); }
Tensor dropout3d(const Tensor& x, const DropoutParams& params) { return dropout_impl("dropout3d", x, params, 3); }

}  // namespace tg
