// conv2d / conv3d: validation, dispatch to the CPU or CUDA kernels, and the tape entry.
#include "ops/conv.h"

#include <algorithm>
#include <string>
#include <tuple>

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/cpu/conv.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/half_compute.h"
#if TG_CUDA
#include "ops/cuda/conv.h"
#endif

namespace tg {
namespace {

const char* dim_name(int spatial_dims, int d) {
  static const char* k2[] = {"H", "W"};
  static const char* k3[] = {"D", "H", "W"};
  return spatial_dims == 2 ? k2[d] : k3[d];
}


const char* rank_description(int spatial_dims, Layout layout) {
  if (spatial_dims == 3) return "(N, C, D, H, W)";
  return layout == Layout::NHWC ? "(N, H, W, C)" : "(N, C, H, W)";
}

// Checks x, w (and b when defined): defined, floating, one dtype, one device, ranks.
// half_kernels: the caller runs bf16 kernels (conv_bf16), so half dtypes pass; elsewhere they are
// rejected (conv2d routes them to conv_half before this).
void check_operands(const char* op, int spatial_dims, const Tensor& x, const Tensor& w, const Tensor& b,
                    const ConvParams& p, bool half_kernels = false) {
  TG_CHECK(x.defined(), op, ": the input is an undefined tensor");
  TG_CHECK(w.defined(), op, ": the weight is an undefined tensor");
  const auto check_pair = half_kernels ? check_same_device_and_dtype : check_same_device_dtype;
  check_pair(op, x, w);
  const int64_t rank = spatial_dims + 2;
  TG_CHECK_AS(ShapeError, x.dim() == rank, op, ": expected a ", rank, "-D input ", rank_description(spatial_dims, p.layout),
              ", got ", describe(x));
  TG_CHECK_AS(ShapeError, w.dim() == rank, op, ": expected a ", rank, "-D weight (K, C, ",
              spatial_dims == 3 ? "kd, kh, kw" : "kh, kw", "), got ", describe(w));
  if (b.defined()) {
    check_pair(op, x, b);
    TG_CHECK_AS(ShapeError, b.dim() == 1 && b.size(0) == w.size(0), op, ": bias ", describe(b), " does not match weight ",
                w.shape(), ": expected shape [", w.size(0), "]");
  }
}

void check_gradient(const char* op, const Tensor& dy, const ConvShape& s, const Shape& x_shape,
                    const Shape& w_shape) {
  TG_CHECK_AS(ShapeError, dy.shape() == s.y_shape(), op, ": gradient ", describe(dy), " does not match the output shape ",
              s.y_shape(), " of input ", x_shape, " and weight ", w_shape);
}

// Profiler costs (core/profiler.h). Each pass of a convolution (forward, grad of the
// input, grad of the weight) is 2*N*K*C*(kernel volume)*(output volume) FLOPs; a bias adds
// (or its grad sums) one per output element. Bytes: every operand read once, every result
// written once.
double conv_flops(const ConvShape& s) {
  return 2.0 * static_cast<double>(s.N) * static_cast<double>(s.K) * static_cast<double>(s.C) *
         static_cast<double>(s.kernel_volume()) * static_cast<double>(s.out_volume());
}
double conv_outputs(const ConvShape& s) {
  return static_cast<double>(s.N) * static_cast<double>(s.K) * static_cast<double>(s.out_volume());
}
// Backward: the passes `needs` asks for (input, weight, bias).
profile::OpInfo conv_backward_info(const ConvShape& s, const BackwardArgs& a, DType dt) {
  const double e = static_cast<double>(dtype_size(dt));
  const double x = static_cast<double>(s.N) * s.C * s.in_volume() * e, w = static_cast<double>(s.K) * s.C * s.kernel_volume() * e;
  const double y = conv_outputs(s) * e;
  profile::OpInfo info{{&a.grad_outputs[0], &a.saved[0], &a.saved[1]}, 0, y, true};
  if (a.needs_grad[0]) info.flops += conv_flops(s), info.bytes += x + w;   // reads w, writes dx
  if (a.needs_grad[1]) info.flops += conv_flops(s), info.bytes += x + w;   // reads x, writes dw
  if (a.needs_grad[2]) info.flops += conv_outputs(s), info.bytes += static_cast<double>(s.K) * e;
  return info;
}

// `saved`, which the backward must read for `grad` ("input's" / "weight's"): a clear error when
// requires_grad was switched on after the forward pass, which then saved nothing for it.
const Tensor& saved_for(const char* op, const char* grad, const char* what, const Tensor& saved) {
  TG_CHECK(saved.defined(), op, ": the ", grad, " gradient is needed but the ", what,
           " was not saved (requires_grad was switched on after the forward pass)");
  return saved;
}

// The gradients the backward pass needs (input, weight, bias) from dy and the saved x and w
// (the ConvGrads signature below; the shape s is not needed here).
std::vector<Tensor> conv_grads(const char* op, const ConvParams& p, const ConvShape&, const Shape& x_shape,
                               const Shape& w_shape, const Tensor& dy, const Tensor& saved_x, const Tensor& saved_w,
                               const std::vector<bool>& needs) {
  std::vector<Tensor> grads(3);
  if (needs[0] && needs[1] && saved_x.defined() && saved_w.defined()) {
    std::tie(grads[0], grads[1]) = conv_backward_input_weight(dy, saved_x, saved_w, p);
  } else if (needs[0]) {
    grads[0] = conv_backward_input(dy, saved_for(op, "input's", "weight", saved_w), x_shape, p);
  }
  if (needs[1] && !grads[1].defined())
    grads[1] = conv_backward_weight(dy, saved_for(op, "weight's", "input", saved_x), w_shape, p);
  if (needs[2]) grads[2] = conv_backward_bias(dy, p.layout);
  return grads;
}

profile::OpInfo conv_forward_info(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor& b) {
  const double y = conv_outputs(s) * static_cast<double>(dtype_size(x.dtype()));
  return profile::OpInfo{{&x, &w, &b}, conv_flops(s) + (b.defined() ? conv_outputs(s) : 0),
                         profile::bytes_of({&x, &w, &b}) + y, true};
}

// The backward of one convolution: its gradients from dy and the saved x and w.
using ConvGrads = std::vector<Tensor> (*)(const char* op, const ConvParams& p, const ConvShape& s, const Shape& x_shape,
                                          const Shape& w_shape, const Tensor& dy, const Tensor& saved_x,
                                          const Tensor& saved_w, const std::vector<bool>& needs);

// Records y = conv(x, w, b) on the tape. Saves only what backward will read: x for dw, w for dx.
void record_conv(const char* op, const ConvParams& p, const ConvShape& s, const Tensor& x, const Tensor& w,
                 const Tensor& b, const Tensor& y, ConvGrads grads) {
  Tensor saved_x = w.requires_grad() ? x : Tensor();
  Tensor saved_w = x.requires_grad() ? w : Tensor();
  record(op, {x, w, b}, {y}, {saved_x, saved_w},
         [op, p, s, grads, x_shape = x.shape(), w_shape = w.shape()](const BackwardArgs& args) {
           const Tensor& dy = args.grad_outputs[0];
           profile::OpScope scope(s.spatial_dims == 2 ? "conv2d (backward)" : "conv3d (backward)",
                                  [&] { return conv_backward_info(s, args, dy.dtype()); });
           return grads(op, p, s, x_shape, w_shape, dy, args.saved[0], args.saved[1], args.needs_grad);
         });
}

Tensor conv_nd(const char* op, int spatial_dims, const Tensor& x, const Tensor& w, const Tensor& b,
               const ConvParams& p) {
  check_operands(op, spatial_dims, x, w, b, p);
  const ConvShape s = make_conv_shape(op, x.shape(), w.shape(), p);
  profile::OpScope scope(op, [&] { return conv_forward_info(s, x, w, b); });
  Tensor y = Tensor::empty(s.y_shape(), {.dtype = x.dtype(), .device = x.device()});
  TG_DISPATCH(x.device(), conv_forward(y, x, w, b, s));
  if (should_record({x, w, b})) record_conv(op, p, s, x, w, b, y, conv_grads);
  return y;
}

#if TG_CUDA
// Whether conv2d / conv3d's operands (after Autocast's casts) take conv_bf16: bf16 on one GPU.
bool bf16_conv_on_gpu(const Tensor& x, const Tensor& w, const Tensor& b) {
  const auto bf16 = [&](const Tensor& t) { return t.dtype() == DType::bf16 && t.device() == x.device(); };
  return x.defined() && w.defined() && x.device().is_cuda() && bf16(x) && bf16(w) && (!b.defined() || bf16(b));
}

// conv_bf16's backward: the input and weight gradients on the engine's BF16 kernels where dy is
// bf16 (cuda::conv_grad_input_bf16 / conv_grad_weight_bf16: the products the f32 path computes
// on f32 copies, rounded once); the bias gradient as the f32 path computes it for a bf16 op
// (compute_in_f32): on an f32 copy of dy, rounded once to bf16.
// Runs inside a backward: its casts (Tensor::to) are not recorded.
std::vector<Tensor> conv_grads_bf16(const char* op, const ConvParams& p, const ConvShape& s, const Shape& x_shape,
                                    const Shape& w_shape, const Tensor& dy, const Tensor& saved_x,
                                    const Tensor& saved_w, const std::vector<bool>& needs) {
  std::vector<Tensor> grads(3);
  Tensor dy32;  // an f32 copy of dy, made only where a pass reads it
  const auto f32_dy = [&]() -> const Tensor& {
    if (!dy32.defined()) dy32 = dy.to(DType::f32);
    return dy32;
  };
  if (needs[0]) {
    saved_for(op, "input's", "weight", saved_w);
    if (dy.dtype() == DType::bf16) {
      grads[0] = Tensor::empty(x_shape, {.dtype = DType::bf16, .device = dy.device()});
      cuda::conv_grad_input_bf16(grads[0], dy, saved_w, s);
    } else {
      grads[0] = conv_backward_input(f32_dy(), saved_w.to(DType::f32), x_shape, p).to(DType::bf16);
    }
  }
  if (needs[1]) {
    saved_for(op, "weight's", "input", saved_x);
    if (dy.dtype() == DType::bf16) {
      grads[1] = Tensor::empty(w_shape, {.dtype = DType::bf16, .device = dy.device()});
      cuda::conv_grad_weight_bf16(grads[1], dy, saved_x, s);
    } else {
      grads[1] = conv_backward_weight(f32_dy(), saved_x.to(DType::f32), w_shape, p).to(DType::bf16);
    }
  }
  if (needs[2]) grads[2] = conv_backward_bias(f32_dy(), p.layout).to(DType::bf16);
  return grads;
}

// bf16 convolution on a GPU (Autocast's): the forward on the engine's BF16 kernel (exact
// products, f32 accumulation, one rounding to bf16: cuda::conv_forward_bf16); the backward
// conv_grads_bf16.
Tensor conv_bf16(const char* op, const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor& b,
                 const ConvParams& p) {
  profile::OpScope scope(op, [&] { return conv_forward_info(s, x, w, b); });
  Tensor y = Tensor::empty(s.y_shape(), {.dtype = DType::bf16, .device = x.device()});
  cuda::conv_forward_bf16(y, x, w, b, s);
  if (should_record({x, w, b})) record_conv(op, p, s, x, w, b, y, conv_grads_bf16);
  return y;
}
#endif

// conv2d / conv3d with half inputs or inside an Autocast scope (ops/half_compute.h): bf16
// operands on a GPU take conv_bf16 (problems within the engine's limits), the rest matrix_op.
Tensor conv_half(const char* op, int spatial_dims, const Tensor& x, const Tensor& w, const Tensor& b,
                 const ConvParams& p) {
  const auto f32_op = [&](const std::vector<Tensor>& v) { return conv_nd(op, spatial_dims, v[0], v[1], v[2], p); };
  const std::vector<Tensor> lowered = autocast_lower({x, w, b});
#if TG_CUDA
  if (bf16_conv_on_gpu(lowered[0], lowered[1], lowered[2])) {
    check_operands(op, spatial_dims, lowered[0], lowered[1], lowered[2], p, /*half_kernels=*/true);
    const ConvShape s = make_conv_shape(op, lowered[0].shape(), lowered[1].shape(), p);
    if (cuda::conv_bf16_can_implement(s)) return conv_bf16(op, s, lowered[0], lowered[1], lowered[2], p);
  }
#endif
  // Already lowered: matrix_op's own Autocast casts find no f32 operand left.
  return matrix_op(op, lowered, f32_op);
}

}  // namespace

std::vector<int64_t> conv_per_dim(const char* op, const char* name, const std::vector<int64_t>& v, int dims,
                             int64_t min_value) {
  TG_CHECK(v.size() == 1 || v.size() == static_cast<size_t>(dims), op, ": ", name, " has ", v.size(),
           " values; expected 1 or ", dims, " (one per spatial dim)");
  std::vector<int64_t> out(static_cast<size_t>(dims), v[0]);
  if (v.size() != 1) out = v;
  for (int64_t x : out) {
    TG_CHECK(x >= min_value, op, ": ", name, " must be ", min_value == 0 ? "non-negative" : "positive",
             ", got ", Shape(out));
  }
  return out;
}

Shape ConvShape::x_shape() const {
  if (spatial_dims == 3) return Shape{N, C, in[0], in[1], in[2]};
  return channels_last() ? Shape{N, in[1], in[2], C} : Shape{N, C, in[1], in[2]};
}

Shape ConvShape::w_shape() const {
  if (spatial_dims == 3) return Shape{K, C, kernel[0], kernel[1], kernel[2]};
  return Shape{K, C, kernel[1], kernel[2]};
}

Shape ConvShape::y_shape() const {
  if (spatial_dims == 3) return Shape{N, K, out[0], out[1], out[2]};
  return channels_last() ? Shape{N, out[1], out[2], K} : Shape{N, K, out[1], out[2]};
}

ConvShape make_conv_shape(const char* op, const Shape& x_shape, const Shape& w_shape, const ConvParams& p) {
  TG_CHECK_AS(ShapeError, w_shape.rank() == 4 || w_shape.rank() == 5, op, ": expected a 4-D or 5-D weight, got ", w_shape);
  // The shapes may come from callers (the backward pieces take x_shape / w_shape), not
  // only from tensors: their counts must fit in int64 before any product of them is formed.
  checked_extent(x_shape.dims(), op);
  checked_extent(w_shape.dims(), op);
  const int dims = static_cast<int>(w_shape.rank()) - 2;
  TG_CHECK_AS(ShapeError, x_shape.rank() == w_shape.rank(), op, ": input ", x_shape, " and weight ", w_shape,
              " must have the same rank");
  TG_CHECK_AS(UnsupportedError, !(dims == 3 && p.layout == Layout::NHWC), op,
              ": Layout::NHWC is not supported for 3-D convolution (input must be NCDHW), got input ", x_shape);
  const bool last = p.layout == Layout::NHWC;
  const auto stride = conv_per_dim(op, "stride", p.stride, dims, 1);
  const auto pad = conv_per_dim(op, "padding", p.padding, dims, 0);
  const auto dil = conv_per_dim(op, "dilation", p.dilation, dims, 1);

  ConvShape s;
  s.spatial_dims = dims;
  s.layout = p.layout;
  s.N = x_shape[0];
  s.C = last ? x_shape[x_shape.rank() - 1] : x_shape[1];
  s.K = w_shape[0];
  TG_CHECK_AS(ShapeError, s.C == w_shape[1], op, ": input ", x_shape, " has ", s.C, " channels but weight ", w_shape,
              " expects ", w_shape[1]);
  for (int64_t v : w_shape) TG_CHECK_AS(ShapeError, v >= 1, op, ": weight ", w_shape, " has an empty dimension");
  TG_CHECK_AS(ShapeError, s.N >= 0 && s.C >= 1, op, ": input ", x_shape, " has no channels");
  const int first = 3 - dims;  // 2-D problems occupy the (H, W) slots; D stays 1
  for (int d = 0; d < dims; ++d) {
    const int slot = first + d;
    s.in[slot] = last ? x_shape[1 + d] : x_shape[2 + d];
    s.kernel[slot] = w_shape[2 + d];
    s.stride[slot] = stride[d];
    s.pad[slot] = pad[d];
    s.dilation[slot] = dil[d];
    TG_CHECK_AS(ShapeError, s.in[slot] >= 1, op, ": input ", x_shape, " is empty in spatial dim ", dim_name(dims, d));
    const std::string where = detail::concat(op, ": input ", x_shape, ", weight ", w_shape, ", padding ",
                                             pad[d], ", dilation ", dil[d], " in dim ", dim_name(dims, d));
    const int64_t extent = conv_kernel_extent(s.kernel[slot], dil[d], where.c_str());
    const int64_t padded = conv_padded_size(s.in[slot], pad[d], where.c_str());
    TG_CHECK_AS(ShapeError, extent <= padded, op, ": kernel larger than the padded input in dim ", dim_name(dims, d),
                ": dilated kernel extent ", extent, " > padded input size ", padded, " (input ", x_shape,
                ", weight ", w_shape, ", padding ", pad[d], ", dilation ", dil[d], ")");
    s.out[slot] = conv_output_size(s.in[slot], s.kernel[slot], stride[d], pad[d], dil[d]);
  }
  checked_extent(s.y_shape().dims(), op);  // N * K * out... must be countable as well
  return s;
}

// Half inputs and Autocast scopes: ops/half_compute.h (matrix_op).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p) {
  if (!needs_matrix_half_path(x, w, b)) return conv_nd("conv2d", 2, x, w, b, p);
  return conv_half("conv2d", 2, x, w, b, p);
}

