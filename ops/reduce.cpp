#include "ops/reduce.h"

#include <algorithm>

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/cpu/kernels.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/half_compute.h"
#include "ops/reduce_index.h"
#include "ops/broadcast.h"
#include "ops/checks.h"
#if TG_CUDA
#include "ops/cuda/kernels.h"
#endif

namespace tg {

ReduceIndex make_reduce_index(const Shape& in, const std::vector<bool>& reduced) {
  ReduceIndex ix;
  auto strides = contiguous_strides(in);
  // Walk from the innermost dimension outwards, merging a dimension into the previous
  // group when both are of the same kind and contiguous with each other.
  struct Group { bool red; int64_t size, stride; };
  std::vector<Group> groups;
  for (int64_t d = in.rank() - 1; d >= 0; --d) {
    if (in[d] == 1) continue;  // size-1 dims change nothing
    bool red = reduced[d];
    if (!groups.empty() && groups.back().red == red &&
        groups.back().stride * groups.back().size == strides[d]) {
      groups.back().size *= in[d];
    } else {
      groups.push_back({red, in[d], strides[d]});
    }
  }
  std::reverse(groups.begin(), groups.end());
  for (const Group& g : groups) {
    if (g.red) {
      ix.red_sizes[ix.red_rank] = g.size;
      ix.red_strides[ix.red_rank++] = g.stride;
      ix.red_count *= g.size;
    } else {
      ix.kept_sizes[ix.kept_rank] = g.size;
      ix.kept_strides[ix.kept_rank++] = g.stride;
      ix.out_count *= g.size;
    }
  }
  if (in.numel() == 0) {  // empty input: outputs are zero sums
    ix.red_count = 0;
    ix.out_count = 1;
    for (int64_t d = 0; d < in.rank(); ++d)
      if (!reduced[d]) ix.out_count *= in[d];
  }
  return ix;
}

namespace {

// Normalizes dims (negative, duplicates) into a per-dimension flag.
std::vector<bool> reduced_flags(const char* op, const Shape& s, const std::vector<int64_t>& dims) {
  std::vector<bool> red(static_cast<size_t>(s.rank()), false);
  for (int64_t d : dims) {
    TG_CHECK_AS(ShapeError, d >= -s.rank() && d < s.rank(), op, ": dim ", d, " out of range for shape ", s);
    int64_t k = d < 0 ? d + s.rank() : d;
    TG_CHECK_AS(ShapeError, !red[k], op, ": dim ", d, " listed twice for shape ", s);
    red[k] = true;
  }
  return red;
}

Shape reduced_shape(const Shape& s, const std::vector<bool>& red, bool keepdim) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < s.rank(); ++d) {
    if (!red[d]) out.push_back(s[d]);
    else if (keepdim) out.push_back(1);
  }
  return Shape(out);
}

// Profiler costs (core/profiler.h): a reduction is 1 FLOP per input element (mean adds one
// per output for the scale); expand 0. Bytes: input read once, output written once. The
// backward of sum/mean is an expand of the gradient (times the scale: 1 FLOP per element),
// the backward of expand a sum.
static profile::OpInfo reduce_info(const Tensor& in, const Shape& out, double flops) {
  return {{&in}, flops, static_cast<double>(in.nbytes() + out.numel() * dtype_size(in.dtype()))};
}

Tensor sum_impl(const char* op, const Tensor& x, const std::vector<bool>& red, bool keepdim, double scale) {
  check_floating(op, x);
  Shape out_shape = reduced_shape(x.shape(), red, keepdim);
  profile::OpScope scope(op, [&] {
    return reduce_info(x, out_shape, static_cast<double>(x.numel()) + (scale != 1.0 ? out_shape.numel() : 0));
  });
  Tensor out = Tensor::empty(out_shape, {.dtype = x.dtype(), .device = x.device()});
  ReduceIndex ix = make_reduce_index(x.shape(), red);
  {
    NoGradGuard inner;  // the scaling below is part of this op, not a separate tape entry
    TG_DISPATCH(x.device(), sum(out, x, ix));
    if (scale != 1.0) TG_DISPATCH(x.device(), affine(out, out, scale, 0.0));
  }
  if (should_record({x})) {
    Shape keep_shape = reduced_shape(x.shape(), red, true);
    record(op, {x}, {out}, {}, [op, in_shape = x.shape(), keep_shape, scale](const BackwardArgs& args) {
      profile::OpScope scope(op, [&] {
        profile::OpInfo info =
            reduce_info(args.grad_outputs[0], in_shape, scale != 1.0 ? static_cast<double>(in_shape.numel()) : 0);
        info.name = std::string(op) == "mean" ? "mean (backward)" : "sum (backward)";
        return info;
      });
      Tensor g = args.grad_outputs[0].reshape(keep_shape);
      if (scale != 1.0) g = mul(g, scale);
      return std::vector<Tensor>{expand(g, in_shape)};
    });
  }
  return out;
}

