// The pooling family's public functions: validation, device dispatch, the tape entries.
#include "ops/pool.h"

#include <map>
#include <string>

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/cpu/shape_pool_kernels.h"
#include "ops/dispatch.h"
#include "ops/half_compute.h"
#if TG_CUDA
#include "ops/cuda/shape_pool_kernels.h"
#endif

namespace tg {

namespace {

const char* dim_name(int spatial, int d) {
  static const char* names3[] = {"D", "H", "W"};
  return names3[d + (spatial == 2 ? 1 : 0)];
}

// A list of one value for every spatial dim, or one per dim (checked by the caller), as
// `spatial` values.
std::vector<int64_t> expand(const std::vector<int64_t>& v, int spatial) {
  return v.size() == 1 ? std::vector<int64_t>(static_cast<size_t>(spatial), v[0]) : v;
}

void check_list(const char* op, const char* name, const std::vector<int64_t>& v, int spatial, int64_t min_value) {
  TG_CHECK(v.size() == 1 || v.size() == static_cast<size_t>(spatial), op, ": ", name, " has ", v.size(),
           " values; expected 1 or ", spatial);
  for (int64_t x : v)
    TG_CHECK(x >= min_value, op, ": ", name, " must be ", min_value == 0 ? "non-negative" : "positive", ", got ",
             Shape(v));
}

void check_input(const char* op, int spatial, const Tensor& x) {
  check_floating(op, x);
  TG_CHECK_AS(ShapeError, x.dim() == spatial + 2, op, ": expected a ", spatial + 2, "-D input ",
              spatial == 2 ? "(N, C, H, W)" : "(N, C, D, H, W)", ", got ", describe(x));
}

// " dilation [..]" when some dilation is not 1, for messages.
std::string with_dilation(const std::vector<int64_t>& dilation) {
  for (int64_t d : dilation)
    if (d != 1) return " dilation " + Shape(dilation).str();
  return "";
}

const char* kind_name(const PoolProblem& p) {
  if (p.kind == PoolKind::max) return p.spatial == 2 ? "max_pool2d" : "max_pool3d";
  if (p.kind == PoolKind::avg) return p.spatial == 2 ? "avg_pool2d" : "avg_pool3d";
  return p.spatial == 2 ? "adaptive_avg_pool2d" : "adaptive_avg_pool3d";
}

// PyTorch's pooling_output_shape for one dim (see ops/pool.h), or -1 where the dilated kernel
// is larger than the padded input. Needs kernel, stride, dilation >= 1 and padding >= 0; the
// sums are checked, since a caller-built problem may hold any values.
int64_t pooled_size(const char* op, int64_t in, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation,
                    bool ceil_mode) {
  const int64_t padded = checked_add(in, checked_mul(2, padding, op), op);
  const int64_t extent = checked_add(checked_mul(dilation, kernel - 1, op), 1, op);
  const int64_t n = checked_add(padded - extent, ceil_mode ? stride - 1 : 0, op);
  if (n < 0) return -1;
  int64_t out = n / stride + 1;
  // A ceil_mode window that would start in the right padding is dropped.
  if (ceil_mode && (out - 1) * stride >= in + padding) --out;
  return out;
}

// The first output position along dim k whose max window has no tap inside the input, or -1.
// Only dilation can skip every real element, of a window that begins in the left padding
// (one that begins at 0 or later holds its first tap), and only when the input is shorter
// than the dilation: padding at most half the window puts a tap in [0, dilation).
int64_t first_window_without_input(const PoolProblem& p, int k) {
  if (p.kind != PoolKind::max || p.dilation[k] == 1 || p.in[k] >= p.dilation[k]) return -1;
  for (int64_t o = 0; o < p.out[k] && o * p.stride[k] < p.padding[k]; ++o) {
    const PoolWindow w = pool_window(p, k, o);
    if (w.begin >= w.end) return o;
  }
  return -1;
}

std::string describe_problem(const PoolProblem& p) {
  auto dims = [](const int64_t* v) { return Shape({v[0], v[1], v[2]}).str(); };
  return detail::concat("(N ", p.N, ", C ", p.C, ", in ", dims(p.in), ", out ", dims(p.out), ", kernel ",
                        dims(p.kernel), ", stride ", dims(p.stride), ", padding ", dims(p.padding), ", dilation ",
                        dims(p.dilation), ")");
}

// The geometry of one dim of a max or average problem: the parameters in range, the output
// size the one that floor or ceil mode gives.
void check_window_dim(const char* op, const PoolProblem& p, int k) {
  TG_CHECK(p.kernel[k] >= 1 && p.stride[k] >= 1 && p.padding[k] >= 0 && p.dilation[k] >= 1, op,
           ": invalid problem: kernel, stride and dilation must be positive and padding non-negative ",
           describe_problem(p));
  TG_CHECK(p.kind == PoolKind::max || p.dilation[k] == 1, op, ": invalid problem: average pooling has no dilation ",
           describe_problem(p));
  const int64_t extent = checked_add(checked_mul(p.dilation[k], p.kernel[k] - 1, op), 1, op);
  TG_CHECK(p.padding[k] <= extent / 2, op, ": invalid problem: padding above half the dilated kernel ",
           describe_problem(p));
  const int64_t floor_out = pooled_size(op, p.in[k], p.kernel[k], p.stride[k], p.padding[k], p.dilation[k], false);
  const int64_t ceil_out = pooled_size(op, p.in[k], p.kernel[k], p.stride[k], p.padding[k], p.dilation[k], true);
  TG_CHECK_AS(ShapeError, p.out[k] == floor_out || p.out[k] == ceil_out, op, ": invalid problem: output size ",
              p.out[k], " in dim ", "DHW"[k], " is not the pooled size of the input (", floor_out, ", or ", ceil_out,
              " with ceil_mode) ", describe_problem(p));
  TG_CHECK_AS(ShapeError, first_window_without_input(p, k) < 0, op,
              ": invalid problem: a dilated window holds no input element ", describe_problem(p));
}

// Profiler costs (core/profiler.h): one FLOP per window tap (a compare or an add), i.e.
// N*C*(output plane)*(kernel volume); adaptive windows tile the input: N*C*(input plane).
// The backward does as many (scatter-adds). Bytes: x (or dy, and max pooling's indices)
// read once, the result written once.
static double pool_flops(const PoolProblem& p) {
  const double taps = p.kind == PoolKind::adaptive_avg
                          ? static_cast<double>(p.in_plane())
                          : static_cast<double>(p.out_plane()) * p.kernel[0] * p.kernel[1] * p.kernel[2];
  return static_cast<double>(p.N) * static_cast<double>(p.C) * taps;
}
// Average pooling's "no argmax" for the profile infos: an OpInfo points at its tensors until
// the scope has read them, so a temporary Tensor() there would dangle.
const Tensor kNoIndices;

static profile::OpInfo pool_info(const PoolProblem& p, const Tensor& in, const Tensor& indices, bool backward) {
  const double e = static_cast<double>(dtype_size(in.dtype()));
  const double plane = static_cast<double>(backward ? p.in_plane() : p.out_plane());
  double bytes = profile::bytes_of({&in}) + static_cast<double>(p.N) * p.C * plane * e;
  if (p.kind == PoolKind::max) bytes += static_cast<double>(p.N) * p.C * p.out_plane() * 8;  // i64 argmax
  return {{&in, &indices}, pool_flops(p), bytes};
}
static profile::OpInfo pool_backward_info(const char* op, const PoolProblem& p, const Tensor& dy, const Tensor& indices) {
  static const std::map<std::string, const char*> names = {
      {"max_pool2d", "max_pool2d (backward)"},
      {"max_pool3d", "max_pool3d (backward)"},
      {"avg_pool2d", "avg_pool2d (backward)"},
      {"avg_pool3d", "avg_pool3d (backward)"},
      {"adaptive_avg_pool2d", "adaptive_avg_pool2d (backward)"},
      {"adaptive_avg_pool3d", "adaptive_avg_pool3d (backward)"}};
  profile::OpInfo info = pool_info(p, dy, indices, true);
  const auto it = names.find(op);
  info.name = it != names.end() ? it->second : "pool (backward)";
  return info;
}

MaxPoolResult max_pool(const char* op, int spatial, const Tensor& x_in, const PoolParams& params) {
  const Tensor x = autocast_f32(x_in);  // f32 inside an Autocast scope (core/autocast.h)
  const PoolProblem p = make_pool_problem(op, PoolKind::max, spatial, x, params);
  profile::OpScope scope(op, [&] { return pool_info(p, x, kNoIndices, false); });
  const TensorOptions opts{.dtype = x.dtype(), .device = x.device()};
  Tensor out = Tensor::empty(pool_output_shape(p), opts);
  Tensor indices = Tensor::empty(pool_output_shape(p), {.dtype = DType::i64, .device = x.device()});
  TG_DISPATCH(x.device(), pool_forward(out, indices, x, p));
  if (should_record({x})) {
    // Only the argmax is needed: the input itself can be freed after the forward.
    record(op, {x}, {out}, {indices}, [op, p](const BackwardArgs& args) {
      profile::OpScope scope(op, [&] { return pool_backward_info(op, p, args.grad_outputs[0], args.saved[0]); });
      return std::vector<Tensor>{max_pool_backward(args.grad_outputs[0], args.saved[0], p)};
    });
  }
  return {out, indices};
}

Tensor avg_pool(const char* op, const Tensor& x, const PoolProblem& p) {
  profile::OpScope scope(op, [&] { return pool_info(p, x, kNoIndices, false); });
  Tensor out = Tensor::empty(pool_output_shape(p), {.dtype = x.dtype(), .device = x.device()});
  TG_DISPATCH(x.device(), pool_forward(out, Tensor(), x, p));
  if (should_record({x})) {
    record(op, {x}, {out}, {}, [op, p](const BackwardArgs& args) {
      profile::OpScope scope(op, [&] { return pool_backward_info(op, p, args.grad_outputs[0], kNoIndices); });
      return std::vector<Tensor>{avg_pool_backward(args.grad_outputs[0], p)};
    });
  }
  return out;
}

}  // namespace

void check_pool_params(const char* op, PoolKind kind, int spatial, const PoolParams& p) {
  TG_CHECK(!p.kernel_size.empty(), op, ": kernel_size is required");
  check_list(op, "kernel_size", p.kernel_size, spatial, 1);
  if (!p.stride.empty()) check_list(op, "stride", p.stride, spatial, 1);
  check_list(op, "padding", p.padding, spatial, 0);
  check_list(op, "dilation", p.dilation, spatial, 1);
  const std::vector<int64_t> k = expand(p.kernel_size, spatial), pad = expand(p.padding, spatial);
  const std::vector<int64_t> dil = expand(p.dilation, spatial);
  if (kind != PoolKind::max)
    for (int64_t d : dil)
      TG_CHECK(d == 1, op, ": dilation ", Shape(p.dilation),
               " is not supported (average pooling has none, as in PyTorch)");
  for (int d = 0; d < spatial; ++d) {
    // The dilated extent, checked so that it cannot overflow in the window arithmetic.
    const int64_t extent = checked_add(checked_mul(dil[d], k[d] - 1, op), 1, op);
    TG_CHECK(pad[d] <= extent / 2, op, ": padding ", Shape(p.padding), " should be at most half of ",
             dil[d] == 1 ? "kernel_size " : "the dilated kernel (dilation * (kernel_size - 1) + 1) of kernel_size ",
             Shape(p.kernel_size), with_dilation(p.dilation), " (dim ", dim_name(spatial, d), ")");
  }
}

PoolProblem make_pool_problem(const char* op, PoolKind kind, int spatial, const Tensor& x, const PoolParams& params) {
  check_input(op, spatial, x);
  check_pool_params(op, kind, spatial, params);
  const std::vector<int64_t> k = expand(params.kernel_size, spatial);
  const std::vector<int64_t> s = params.stride.empty() ? k : expand(params.stride, spatial);
  const std::vector<int64_t> pad = expand(params.padding, spatial);
  const std::vector<int64_t> dil = expand(params.dilation, spatial);
  PoolProblem p;
  p.kind = kind;
  p.spatial = spatial;
  p.N = x.size(0);
  p.C = x.size(1);
  p.count_include_pad = params.count_include_pad;
  for (int d = 0; d < spatial; ++d) {
    const int slot = d + 3 - spatial;
    p.in[slot] = x.size(2 + d);
    p.kernel[slot] = k[d];
    p.stride[slot] = s[d];
    p.padding[slot] = pad[d];
    p.dilation[slot] = dil[d];
    // As PyTorch: a window over nothing but padding has no max (-inf) and no average (0 / 0).
    TG_CHECK_AS(ShapeError, p.in[slot] >= 1, op, ": input ", describe(x), " is empty in spatial dim ",
                dim_name(spatial, d));
    const int64_t out = pooled_size(op, p.in[slot], k[d], s[d], pad[d], dil[d], params.ceil_mode);
    TG_CHECK_AS(ShapeError, out >= 0, op, ": kernel_size ", Shape(params.kernel_size), with_dilation(params.dilation),
                " is larger than the padded input in dim ", dim_name(spatial, d), " (", p.in[slot] + 2 * pad[d],
                ") of ", describe(x));
    TG_CHECK_AS(ShapeError, out >= 1, op, ": output size ", out, " in dim ", dim_name(spatial, d), " of ",
                describe(x), " is too small");
    p.out[slot] = out;
    // Dilated windows over padding can miss every real element (a -inf max in PyTorch).
    const int64_t empty = first_window_without_input(p, slot);
    TG_CHECK_AS(ShapeError, empty < 0, op, ": the window of output position ", empty, " in dim ",
                dim_name(spatial, d), " holds no element of ", describe(x), " (kernel_size ",
                Shape(params.kernel_size), ", dilation ", Shape(params.dilation), ", padding ",
                Shape(params.padding), ")");
  }
  return p;
}

PoolProblem make_adaptive_pool_problem(const char* op, int spatial, const Tensor& x,
                                       const std::vector<int64_t>& output_size) {
  check_input(op, spatial, x);
  check_list(op, "output_size", output_size, spatial, 1);
  TG_CHECK(!output_size.empty(), op, ": output_size is required");
  const std::vector<int64_t> o = expand(output_size, spatial);
  PoolProblem p;
  p.kind = PoolKind::adaptive_avg;
  p.spatial = spatial;
  p.N = x.size(0);
  p.C = x.size(1);
  for (int d = 0; d < spatial; ++d) {
    const int slot = d + 3 - spatial;
    p.in[slot] = x.size(2 + d);
    p.out[slot] = o[d];
    TG_CHECK_AS(ShapeError, p.in[slot] >= 1, op, ": input ", describe(x), " is empty in spatial dim ",
                dim_name(spatial, d));
    // The window bounds multiply an index by the other size: keep that product in range.
    checked_mul(checked_add(p.in[slot], 1, op), checked_add(p.out[slot], 1, op), op, ": window bounds of ",
                describe(x), " to ", Shape(output_size));
  }
  return p;
}

void check_pool_problem(const char* op, const PoolProblem& p) {
  TG_CHECK((p.kind == PoolKind::max || p.kind == PoolKind::avg || p.kind == PoolKind::adaptive_avg) &&
               (p.spatial == 2 || p.spatial == 3),
           op, ": invalid problem: unknown kind ", static_cast<int>(p.kind), " or spatial rank ", p.spatial);
  bool sizes_positive = p.N >= 0 && p.C >= 0;
  for (int k = 0; k < 3; ++k) sizes_positive = sizes_positive && p.in[k] >= 1 && p.out[k] >= 1;
  TG_CHECK_AS(ShapeError, sizes_positive, op, ": invalid problem: negative N or C, or a spatial size below 1 ",
              describe_problem(p));
  // Both tensors must be addressable with int64 offsets, as a tensor of that shape would be.
  const int64_t in_dims[] = {p.N, p.C, p.in[0], p.in[1], p.in[2]};
  const int64_t out_dims[] = {p.N, p.C, p.out[0], p.out[1], p.out[2]};
  checked_extent(in_dims, op);
  checked_extent(out_dims, op);
  // A 2-D problem is a 3-D one whose D slot is the identity (ops/pool.h): its tensors hold no D.
  const bool unit_depth = p.in[0] == 1 && p.out[0] == 1 &&
                          (p.kind == PoolKind::adaptive_avg || (p.kernel[0] == 1 && p.stride[0] == 1 &&
                                                                p.padding[0] == 0 && p.dilation[0] == 1));
  TG_CHECK(p.spatial == 3 || unit_depth, op, ": invalid problem: a 2-D problem needs the identity in the D slot ",
           describe_problem(p));
  if (p.kind != PoolKind::adaptive_avg) {
    for (int k = 0; k < 3; ++k) check_window_dim(op, p, k);
    return;
  }
  // The adaptive window bounds multiply an index by the other size.
  for (int k = 0; k < 3; ++k)
    checked_mul(checked_add(p.in[k], 1, op), checked_add(p.out[k], 1, op), op, ": window bounds of ",
                describe_problem(p));
}

Shape pool_input_shape(const PoolProblem& p) {
  return p.spatial == 2 ? Shape{p.N, p.C, p.in[1], p.in[2]} : Shape{p.N, p.C, p.in[0], p.in[1], p.in[2]};
}

Shape pool_output_shape(const PoolProblem& p) {
  return p.spatial == 2 ? Shape{p.N, p.C, p.out[1], p.out[2]} : Shape{p.N, p.C, p.out[0], p.out[1], p.out[2]};
}

void check_pool_forward_buffers(const Tensor& out, const Tensor& indices, const Tensor& x, const PoolProblem& p) {
  const char* op = kind_name(p);
  check_pool_problem(op, p);
  check_same_device_dtype(op, out, x);
  TG_CHECK_AS(ShapeError, x.shape() == pool_input_shape(p) && out.shape() == pool_output_shape(p), op, ": input ",
              describe(x), " and output ", describe(out), " do not fit the problem (input ", pool_input_shape(p),
              ", output ", pool_output_shape(p), ")");
  if (p.kind == PoolKind::max) {
    TG_CHECK(indices.defined(), op, ": max pooling needs an indices buffer");
    TG_CHECK_AS(DTypeError, indices.dtype() == DType::i64, op, ": indices must be i64, got ", describe(indices));
    TG_CHECK_AS(DeviceError, indices.device() == x.device(), op, ": indices ", describe(indices), " and input ",
                describe(x), " are on different devices");
    TG_CHECK_AS(ShapeError, indices.shape() == out.shape(), op, ": indices ", describe(indices),
                " do not match the output ", describe(out));
  }
}

void check_pool_backward_buffers(const Tensor& dx, const Tensor& dy, const Tensor& indices, const PoolProblem& p) {
  const std::string op = std::string(kind_name(p)) + "_backward";
  check_pool_problem(op.c_str(), p);
  check_same_device_dtype(op.c_str(), dx, dy);
  TG_CHECK_AS(ShapeError, dy.shape() == pool_output_shape(p), op, ": gradient ", describe(dy),
              " does not match the output shape ", pool_output_shape(p));
  TG_CHECK_AS(ShapeError, dx.shape() == pool_input_shape(p), op, ": gradient buffer ", describe(dx),
              " does not match the input shape ", pool_input_shape(p));
  if (p.kind == PoolKind::max) {
    TG_CHECK(indices.defined(), op, ": max pooling's backward needs the indices");
    TG_CHECK_AS(DTypeError, indices.dtype() == DType::i64, op, ": indices must be i64, got ", describe(indices));
    TG_CHECK_AS(DeviceError, indices.device() == dy.device(), op, ": indices ", describe(indices), " and gradient ",
                describe(dy), " are on different devices");
    TG_CHECK_AS(ShapeError, indices.shape() == dy.shape(), op, ": indices ", describe(indices),
                " do not match the gradient ", describe(dy));
  }
}

Tensor max_pool2d(const Tensor& x, const PoolParams& p) { return max_pool("max_pool2d", 2, x, p).output; }
Tensor max_pool3d(const Tensor& x, const PoolParams& p) { return max_pool("max_pool3d", 3, x, p).output; }
MaxPoolResult max_pool2d_with_indices(const Tensor& x, const PoolParams& p) { return max_pool("max_pool2d", 2, x, p); }
MaxPoolResult max_pool3d_with_indices(const Tensor& x, const PoolParams& p) { return max_pool("max_pool3d", 3, x, p); }

Tensor avg_pool2d(const Tensor& x_in, const PoolParams& p) {
  const Tensor x = autocast_f32(x_in);  // f32 inside an Autocast scope (core/autocast.h)
  return avg_pool("avg_pool2d", x, make_pool_problem("avg_pool2d", PoolKind::avg, 2, x, p));
}
Tensor avg_pool3d(const Tensor& x_in, const PoolParams& p) {
  const Tensor x = autocast_f32(x_in);  // f32 inside an Autocast scope (core/autocast.h)
  return avg_pool("avg_pool3d", x, make_pool_problem("avg_pool3d", PoolKind::avg, 3, x, p));
}
Tensor adaptive_avg_pool2d(const Tensor& x_in, const std::vector<int64_t>& output_size) {
  const Tensor x = autocast_f32(x_in);  // f32 inside an Autocast scope (core/autocast.h)
  return avg_pool("adaptive_avg_pool2d", x, make_adaptive_pool_problem("adaptive_avg_pool2d", 2, x, output_size));
}
Tensor adaptive_avg_pool3d(const Tensor& x_in, const std::vector<int64_t>& output_size) {
  const Tensor x = autocast_f32(x_in);  // f32 inside an Autocast scope (core/autocast.h)
  return avg_pool("adaptive_avg_pool3d", x, make_adaptive_pool_problem("adaptive_avg_pool3d", 3, x, output_size));
}

Tensor max_pool_backward(const Tensor& dy, const Tensor& indices, const PoolProblem& p) {
  TG_CHECK(p.kind == PoolKind::max, "max_pool_backward: the problem is not a max pooling");
  check_pool_problem("max_pool_backward", p);  // before dx is allocated from it
  check_floating("max_pool_backward", dy);
  profile::OpScope scope("max_pool_backward", [&] { return pool_info(p, dy, indices, true); });
  Tensor dx = Tensor::empty(pool_input_shape(p), {.dtype = dy.dtype(), .device = dy.device()});
  TG_DISPATCH(dy.device(), pool_backward(dx, dy, indices, p));
  return dx;
}

Tensor avg_pool_backward(const Tensor& dy, const PoolProblem& p) {
  TG_CHECK(p.kind != PoolKind::max, "avg_pool_backward: the problem is a max pooling");
  check_pool_problem("avg_pool_backward", p);  // before dx is allocated from it
  check_floating("avg_pool_backward", dy);
  profile::OpScope scope("avg_pool_backward", [&] { return pool_info(p, dy, kNoIndices, true); });
  Tensor dx = Tensor::empty(pool_input_shape(p), {.dtype = dy.dtype(), .device = dy.device()});
  TG_DISPATCH(dy.device(), pool_backward(dx, dy, Tensor(), p));
  return dx;
}

}  // namespace tg