Tensor conv3d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p) {
  if (!needs_matrix_half_path(x, w, b)) return conv_nd("conv3d", 3, x, w, b, p);
  return conv_half("conv3d", 3, x, w, b, p);
}

Tensor conv_backward_input(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) {
  const char* op = "conv_backward_input";
  TG_CHECK(dy.defined() && w.defined(), op, ": an input is an undefined tensor");
  check_same_device_dtype(op, dy, w);
  const ConvShape s = make_conv_shape(op, x_shape, w.shape(), p);
  check_gradient(op, dy, s, x_shape, w.shape());
  profile::OpScope scope(op, [&] {
    return profile::OpInfo{{&dy, &w}, conv_flops(s), profile::bytes_of({&dy, &w}) + s.N * s.C * s.in_volume() *
                           static_cast<double>(dtype_size(dy.dtype())), true};
  });
  Tensor dx = Tensor::empty(x_shape, {.dtype = dy.dtype(), .device = dy.device()});
  TG_DISPATCH(dy.device(), conv_grad_input(dx, dy, w, s));
  return dx;
}

Tensor conv_backward_weight(const Tensor& dy, const Tensor& x, const Shape& w_shape, const ConvParams& p) {
  const char* op = "conv_backward_weight";
  TG_CHECK(dy.defined() && x.defined(), op, ": an input is an undefined tensor");
  check_same_device_dtype(op, dy, x);
  const ConvShape s = make_conv_shape(op, x.shape(), w_shape, p);
  check_gradient(op, dy, s, x.shape(), w_shape);
  profile::OpScope scope(op, [&] {
    return profile::OpInfo{{&dy, &x}, conv_flops(s), profile::bytes_of({&dy, &x}) + s.K * s.C * s.kernel_volume() *
                           static_cast<double>(dtype_size(dy.dtype())), true};
  });
  Tensor dw = Tensor::empty(w_shape, {.dtype = dy.dtype(), .device = dy.device()});
  TG_DISPATCH(dy.device(), conv_grad_weight(dw, dy, x, s));
  return dw;
}