double count_of(const Shape& s, const std::vector<bool>& red) {
  double n = 1;
  for (int64_t d = 0; d < s.rank(); ++d)
    if (red[d]) n *= static_cast<double>(s[d]);
  return n;
}

}  // namespace

Tensor sum(const Tensor& x) {
  if (any_half(x)) return compute_in_f32("sum", {x}, [](const std::vector<Tensor>& v) { return sum(v[0]); });
  check_floating("sum", x);
  return sum_impl("sum", x, std::vector<bool>(static_cast<size_t>(x.dim()), true), false, 1.0);
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  if (any_half(x))
    return compute_in_f32("sum", {x}, [&](const std::vector<Tensor>& v) { return sum(v[0], dims, keepdim); });
  check_floating("sum", x);
  return sum_impl("sum", x, reduced_flags("sum", x.shape(), dims), keepdim, 1.0);
}

Tensor mean(const Tensor& x) {
  if (any_half(x)) return compute_in_f32("mean", {x}, [](const std::vector<Tensor>& v) { return mean(v[0]); });
  check_floating("mean", x);
  TG_CHECK_AS(ShapeError, x.numel() > 0, "mean: empty tensor ", describe(x));
  std::vector<bool> red(static_cast<size_t>(x.dim()), true);
  return sum_impl("mean", x, red, false, 1.0 / count_of(x.shape(), red));
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  if (any_half(x))
    return compute_in_f32("mean", {x}, [&](const std::vector<Tensor>& v) { return mean(v[0], dims, keepdim); });
  check_floating("mean", x);
  auto red = reduced_flags("mean", x.shape(), dims);
  TG_CHECK_AS(ShapeError, count_of(x.shape(), red) > 0, "mean: reducing over an empty dimension of ", describe(x));
  return sum_impl("mean", x, red, keepdim, 1.0 / count_of(x.shape(), red));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  TG_CHECK_AS(ShapeError, shape.rank() <= x.dim(), "sum_to: cannot reduce ", describe(x), " to shape ", shape);
  int64_t lead = x.dim() - shape.rank();
  std::vector<bool> red(static_cast<size_t>(x.dim()), false);
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead) {
      red[d] = true;
    } else {
      int64_t t = shape[d - lead];
      TG_CHECK_AS(ShapeError, t == x.size(d) || t == 1, "sum_to: cannot reduce ", describe(x), " to shape ", shape);
      red[d] = (t == 1 && x.size(d) != 1);
    }
  }
  return sum_impl("sum", x, red, false, 1.0).reshape(shape);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  check_floating("expand", x);
  if (x.shape() == shape) return x;
  checked_tensor_bytes("expand", shape, x.dtype());  // negative or overflowing target sizes
  TG_CHECK_AS(ShapeError, broadcast_shape("expand", x.shape(), shape) == shape, "expand: ", describe(x),
              " does not broadcast to ", shape);
  // Broadcasting x against a zero scalar into an output of the target shape is the
  // expansion: the binary kernel serves both.
  profile::OpScope scope("expand", [&] { return reduce_info(x, shape, 0); });
  Tensor zero = zeros(Shape{}, {.dtype = x.dtype(), .device = x.device()});
  Tensor out = Tensor::empty(shape, {.dtype = x.dtype(), .device = x.device()});
  TG_DISPATCH(x.device(), binary(BinaryOp::add, out, x, zero));
  if (should_record({x})) {
    record("expand", {x}, {out}, {}, [in_shape = x.shape()](const BackwardArgs& args) {
      const Tensor& g = args.grad_outputs[0];
      profile::OpScope scope("expand (backward)", [&] { return reduce_info(g, in_shape, static_cast<double>(g.numel())); });
      return std::vector<Tensor>{sum_to(args.grad_outputs[0], in_shape)};
    });
  }
  return out;
}

}  // namespace tg
