// The upsample family's public functions: validation, the problem and its tables, device
// dispatch, the tape entry (which saves nothing: backward needs only the problem).
#include "ops/upsample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/half_compute.h"
#if TG_CUDA
#include "ops/cuda/upsample.h"
#endif

namespace tg {
namespace {

const char* mode_name(UpsampleMode m) {
  switch (m) {
    case UpsampleMode::nearest: return "upsample_nearest";
    case UpsampleMode::bilinear: return "upsample_bilinear2d";
    case UpsampleMode::trilinear: return "upsample_trilinear3d";
  }
  return "upsample";
}

// One dim's forward taps (source index and weight per output index, `taps` each) with the
// coordinate arithmetic of PyTorch's CPU kernels (UpSample.h), in type R.
template <class R>
void linear_taps(int64_t in, int64_t out, double scale, bool align_corners, std::vector<int64_t>& idx,
                 std::vector<double>& w) {
  R r;
  if (align_corners) r = out > 1 ? static_cast<R>(in - 1) / static_cast<R>(out - 1) : R(0);
  else r = scale > 0 ? static_cast<R>(1.0 / scale) : static_cast<R>(in) / static_cast<R>(out);
  idx.reserve(2 * static_cast<size_t>(out));
  w.reserve(2 * static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    int64_t i0, i1;
    R l0, l1;
    if (in == out) {
      i0 = i1 = o;
      l0 = 1;
      l1 = 0;
    } else {
      R src = align_corners ? r * static_cast<R>(o) : r * (static_cast<R>(o) + R(0.5)) - R(0.5);
      if (!align_corners && src < 0) src = 0;
      i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
      l1 = std::min(std::max(src - static_cast<R>(i0), R(0)), R(1));
      i1 = i0 + (i0 < in - 1 ? 1 : 0);
      l0 = R(1) - l1;
    }
    idx.push_back(i0);
    idx.push_back(i1);
    w.push_back(l0);
    w.push_back(l1);
  }
}

void nearest_taps(int64_t in, int64_t out, double scale, std::vector<int64_t>& idx, std::vector<double>& w) {
  const float r = scale > 0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / static_cast<float>(out);
  idx.reserve(static_cast<size_t>(out));
  w.reserve(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    int64_t i;
    if (out == in) i = o;
    else if (out == 2 * in) i = o >> 1;
    else i = std::min(static_cast<int64_t>(std::floor(static_cast<float>(o) * r)), in - 1);
    idx.push_back(i);
    w.push_back(1.0);
  }
}

// The 8-byte entries the tables hold at most, per dim: out * taps source indices and
// weights; in + 1 row starts and up to out * taps (output, weight) pairs for the transpose.
// In double: a caller's problem may ask for more than int64 counts.
double table_entries(const UpsampleProblem& p) {
  double entries = 0;
  for (int d = 0; d < 3; ++d)
    entries += 4.0 * static_cast<double>(p.out[d]) * p.taps() + static_cast<double>(p.in[d]) + 1;
  return entries;
}

[[noreturn]] void throw_tables_too_large(const UpsampleProblem& p) {
  const double bytes = 8 * table_entries(p);
  const auto requested = bytes < 0x1p63 ? static_cast<std::size_t>(bytes) : std::numeric_limits<std::size_t>::max();
  throw OutOfMemory(detail::concat("upsample: out of host memory for the index tables of output size [", p.out[0],
                                   ", ", p.out[1], ", ", p.out[2], "] (about ", bytes, " bytes)"),
                    requested, 0);
}

UpsampleTables build_tables(const UpsampleProblem& p, DType dtype) {
  UpsampleTables t;
  const int K = p.taps();
  t.layout.taps = K;
  for (int d = 0; d < 3; ++d) {
    std::vector<int64_t> idx;
    std::vector<double> w;
    if (p.mode == UpsampleMode::nearest) nearest_taps(p.in[d], p.out[d], p.scale[d], idx, w);
    else if (dtype == DType::f32) linear_taps<float>(p.in[d], p.out[d], p.scale[d], p.align_corners, idx, w);
    else linear_taps<double>(p.in[d], p.out[d], p.scale[d], p.align_corners, idx, w);
    t.layout.fwd_index[d] = static_cast<int64_t>(t.ints.size());
    t.ints.insert(t.ints.end(), idx.begin(), idx.end());
    t.layout.fwd_weight[d] = static_cast<int64_t>(t.reals.size());
    t.reals.insert(t.reals.end(), w.begin(), w.end());
    // The transpose, as CSR over input indices; zero weights (the unused second tap at a
    // border, or an exact hit) are left out. Outputs ascend within each row: the gather's
    // fixed order.
    std::vector<int64_t> count(static_cast<size_t>(p.in[d]) + 1, 0);
    for (size_t e = 0; e < idx.size(); ++e)
      if (w[e] != 0) ++count[static_cast<size_t>(idx[e]) + 1];
    for (size_t i = 1; i < count.size(); ++i) count[i] += count[i - 1];
    std::vector<int64_t> outs(static_cast<size_t>(count.back())), fill(count.begin(), count.end() - 1);
    std::vector<double> ws(outs.size());
    for (size_t e = 0; e < idx.size(); ++e) {
      if (w[e] == 0) continue;
      const int64_t at = fill[static_cast<size_t>(idx[e])]++;
      outs[static_cast<size_t>(at)] = static_cast<int64_t>(e) / K;
      ws[static_cast<size_t>(at)] = w[e];
    }
    t.layout.bwd_offset[d] = static_cast<int64_t>(t.ints.size());
    t.ints.insert(t.ints.end(), count.begin(), count.end());
    t.layout.bwd_output[d] = static_cast<int64_t>(t.ints.size());
    t.ints.insert(t.ints.end(), outs.begin(), outs.end());
    t.layout.bwd_weight[d] = static_cast<int64_t>(t.reals.size());
    t.reals.insert(t.reals.end(), ws.begin(), ws.end());
  }
  return t;
}

}  // namespace

// The tables grow with the output's spatial size, not its element count: a size the output
// tensor could hold may still need more host memory than there is. That is a typed error,
// and sizes no vector can hold are refused before any allocation is tried.
UpsampleTables upsample_tables(const UpsampleProblem& p, DType dtype) {
  if (table_entries(p) > static_cast<double>(std::vector<int64_t>().max_size())) throw_tables_too_large(p);
  try {
    return build_tables(p, dtype);
  } catch (const std::bad_alloc&) {
    throw_tables_too_large(p);
  }
}

void check_upsample_buffers(const char* op, const Tensor& y, const Tensor& x, const UpsampleProblem& p) {
  check_floating(op, x);
  check_same_device_dtype(op, x, y);
  bool ok = p.NC >= 0;
  for (int d = 0; d < 3; ++d) ok = ok && p.in[d] > 0 && p.out[d] > 0;
  TG_CHECK(ok, op, ": invalid problem NC=", p.NC, " in=[", p.in[0], ", ", p.in[1], ", ", p.in[2], "] out=[", p.out[0],
           ", ", p.out[1], ", ", p.out[2], "]");
  // A scale factor, where one was given, must be the one the output size came from, as
  // upsample() builds it: a tiny or NaN one would send the source indices out of the input.
  for (int d = 0; d < 3; ++d)
    TG_CHECK(p.scale[d] == 0 || (std::isfinite(p.scale[d]) && p.scale[d] > 0 &&
                                 std::floor(static_cast<double>(p.in[d]) * p.scale[d]) == static_cast<double>(p.out[d])),
             op, ": invalid problem: scale factor ", p.scale[d], " does not give output size ", p.out[d],
             " from input size ", p.in[d]);
  // Checked: a caller's problem may hold sizes whose product wraps.
  const int64_t in_dims[] = {p.NC, p.in[0], p.in[1], p.in[2]}, out_dims[] = {p.NC, p.out[0], p.out[1], p.out[2]};
  const int64_t in_numel = checked_numel(in_dims, op), out_numel = checked_numel(out_dims, op);
  TG_CHECK_AS(ShapeError, x.numel() == in_numel && y.numel() == out_numel, op, ": input ", describe(x),
              " and output ", describe(y), " must hold ", in_numel, " and ", out_numel, " elements");
}

// Profiler costs (core/profiler.h): nearest copies (0 FLOPs); bilinear and trilinear blend
// 2^S taps per output element, a multiply and an add each; the backward scatters the same.
// Bytes: x (or dy) read once, the result written once.
static profile::OpInfo upsample_info(const UpsampleProblem& p, const Tensor& in, int64_t spatial, bool backward) {
  const double outs = static_cast<double>(p.NC) * static_cast<double>(p.out[0] * p.out[1] * p.out[2]);
  const double ins = static_cast<double>(p.NC) * static_cast<double>(p.in[0] * p.in[1] * p.in[2]);
  const double flops = p.mode == UpsampleMode::nearest ? 0 : outs * 2.0 * static_cast<double>(int64_t{1} << spatial);
  const double e = static_cast<double>(dtype_size(in.dtype()));
  profile::OpInfo info{{&in}, flops, (ins + outs) * e};
  if (backward) {
    switch (p.mode) {
      case UpsampleMode::nearest: info.name = "upsample_nearest (backward)"; break;
      case UpsampleMode::bilinear: info.name = "upsample_bilinear2d (backward)"; break;
      case UpsampleMode::trilinear: info.name = "upsample_trilinear3d (backward)"; break;
    }
  }
  return info;
}

Tensor upsample(const Tensor& x_in, const UpsampleParams& params) {
  const Tensor x = autocast_f32(x_in);  // f32 inside an Autocast scope (core/autocast.h)
  const char* op = mode_name(params.mode);
  check_floating(op, x);
  const int64_t S = x.dim() - 2;  // spatial dims
  if (params.mode == UpsampleMode::nearest)
    TG_CHECK_AS(ShapeError, S == 2 || S == 3, op, ": expects a 4-D (N, C, H, W) or 5-D (N, C, D, H, W) input, got ",
                describe(x));
  else
    TG_CHECK_AS(ShapeError, S == (params.mode == UpsampleMode::bilinear ? 2 : 3), op, ": expects a ",
                params.mode == UpsampleMode::bilinear ? "4-D (N, C, H, W)" : "5-D (N, C, D, H, W)", " input, got ",
                describe(x));
  TG_CHECK(params.scale_factor.empty() != params.size.empty(), op,
           ": exactly one of scale_factor and size must be given");
  TG_CHECK(!params.align_corners || params.mode != UpsampleMode::nearest, op,
           ": align_corners can only be set with the interpolating modes (bilinear, trilinear)");
  const size_t n = std::max(params.scale_factor.size(), params.size.size());
  TG_CHECK(n == 1 || n == size_t(S), op, ": ", params.size.empty() ? "scale_factor" : "size", " needs 1 or ", S,
           " values, got ", n);

  UpsampleProblem p{.NC = x.size(0) * x.size(1), .mode = params.mode, .align_corners = params.align_corners};
  const int first = 3 - static_cast<int>(S);  // a 2-D problem leaves dim 0 at 1
  for (int64_t s = 0; s < S; ++s) {
    const int d = first + static_cast<int>(s);
    const int64_t in = x.size(2 + s);
    TG_CHECK_AS(ShapeError, in > 0, op, ": input ", describe(x), " has an empty spatial dim");
    if (!params.scale_factor.empty()) {
      const double f = params.scale_factor[n == 1 ? 0 : static_cast<size_t>(s)];
      TG_CHECK(std::isfinite(f) && f > 0, op, ": scale_factor must be positive and finite, got ", f);
      const double o = std::floor(static_cast<double>(in) * f);
      TG_CHECK_AS(ShapeError, o >= 1 && o < 9.2e18, op, ": scale_factor ", f, " gives an output size of ", o,
                  " for input size ", in, " of ", describe(x));
      p.out[d] = static_cast<int64_t>(o);
      p.scale[d] = f;
    } else {
      const int64_t o = params.size[n == 1 ? 0 : static_cast<size_t>(s)];
      TG_CHECK_AS(ShapeError, o > 0, op, ": output size must be positive, got ", o);
      p.out[d] = o;
    }
    p.in[d] = in;
  }
  std::vector<int64_t> out_shape{x.size(0), x.size(1)};
  for (int64_t s = 0; s < S; ++s) out_shape.push_back(p.out[first + s]);
  profile::OpScope scope(op, [&] { return upsample_info(p, x, S, false); });
  Tensor y = Tensor::empty(Shape(out_shape), {.dtype = x.dtype(), .device = x.device()});
  // An empty batch may ask for a huge size: the kernels' tables would hold it, the output not.
  if (y.numel() > 0) TG_DISPATCH(x.device(), upsample_forward(y, x, p));
  if (should_record({x})) {
    const Shape in_shape = x.shape();
    record(op, {x}, {y}, {}, [op, p, in_shape, S](const BackwardArgs& args) {
      const Tensor& dy = args.grad_outputs[0];
      profile::OpScope scope(op, [&] { return upsample_info(p, dy, S, true); });
      Tensor dx = Tensor::empty(in_shape, {.dtype = dy.dtype(), .device = dy.device()});
      if (dx.numel() > 0) TG_DISPATCH(dy.device(), upsample_backward(dx, dy, p));
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

Tensor upsample_nearest(const Tensor& x, const std::vector<double>& scale_factor) {
  return upsample(x, {.mode = UpsampleMode::nearest, .scale_factor = scale_factor});
}
Tensor upsample_bilinear2d(const Tensor& x, const std::vector<double>& scale_factor, bool align_corners) {
  return upsample(x, {.mode = UpsampleMode::bilinear, .scale_factor = scale_factor, .align_corners = align_corners});
}
Tensor upsample_trilinear3d(const Tensor& x, const std::vector<double>& scale_factor, bool align_corners) {
  return upsample(x, {.mode = UpsampleMode::trilinear, .scale_factor = scale_factor, .align_corners = align_corners});
}

}  // namespace tg
