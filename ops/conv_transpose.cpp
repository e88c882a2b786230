// conv_transpose2d / conv_transpose3d: validation, the output size, and the tape entry. The
// arithmetic is the convolution's (ops/conv.h) with the roles of input and output swapped.
#include "ops/conv_transpose.h"

#include "autograd/tape.h"
#include "core/profiler.h"
#include "core/checked.h"
#include "ops/checks.h"
#include "ops/elementwise.h"
#include "ops/half_compute.h"

namespace tg {
namespace {

void check_operands(const char* op, size_t dims, const Tensor& x, const Tensor& w, const Tensor& b,
                    const ConvTransposeParams& p) {
  TG_CHECK(x.defined(), op, ": the input is an undefined tensor");
  TG_CHECK(w.defined(), op, ": the weight is an undefined tensor");
  check_same_device_dtype(op, x, w);
  const int64_t rank = int64_t(dims) + 2;
  TG_CHECK_AS(ShapeError, x.dim() == rank, op, ": expected a ", rank, "-D input, got ", describe(x));
  TG_CHECK_AS(ShapeError, w.dim() == rank, op, ": expected a ", rank, "-D weight (C_in, C_out, ",
              dims == 3 ? "kd, kh, kw" : "kh, kw", "), got ", describe(w));
  TG_CHECK_AS(UnsupportedError, !(dims == 3 && p.layout == Layout::NHWC), op,
              ": Layout::NHWC is not supported for 3-D (input must be NCDHW), got input ", x.shape());
  const int64_t channels = p.layout == Layout::NHWC ? x.size(x.dim() - 1) : x.size(1);
  TG_CHECK_AS(ShapeError, channels == w.size(0), op, ": input ", describe(x), " has ", channels,
              " channels but the weight ", w.shape(), " expects ", w.size(0), " (weight is (C_in, C_out, k...))");
  if (b.defined()) {
    check_same_device_dtype(op, x, b);
    TG_CHECK_AS(ShapeError, b.dim() == 1 && b.size(0) == w.size(1), op, ": bias ", describe(b),
                " does not match weight ", w.shape(), ": expected shape [", w.size(1), "]");
  }
}

ConvParams conv_params(const ConvTransposeParams& p) {
  return {.stride = p.stride, .padding = p.padding, .dilation = p.dilation, .layout = p.layout};
}

// Profiler costs (core/profiler.h). A transposed convolution is the input-gradient pass of
// the convolution s that maps y back to x: 2*N*K*C*(kernel volume)*(x volume) FLOPs per pass
// (forward, grad of the input = that convolution, grad of the weight), plus one per output
// element for a bias. Bytes: every operand read once, every result written once.
static double pass_flops(const ConvShape& s) {
  return 2.0 * static_cast<double>(s.N) * static_cast<double>(s.K) * static_cast<double>(s.C) *
         static_cast<double>(s.kernel_volume()) * static_cast<double>(s.out_volume());
}

Tensor conv_transpose_nd(const char* op, size_t dims, const Tensor& x, const Tensor& w, const Tensor& b,
                         const ConvTransposeParams& p) {
  check_operands(op, dims, x, w, b, p);
  const Shape y_shape = conv_transpose_output_shape(op, x.shape(), w.shape(), p);
  const ConvParams cp = conv_params(p);
  const ConvShape s = make_conv_shape(op, y_shape, w.shape(), cp);
  profile::OpScope scope(op, [&] {
    const double y_elems = static_cast<double>(y_shape.numel());
    return profile::OpInfo{{&x, &w, &b}, pass_flops(s) + (b.defined() ? y_elems : 0),
                           profile::bytes_of({&x, &w, &b}) + y_elems * static_cast<double>(dtype_size(x.dtype())), true};
  });
  Tensor y = conv_backward_input(x, w, y_shape, cp);
  if (b.defined()) {
    NoGradGuard no_grad;  // the bias is part of this op's one tape entry
    const int64_t c_out = w.size(1);
    Shape b_shape({c_out});
    if (p.layout != Layout::NHWC) b_shape = dims == 3 ? Shape{c_out, 1, 1, 1} : Shape{c_out, 1, 1};
    y = add(y, b.reshape(b_shape));
  }
  if (should_record({x, w, b})) {
    Tensor saved_x = w.requires_grad() ? x : Tensor();
    Tensor saved_w = x.requires_grad() ? w : Tensor();
    record(op, {x, w, b}, {y}, {saved_x, saved_w},
           [op, cp, dims, s, w_shape = w.shape()](const BackwardArgs& args) {
             const Tensor& dy = args.grad_outputs[0];
             profile::OpScope scope(dims == 3 ? "conv_transpose3d (backward)" : "conv_transpose2d (backward)", [&] {
               const Tensor &x = args.saved[0], &w = args.saved[1];
               profile::OpInfo info{{&dy, &x, &w}, 0, profile::bytes_of({&dy}), true};
               const double xb = static_cast<double>(s.y_shape().numel() * static_cast<int64_t>(dtype_size(dy.dtype())));
               const double wb = static_cast<double>(s.w_shape().numel() * static_cast<int64_t>(dtype_size(dy.dtype())));
               if (args.needs_grad[0]) info.flops += pass_flops(s), info.bytes += wb + xb;  // reads w, writes dx
               if (args.needs_grad[1]) info.flops += pass_flops(s), info.bytes += xb + wb;  // reads x, writes dw
               if (args.needs_grad[2]) info.flops += static_cast<double>(dy.numel());
               return info;
             });
             std::vector<Tensor> grads(3);
             if (args.needs_grad[0]) {
               TG_CHECK(args.saved[1].defined(), op, ": the input's gradient is needed but the weight was not "
                        "saved (requires_grad was switched on after the forward pass)");
               grads[0] = dims == 3 ? conv3d(dy, args.saved[1], Tensor(), cp) : conv2d(dy, args.saved[1], Tensor(), cp);
             }
             if (args.needs_grad[1]) {
               TG_CHECK(args.saved[0].defined(), op, ": the weight's gradient is needed but the input was not "
                        "saved (requires_grad was switched on after the forward pass)");
               // The convolution's weight gradient with its output gradient = x, its input = dy.
               grads[1] = conv_backward_weight(args.saved[0], dy, w_shape, cp);
             }
             if (args.needs_grad[2]) grads[2] = conv_backward_bias(dy, cp.layout);
             return grads;
           });
  }
  return y;
}

}  // namespace

Shape conv_transpose_output_shape(const char* op, const Shape& x_shape, const Shape& w_shape,
                                  const ConvTransposeParams& p) {
  TG_CHECK_AS(ShapeError, w_shape.rank() == 4 || w_shape.rank() == 5, op, ": expected a 4-D or 5-D weight, got ",
              w_shape);
  TG_CHECK_AS(ShapeError, x_shape.rank() == w_shape.rank(), op, ": input ", x_shape, " and weight ", w_shape,
              " must have the same rank");
  checked_extent(x_shape.dims(), op);
  checked_extent(w_shape.dims(), op);
  const size_t dims = w_shape.rank() - 2;
  const bool last = p.layout == Layout::NHWC;
  const auto stride = conv_per_dim(op, "stride", p.stride, int(dims), 1);
  const auto pad = conv_per_dim(op, "padding", p.padding, int(dims), 0);
  const auto out_pad = conv_per_dim(op, "output_padding", p.output_padding, int(dims), 0);
  const auto dil = conv_per_dim(op, "dilation", p.dilation, int(dims), 1);
  std::vector<int64_t> y = {x_shape[0]};
  if (!last) y.push_back(w_shape[1]);
  for (size_t d = 0; d < dims; ++d) {
    const int64_t in = last ? x_shape[1 + d] : x_shape[2 + d], k = w_shape[2 + d];
    TG_CHECK(out_pad[d] < stride[d] || out_pad[d] < dil[d], op, ": output_padding ", Shape(out_pad),
             " must be smaller than the stride ", Shape(stride), " or the dilation ", Shape(dil));
    // PyTorch also takes stride <= output_padding < dilation; here the transposed convolution
    // runs as the convolution of the output, which then ends up larger than x.
    TG_CHECK_AS(UnsupportedError, out_pad[d] < stride[d], op, ": output_padding ", Shape(out_pad),
                " at or above the stride ", Shape(stride), " (allowed by the dilation ", Shape(dil),
                ") is not supported; use output_padding below the stride");
    // (in - 1) * stride - 2 * pad + dil * (k - 1) + output_padding + 1, every step checked.
    const int64_t grown = checked_mul(in - 1, stride[d], op, ": output size");
    const int64_t span = checked_add(checked_mul(dil[d], k - 1, op, ": kernel extent"), out_pad[d] + 1, op,
                                     ": output size");
    const int64_t out = checked_sub(checked_add(grown, span, op, ": output size"), checked_mul(2, pad[d], op, ": padding"),
                                    op, ": output size");
    TG_CHECK_AS(ShapeError, in >= 1 && out >= 1, op, ": input ", x_shape, " with weight ", w_shape, ", stride ",
                Shape(stride), ", padding ", Shape(pad), " gives an empty output (size ", out, " in spatial dim ", d,
                ")");
    y.push_back(out);
  }
  if (last) y.push_back(w_shape[1]);
  const Shape y_shape(y);
  // The convolution this op transposes must map y back to x's shape.
  const ConvShape s = make_conv_shape(op, y_shape, w_shape, conv_params(p));
  TG_CHECK_AS(ShapeError, s.y_shape() == x_shape, op, ": input ", x_shape, " is not the output of a convolution of ",
              y_shape, " by ", w_shape, " with these parameters");
  return y_shape;
}

// Half inputs and Autocast scopes: ops/half_compute.h (matrix_op).
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvTransposeParams& p) {
  if (!needs_matrix_half_path(x, w, bias)) return conv_transpose_nd("conv_transpose2d", 2, x, w, bias, p);
  return matrix_op("conv_transpose2d", {x, w, bias}, [&](const std::vector<Tensor>& v) {
    return conv_transpose_nd("conv_transpose2d", 2, v[0], v[1], v[2], p);
  });
}

Tensor conv_transpose3d(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvTransposeParams& p) {
  if (!needs_matrix_half_path(x, w, bias)) return conv_transpose_nd("conv_transpose3d", 3, x, w, bias, p);
  return matrix_op("conv_transpose3d", {x, w, bias}, [&](const std::vector<Tensor>& v) {
    return conv_transpose_nd("conv_transpose3d", 3, v[0], v[1], v[2], p);
  });
}

}  // namespace tg
