// conv3d_group_norm_mean: validation, dispatch to the CPU or CUDA kernels, and its one tape
// entry. The math is in ops/fused.h; the CUDA launchers choose between the fused kernels
// (y never reaches memory) and a materialized path for shapes the fused kernels do not take.
#include "ops/fused.h"

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#if TG_CUDA
#include "ops/cuda/fused.h"
#endif

namespace tg {
namespace {

constexpr const char* kOp = "conv3d_group_norm_mean";

// gamma, beta or b: undefined, or a (K) tensor on x's device with x's dtype.
void check_per_channel(const char* op, const char* name, const Tensor& t, const Tensor& x, int64_t K,
                       const Shape& w_shape) {
  if (!t.defined()) return;
  check_same_device_dtype(op, x, t);
  TG_CHECK_AS(ShapeError, t.shape() == Shape({K}), op, ": ", name, " ", describe(t), " does not match the ", K,
              " output channels of weight ", w_shape, " (expected [", K, "])");
}

}  // namespace

Conv3dGnMeanProblem make_conv3d_gn_mean_problem(const char* op, const Tensor& x, const Tensor& w,
                                                const Tensor& b, int64_t groups, double eps) {
  TG_CHECK(x.defined(), op, ": the input is an undefined tensor");
  TG_CHECK(w.defined(), op, ": the weight is an undefined tensor");
  check_same_device_dtype(op, x, w);
  TG_CHECK_AS(ShapeError, x.dim() == 5, op, ": expected a 5-D input (N, C, D, H, W), got ", describe(x));
  TG_CHECK_AS(ShapeError, w.dim() == 5, op, ": expected a 5-D weight (K, C, kd, kh, kw), got ", describe(w));
  const int64_t K = w.size(0);
  check_per_channel(op, "bias", b, x, K, w.shape());
  TG_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
  TG_CHECK_AS(ShapeError, K % groups == 0, op, ": the ", K, " output channels of weight ", w.shape(),
              " are not divisible into ", groups, " groups");
  check_eps(op, eps);
  Conv3dGnMeanProblem p;
  // Stride 1, padding 0, dilation 1: the only geometry this op has.
  p.conv = make_conv_shape(op, x.shape(), w.shape(), ConvParams{});
  p.groups = groups;
  p.eps = eps;
  p.precision = precision();
  return p;
}

// Profiler costs (core/profiler.h). Forward: the convolution, 2*N*K*C*(kernel volume)*(output
// volume) FLOPs, plus 3 per conv output for the per-channel sums and sums of squares; bytes:
// x, w, b, gamma, beta read once, the N means written. Backward: the conv is recomputed
// (one pass) where dx or dw is needed, plus one pass for each of them; bytes: x and w read,
// dx and dw written.
static double fused_conv_flops(const Conv3dGnMeanProblem& p) {
  const ConvShape& s = p.conv;
  return 2.0 * static_cast<double>(s.N) * static_cast<double>(s.K) * static_cast<double>(s.C) *
         static_cast<double>(s.kernel_volume()) * static_cast<double>(s.out_volume());
}

Tensor conv3d_group_norm_mean(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gamma,
                              const Tensor& beta, int64_t groups, double eps) {
  const Conv3dGnMeanProblem p = make_conv3d_gn_mean_problem(kOp, x, w, b, groups, eps);
  check_per_channel(kOp, "gamma", gamma, x, p.conv.K, w.shape());
  check_per_channel(kOp, "beta", beta, x, p.conv.K, w.shape());

  const int64_t N = p.conv.N, K = p.conv.K;
  profile::OpScope scope(kOp, [&] {
    const double outs = static_cast<double>(N) * static_cast<double>(K) * static_cast<double>(p.conv.out_volume());
    return profile::OpInfo{{&x, &w, &b, &gamma, &beta}, fused_conv_flops(p) + 3 * outs,
                           profile::bytes_of({&x, &w, &b, &gamma, &beta}) + static_cast<double>(N * dtype_size(x.dtype())),
                           true};
  });
  const TensorOptions stat_opts{.dtype = DType::f64, .device = x.device()};
  Tensor S1 = Tensor::empty({N, K}, stat_opts), S2 = Tensor::empty({N, K}, stat_opts);
  Tensor mean = Tensor::empty({N, groups}, stat_opts), rstd = Tensor::empty({N, groups}, stat_opts);
  Tensor out = Tensor::empty({N}, {.dtype = x.dtype(), .device = x.device()});
  TG_DISPATCH(x.device(), conv3d_gn_mean_stats(S1, S2, x, w, b, p));
  TG_DISPATCH(x.device(), conv3d_gn_mean_finish(out, mean, rstd, S1, S2, gamma, beta, p));

  if (should_record({x, w, b, gamma, beta})) {
    // Statistics, not y: backward recomputes y from x, w and b where it needs it (the conv's
    // gradients); dgamma, dbeta and db need only the statistics.
    const bool conv_grads = x.requires_grad() || w.requires_grad();
    const Tensor xs = conv_grads ? x : Tensor(), ws = conv_grads ? w : Tensor(), bs = conv_grads ? b : Tensor();
    record(kOp, {x, w, b, gamma, beta}, {out}, {xs, ws, bs, gamma, S1, S2, mean, rstd},
           [p, x_shape = x.shape(), w_shape = w.shape()](const BackwardArgs& args) {
             const Tensor& gout = args.grad_outputs[0];
             const Tensor &xs = args.saved[0], &ws = args.saved[1], &bs = args.saved[2], &gs = args.saved[3];
             profile::OpScope scope("conv3d_group_norm_mean (backward)", [&] {
               const bool dx = args.needs_grad[0], dw = args.needs_grad[1];
               const double passes = (dx || dw ? 1 : 0) + (dx ? 1 : 0) + (dw ? 1 : 0);
               const double bytes = (dx || dw ? profile::bytes_of({&xs, &ws, &bs}) : 0) +
                                    (dx ? static_cast<double>(xs.nbytes()) : 0) + (dw ? static_cast<double>(ws.nbytes()) : 0);
               return profile::OpInfo{{&gout, &xs, &ws, &bs}, passes * fused_conv_flops(p), bytes, true};
             });
             const Tensor &s1 = args.saved[4], &mu = args.saved[6], &rs = args.saved[7];
             const TensorOptions o{.dtype = gout.dtype(), .device = gout.device()};
             const int64_t N = p.conv.N, K = p.conv.K;
             Tensor A = Tensor::empty({N, K}, o), B = Tensor::empty({N, p.groups}, o);
             Tensor dx, dw, db, dgamma, dbeta;
             if (args.needs_grad[0] || args.needs_grad[1])
               TG_CHECK(xs.defined(), kOp, ": the gradient of the input or weight is needed but they were not "
                        "saved (requires_grad was switched on after the forward pass)");
             if (args.needs_grad[0]) dx = Tensor::empty(x_shape, o);
             if (args.needs_grad[1]) dw = Tensor::empty(w_shape, o);
             if (args.needs_grad[2]) db = Tensor::empty({K}, o);
             if (args.needs_grad[3]) dgamma = Tensor::empty({K}, o);
             if (args.needs_grad[4]) dbeta = Tensor::empty({K}, o);
             TG_DISPATCH(gout.device(), conv3d_gn_mean_coefficients(A, B, dgamma, dbeta, db, gout, s1, mu, rs, gs, p));
             if (dx.defined() || dw.defined())
               TG_DISPATCH(gout.device(), conv3d_gn_mean_grad_conv(dw, dx, xs, ws, bs, A, B, p));
             return std::vector<Tensor>{dx, dw, db, dgamma, dbeta};
           });
  }
  return out;
}

}  // namespace tg
