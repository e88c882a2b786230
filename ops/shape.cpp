// The shape family's public functions: validation, device dispatch, the tape entries.
#include "ops/shape.h"

#include <string>

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/cpu/shape_pool_kernels.h"
#include "ops/dispatch.h"
#if TG_CUDA
#include "ops/cuda/shape_pool_kernels.h"
#endif

namespace tg {

namespace {

// Defined, and on one device with one dtype. Any dtype: these ops only move values, so
// index tensors may be cut and joined too (only floating ones are ever recorded).
void check_same_kind(const char* op, const Tensor& a, const Tensor& b) {
  TG_CHECK(a.defined() && b.defined(), op, ": an input is an undefined tensor");
  TG_CHECK_AS(DeviceError, a.device() == b.device(), op, ": tensors on different devices: ", describe(a), " and ",
              describe(b));
  TG_CHECK_AS(DTypeError, a.dtype() == b.dtype(), op, ": dtypes differ: ", describe(a), " and ", describe(b));
}

int64_t product(const Shape& s, int64_t begin, int64_t end) {
  int64_t r = 1;
  for (int64_t d = begin; d < end; ++d) r *= s[d];  // a factor of numel(), which is checked
  return r;
}

TensorOptions like(const Tensor& t) { return {.dtype = t.dtype(), .device = t.device()}; }

// Profiler costs (core/profiler.h): the shape ops copy, 0 FLOPs; bytes: what they read
// once (the window, for narrow / slice / split) and what they write once.
const char* backward_name(const char* op) {
  const std::string o = op;
  if (o == "narrow") return "narrow (backward)";
  if (o == "slice") return "slice (backward)";
  if (o == "split") return "split (backward)";
  return o == "chunk" ? "chunk (backward)" : "shape op (backward)";
}

// Copies the window p of x into a new tensor and records the scatter backward.
Tensor gather_window(const char* op, const Tensor& x, int64_t dim, const SliceProblem& p) {
  const Shape out_shape = slice_shape(x.shape(), dim, p.length);
  profile::OpScope scope(op, [&] {
    return profile::OpInfo{{&x}, 0, 2.0 * static_cast<double>(out_shape.numel() * dtype_size(x.dtype()))};
  });
  Tensor out = Tensor::empty(out_shape, like(x));
  TG_DISPATCH(x.device(), slice_gather(out, x, p));
  if (should_record({x})) {
    record(op, {x}, {out}, {}, [op, p, shape = x.shape(), opts = like(x)](const BackwardArgs& args) {
      profile::OpScope scope(op, [&] {  // zero dx, then scatter the window
        const Tensor& g = args.grad_outputs[0];
        return profile::OpInfo{{&g}, 0, static_cast<double>(g.nbytes() + shape.numel() * dtype_size(opts.dtype)),
                               false, backward_name(op)};
      });
      Tensor dx = zeros(shape, opts);
      TG_DISPATCH(opts.device, slice_scatter(dx, args.grad_outputs[0], p));
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

// The pieces of x along dim with these sizes (already checked to sum to the dim's size).
std::vector<Tensor> split_sizes(const char* op, const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  profile::OpScope scope(op, [&] { return profile::OpInfo{{&x}, 0, 2.0 * static_cast<double>(x.nbytes())}; });
  std::vector<Tensor> outs;
  int64_t offset = 0;
  for (int64_t len : sizes) {
    const SliceProblem p = make_slice_problem(op, x.shape(), dim, offset, len, 1);
    Tensor piece = Tensor::empty(slice_shape(x.shape(), dim, len), like(x));
    TG_DISPATCH(x.device(), slice_gather(piece, x, p));
    outs.push_back(piece);
    offset += len;
  }
  if (should_record({x})) {
    // The gradient of x is the pieces' gradients joined again; the tape passes zeros for
    // pieces nothing used.
    record(op, {x}, outs, {}, [op, dim](const BackwardArgs& args) {
      profile::OpScope scope(op, [&] {
        double bytes = 0;
        for (const Tensor& g : args.grad_outputs) bytes += 2.0 * static_cast<double>(g.nbytes());
        return profile::OpInfo{{&args.grad_outputs[0]}, 0, bytes, false, backward_name(op)};
      });
      return std::vector<Tensor>{cat(args.grad_outputs, dim)};
    });
  }
  return outs;
}

}  // namespace

int64_t normalize_dim(const char* op, int64_t dim, const Shape& shape) {
  const int64_t rank = shape.rank();
  TG_CHECK_AS(ShapeError, dim >= -rank && dim < rank, op, ": dim ", dim, " is out of range for a tensor of shape ",
              shape, " (rank ", rank, ")");
  return dim < 0 ? dim + rank : dim;
}

Shape slice_shape(const Shape& big, int64_t dim, int64_t length) {
  std::vector<int64_t> dims = big.dims();
  dims[static_cast<size_t>(dim)] = length;
  return Shape(dims);
}

SliceProblem make_slice_problem(const char* op, const Shape& big, int64_t dim, int64_t start, int64_t length,
                                int64_t step) {
  TG_CHECK_AS(ShapeError, dim >= 0 && dim < big.rank(), op, ": dim ", dim, " is out of range for ", big);
  SliceProblem p;
  p.outer = product(big, 0, dim);
  p.dim_size = big[dim];
  p.inner = product(big, dim + 1, big.rank());
  p.start = start;
  p.length = length;
  p.step = step;
  TG_CHECK_AS(ShapeError, step >= 1 && length >= 0 && start >= 0 && start <= p.dim_size, op, ": window start ",
              start, ", length ", length, ", step ", step, " does not fit dim ", dim, " of ", big);
  if (length > 0) {
    const int64_t last = checked_add(start, checked_mul(length - 1, step, op), op);
    TG_CHECK_AS(ShapeError, last < p.dim_size, op, ": window start ", start, ", length ", length, ", step ", step,
                " ends past dim ", dim, " of ", big);
  }
  return p;
}

void check_slice_buffers(const char* op, const Tensor& big, const Tensor& small, const SliceProblem& p) {
  check_same_kind(op, big, small);
  TG_CHECK_AS(ShapeError, p.outer >= 0 && p.inner >= 0 && p.dim_size >= 0 && p.step >= 1 && p.start >= 0 &&
                              p.length >= 0,
              op, ": invalid window (start ", p.start, ", length ", p.length, ", step ", p.step, ")");
  const int64_t big_n = checked_mul(checked_mul(p.outer, p.dim_size, op), p.inner, op);
  const int64_t small_n = checked_mul(checked_mul(p.outer, p.length, op), p.inner, op);
  TG_CHECK_AS(ShapeError, big.numel() == big_n && small.numel() == small_n, op, ": buffers ", describe(big), " and ",
              describe(small), " do not fit the window (outer ", p.outer, ", dim ", p.dim_size, ", inner ", p.inner,
              ", length ", p.length, ")");
  if (p.length > 0) {
    const int64_t last = checked_add(p.start, checked_mul(p.length - 1, p.step, op), op);
    TG_CHECK_AS(ShapeError, last < p.dim_size, op, ": window ends at ", last, ", past the dim's size ", p.dim_size);
  }
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TG_CHECK_AS(ShapeError, !tensors.empty(), "cat: expected at least one tensor");
  const Tensor& first = tensors[0];
  TG_CHECK(first.defined(), "cat: tensor 0 is undefined");
  TG_CHECK_AS(ShapeError, first.dim() > 0, "cat: zero-dimensional tensor ", describe(first), " cannot be concatenated");
  const int64_t d = normalize_dim("cat", dim, first.shape());
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check_same_kind("cat", first, t);
    bool fits = t.dim() == first.dim();
    for (int64_t k = 0; fits && k < first.dim(); ++k) fits = k == d || t.size(k) == first.size(k);
    TG_CHECK_AS(ShapeError, fits, "cat: tensor ", i, " ", describe(t), " does not match tensor 0 ", describe(first),
                " outside dim ", dim);
    total = checked_add(total, t.size(d), "cat");
  }
  profile::OpScope scope("cat", [&] {
    profile::OpInfo info{{}, 0, 0};
    for (const Tensor& t : tensors) info.inputs.push_back(&t), info.bytes += 2.0 * static_cast<double>(t.nbytes());
    return info;
  });
  Tensor out = Tensor::empty(slice_shape(first.shape(), d, total), like(first));
  int64_t offset = 0;
  std::vector<SliceProblem> windows;
  for (const Tensor& t : tensors) {
    windows.push_back(make_slice_problem("cat", out.shape(), d, offset, t.size(d), 1));
    TG_DISPATCH(out.device(), slice_scatter(out, t, windows.back()));
    offset += t.size(d);
  }
  if (should_record(tensors)) {
    record("cat", tensors, {out}, {}, [windows, d](const BackwardArgs& args) {
      const Tensor& dy = args.grad_outputs[0];
      profile::OpScope scope("cat (backward)", [&] {
        return profile::OpInfo{{&dy}, 0, 2.0 * static_cast<double>(dy.nbytes())};
      });
      std::vector<Tensor> grads(windows.size());
      for (size_t i = 0; i < windows.size(); ++i) {
        if (!args.needs_grad[i]) continue;
        grads[i] = Tensor::empty(slice_shape(dy.shape(), d, windows[i].length), like(dy));
        TG_DISPATCH(dy.device(), slice_gather(grads[i], dy, windows[i]));
      }
      return grads;
    });
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  TG_CHECK(x.defined(), "split: the input is an undefined tensor");
  const int64_t d = normalize_dim("split", dim, x.shape());
  const int64_t n = x.size(d);
  TG_CHECK_AS(ShapeError, split_size > 0 || (split_size == 0 && n == 0), "split: split_size ", split_size,
              " must be positive (dim ", dim, " of ", describe(x), ")");
  std::vector<int64_t> sizes;
  if (n == 0) sizes.push_back(0);  // PyTorch returns one empty piece
  for (int64_t off = 0; off < n; off += split_size) sizes.push_back(std::min(split_size, n - off));
  return split_sizes("split", x, sizes, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  TG_CHECK(x.defined(), "split: the input is an undefined tensor");
  const int64_t d = normalize_dim("split", dim, x.shape());
  TG_CHECK_AS(ShapeError, !sizes.empty(), "split: no sizes given for ", describe(x));
  int64_t total = 0;
  for (int64_t s : sizes) {
    TG_CHECK_AS(ShapeError, s >= 0, "split: negative size ", s, " in ", Shape(sizes));
    total = checked_add(total, s, "split");
  }
  TG_CHECK_AS(ShapeError, total == x.size(d), "split: sizes ", Shape(sizes), " sum to ", total, ", not to dim ", dim,
              " of ", describe(x), " (", x.size(d), ")");
  return split_sizes("split", x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  TG_CHECK(x.defined(), "chunk: the input is an undefined tensor");
  TG_CHECK_AS(ShapeError, chunks > 0, "chunk: chunks must be positive, got ", chunks, " for ", describe(x));
  const int64_t d = normalize_dim("chunk", dim, x.shape());
  const int64_t n = x.size(d);
  const int64_t size = n == 0 ? 0 : (n - 1) / chunks + 1;  // ceil(n / chunks) without overflow
  std::vector<int64_t> sizes;
  if (n == 0) sizes.push_back(0);
  for (int64_t off = 0; off < n; off += size) sizes.push_back(std::min(size, n - off));
  return split_sizes("chunk", x, sizes, d);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  TG_CHECK(x.defined(), "narrow: the input is an undefined tensor");
  const int64_t d = normalize_dim("narrow", dim, x.shape());
  const int64_t n = x.size(d);
  TG_CHECK_AS(ShapeError, start >= -n && start <= n, "narrow: start ", start, " is out of range for dim ", dim,
              " of ", describe(x));
  const int64_t s = start < 0 ? start + n : start;
  TG_CHECK_AS(ShapeError, length >= 0 && length <= n - s, "narrow: start ", start, " + length ", length,
              " exceeds dim ", dim, " of ", describe(x), " (size ", n, ")");
  return gather_window("narrow", x, d, make_slice_problem("narrow", x.shape(), d, s, length, 1));
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  TG_CHECK(x.defined(), "slice: the input is an undefined tensor");
  const int64_t d = normalize_dim("slice", dim, x.shape());
  TG_CHECK_AS(ShapeError, step > 0, "slice: step must be positive, got ", step, " (dim ", dim, " of ", describe(x),
              ")");
  const int64_t n = x.size(d);
  auto clamp_index = [n](int64_t i) {
    if (i < 0) i = i < -n ? 0 : i + n;
    return i > n ? n : i;
  };
  const int64_t s = clamp_index(start), e = clamp_index(end);
  const int64_t length = e > s ? (e - s - 1) / step + 1 : 0;
  return gather_window("slice", x, d, make_slice_problem("slice", x.shape(), d, std::min(s, n), length, step));
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  TG_CHECK(x.defined(), "flatten: the input is an undefined tensor");
  if (x.dim() == 0) return x.reshape({1});
  const int64_t s = normalize_dim("flatten", start_dim, x.shape());
  const int64_t e = normalize_dim("flatten", end_dim, x.shape());
  TG_CHECK_AS(ShapeError, s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " for ",
              describe(x));
  std::vector<int64_t> dims;
  for (int64_t k = 0; k < s; ++k) dims.push_back(x.size(k));
  dims.push_back(checked_numel(std::vector<int64_t>(x.shape().begin() + s, x.shape().begin() + e + 1), "flatten"));
  for (int64_t k = e + 1; k < x.dim(); ++k) dims.push_back(x.size(k));
  return x.reshape(Shape(dims));
}

Tensor unflatten(const Tensor& x, int64_t dim, const std::vector<int64_t>& sizes) {
  TG_CHECK(x.defined(), "unflatten: the input is an undefined tensor");
  const int64_t d = normalize_dim("unflatten", dim, x.shape());
  TG_CHECK_AS(ShapeError, !sizes.empty(), "unflatten: no sizes given for dim ", dim, " of ", describe(x));
  int64_t infer = -1;
  std::vector<int64_t> known;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1 && infer < 0) {
      infer = static_cast<int64_t>(i);
      continue;
    }
    TG_CHECK_AS(ShapeError, sizes[i] >= 0, "unflatten: invalid size ", sizes[i], " in ", Shape(sizes),
                " (at most one -1)");
    known.push_back(sizes[i]);
  }
  const int64_t n = x.size(d);
  const int64_t prod = checked_numel(known, "unflatten");
  std::vector<int64_t> resolved = sizes;
  if (infer >= 0) {
    TG_CHECK_AS(ShapeError, prod > 0 && n % prod == 0, "unflatten: cannot infer -1 in ", Shape(sizes), " for dim ",
                dim, " of ", describe(x), " (size ", n, ")");
    resolved[static_cast<size_t>(infer)] = n / prod;
  } else {
    TG_CHECK_AS(ShapeError, prod == n, "unflatten: sizes ", Shape(sizes), " (product ", prod, ") do not match dim ",
                dim, " of ", describe(x), " (size ", n, ")");
  }
  std::vector<int64_t> dims(x.shape().begin(), x.shape().begin() + d);
  dims.insert(dims.end(), resolved.begin(), resolved.end());
  dims.insert(dims.end(), x.shape().begin() + d + 1, x.shape().end());
  TG_CHECK_AS(ShapeError, static_cast<int64_t>(dims.size()) <= kMaxDims, "unflatten: the result would have ",
              dims.size(), " dims, more than ", kMaxDims, " (", describe(x), " with ", Shape(sizes), " at dim ", dim,
              ")");
  return x.reshape(Shape(dims));
}

}  // namespace tg