std::pair<Tensor, Tensor> conv_backward_input_weight(const Tensor& dy, const Tensor& x, const Tensor& w,
                                                     const ConvParams& p) {
  const char* op = "conv_backward_input_weight";
  TG_CHECK(dy.defined() && x.defined() && w.defined(), op, ": an input is an undefined tensor");
  check_same_device_dtype(op, dy, x);
  check_same_device_dtype(op, dy, w);
  const ConvShape s = make_conv_shape(op, x.shape(), w.shape(), p);
  check_gradient(op, dy, s, x.shape(), w.shape());
  profile::OpScope scope(op, [&] {
    return profile::OpInfo{{&dy, &x, &w}, 2 * conv_flops(s), profile::bytes_of({&dy, &x, &w}) * 2 - profile::bytes_of({&dy}), true};
  });
  Tensor dx = Tensor::empty(x.shape(), {.dtype = dy.dtype(), .device = dy.device()});
  Tensor dw = Tensor::empty(w.shape(), {.dtype = dy.dtype(), .device = dy.device()});
  TG_DISPATCH(dy.device(), conv_grad_input_weight(dx, dw, dy, x, w, s));
  return {dx, dw};
}

Tensor conv_backward_bias(const Tensor& dy, Layout layout) {
  const char* op = "conv_backward_bias";
  TG_CHECK(dy.defined(), op, ": the gradient is an undefined tensor");
  check_floating(op, dy);
  TG_CHECK_AS(ShapeError, dy.dim() == 4 || dy.dim() == 5, op, ": expected a 4-D or 5-D gradient, got ", describe(dy));
  // Only N, K, the layout and the output volume matter for the bias: flatten the spatial dims.
  ConvShape s;
  s.spatial_dims = static_cast<int>(dy.dim()) - 2;
  s.layout = layout;
  s.N = dy.size(0);
  s.K = layout == Layout::NHWC ? dy.size(-1) : dy.size(1);
  s.out[2] = dy.numel() / std::max<int64_t>(1, s.N * s.K);
  if (s.N * s.K == 0) s.out[2] = 0;
  profile::OpScope scope(op, [&] {
    return profile::OpInfo{{&dy}, static_cast<double>(dy.numel()),
                           static_cast<double>((dy.numel() + s.K) * static_cast<int64_t>(dtype_size(dy.dtype())))};
  });
  Tensor db = Tensor::empty(Shape{s.K}, {.dtype = dy.dtype(), .device = dy.device()});
  TG_DISPATCH(dy.device(), conv_grad_bias(db, dy, s));
  return db;
}

}  // namespace tg
