// Pooling over NCHW (2-D) and NCDHW (3-D) tensors: max (with the argmax kept for backward),
// average and adaptive average, with PyTorch's options and semantics.
//
//   Tensor y = tg::max_pool2d(x, {.kernel_size = {3}, .stride = {2}, .padding = {1}});
//   Tensor z = tg::avg_pool3d(x, {.kernel_size = {2, 2, 2}});        // stride = kernel
//   Tensor c = tg::avg_pool2d(x, {.kernel_size = {3}, .padding = {1}, .ceil_mode = true,
//                                 .count_include_pad = false});
//   Tensor g = tg::adaptive_avg_pool2d(x, {1, 1});                   // global average
//
// Output size per dim, as PyTorch's pooling_output_shape, with e = dilation * (kernel - 1) + 1
// (the dilated extent) and n = in + 2 padding - e + (ceil_mode ? stride - 1 : 0):
//   out = floor(n / stride) + 1, and with ceil_mode, out -= 1 if (out - 1) * stride >= in + padding
// (a window must start inside the input or the left padding; one that would start in the
// right padding is dropped). n < 0, an output size below 1 or an empty input dim (windows
// over padding alone) is an error. As PyTorch, padding may be at most half of e. Dilation
// is max pooling's only (PyTorch's avg_pool has none); a max window must hold at least one
// real element (padding counts as -inf), which dilation with padding could break: that is an
// error rather than a -inf output.
// Max ties pick the first maximum in window order; a NaN in the window wins, as in PyTorch.
// Average divisor per output, a product over dims: with count_include_pad (the default) the
// window's size clipped to in + padding (a ceil_mode window can reach past it); without,
// the number of real elements in the window.
// Adaptive windows: start = floor(i * in / out), end = ceil((i + 1) * in / out).
#pragma once
#include <cstdint>
#include <vector>

#include "../core/random.h"  // TG_HOST_DEVICE
#include "../core/tensor.h"

namespace tg {

// One value for every spatial dim, or one per dim. An empty stride means stride = kernel.
struct PoolParams {
  std::vector<int64_t> kernel_size;
  std::vector<int64_t> stride = {};
  std::vector<int64_t> padding = {0};
  std::vector<int64_t> dilation = {1};  // max pooling only: avg pooling refuses any other value
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg pooling only: padded positions count in the divisor
};

enum class PoolKind { max, avg, adaptive_avg };

// The problem size shared by the public ops, the CPU reference and the CUDA kernels.
// Spatial arrays are (D, H, W); a 2-D problem has D = 1, kernel 1, stride 1, padding 0,
// dilation 1 in that slot, which makes it exactly a 3-D problem. Adaptive problems ignore
// kernel, stride, padding, dilation and count_include_pad. ceil_mode shows only in `out`.
struct PoolProblem {
  PoolKind kind = PoolKind::max;
  int spatial = 2;  // 2 or 3: the rank of the user's problem, for messages and shapes
  int64_t N = 0, C = 0;
  int64_t in[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1};
  int64_t padding[3] = {0, 0, 0};
  int64_t dilation[3] = {1, 1, 1};
  bool count_include_pad = true;
  int64_t in_plane() const { return in[0] * in[1] * in[2]; }
  int64_t out_plane() const { return out[0] * out[1] * out[2]; }
};

// The window of output position o along spatial dim k: the input positions begin,
// begin + step, ... below end, clipped to the input (begin is the first real tap), and the
// divisor it contributes to an average (see the header comment; for adaptive pooling the
// window's size). Shared by both backends so they cannot disagree.
struct PoolWindow {
  int64_t begin, end, step, divisor;
};
TG_HOST_DEVICE PoolWindow pool_window(const PoolProblem& p, int k, int64_t o) {
  if (p.kind == PoolKind::adaptive_avg) {
    const int64_t b = (o * p.in[k]) / p.out[k];
    const int64_t e = ((o + 1) * p.in[k] + p.out[k] - 1) / p.out[k];
    return {b, e, 1, e - b};
  }
  const int64_t d = p.dilation[k];
  int64_t b = o * p.stride[k] - p.padding[k];
  int64_t e = b + d * (p.kernel[k] - 1) + 1;
  // count_include_pad counts padding but not what a ceil_mode window reaches past it.
  const int64_t limit = p.in[k] + p.padding[k];
  const int64_t padded_size = (e < limit ? e : limit) - b;
  if (b < 0) b += (-b + d - 1) / d * d;  // the first tap inside the input
  if (e > p.in[k]) e = p.in[k];
  if (e < b) e = b;
  // Averages have dilation 1 (checked), so e - b counts the real elements.
  return {b, e, d, p.count_include_pad ? padded_size : e - b};
}

// An average's divisor, the product of its windows' divisors: in double, since the int64
// product of three window sizes can overflow (a kernel of 2^32 in two dims).
TG_HOST_DEVICE double pool_divisor(const PoolWindow& wd, const PoolWindow& wh, const PoolWindow& ww) {
  return static_cast<double>(wd.divisor) * static_cast<double>(wh.divisor) * static_cast<double>(ww.divisor);
}

// The output positions [first, last) along dim k whose windows span input position i
// (o * stride - padding <= i <= o * stride - padding + dilation * (kernel - 1)): what a
// backward that gathers (rather than scatters) loops over. With dilation 1 these are
// exactly the windows holding i; with dilation > 1 a window may span i between its taps,
// which only max pooling allows, and its backward matches the saved argmax anyway.
TG_HOST_DEVICE void pool_inverse_window(const PoolProblem& p, int k, int64_t i, int64_t& first, int64_t& last) {
  if (p.kind == PoolKind::adaptive_avg) {
    first = (i * p.out[k]) / p.in[k];
    last = ((i + 1) * p.out[k] + p.in[k] - 1) / p.in[k];
    return;
  }
  const int64_t hi = i + p.padding[k];  // >= 0
  const int64_t lo = hi - p.dilation[k] * (p.kernel[k] - 1);
  first = lo <= 0 ? 0 : (lo + p.stride[k] - 1) / p.stride[k];
  last = hi / p.stride[k] + 1;
  if (last > p.out[k]) last = p.out[k];
  if (first > last) first = last;
}

// Validates x (rank spatial + 2, floating) and the parameters, naming `op` and the shapes.
PoolProblem make_pool_problem(const char* op, PoolKind kind, int spatial, const Tensor& x, const PoolParams& p);
PoolProblem make_adaptive_pool_problem(const char* op, int spatial, const Tensor& x,
                                       const std::vector<int64_t>& output_size);
// The parameters alone (lengths, signs, padding at most half the dilated kernel, no
// dilation for averages): what a module can check when it is built, before it sees an input.
void check_pool_params(const char* op, PoolKind kind, int spatial, const PoolParams& p);
// Throws unless the problem is one that make_pool_problem or make_adaptive_pool_problem could
// have built: sizes positive (N and C may be 0), the 2-D problem's D slot the identity,
// kernel, stride and dilation positive, padding at most half the dilated kernel, every output
// size what floor or ceil mode gives, every max window holding an input element. The buffer
// checks below and the public backward functions call it, so a caller-built problem is
// checked before any kernel divides or indexes with it.
void check_pool_problem(const char* op, const PoolProblem& p);
Shape pool_input_shape(const PoolProblem& p);
Shape pool_output_shape(const PoolProblem& p);

struct MaxPoolResult {
  Tensor output;
  Tensor indices;  // i64, the output's shape: flat positions in the input's (D*)H*W plane
};

Tensor max_pool2d(const Tensor& x, const PoolParams& p);
Tensor max_pool3d(const Tensor& x, const PoolParams& p);
MaxPoolResult max_pool2d_with_indices(const Tensor& x, const PoolParams& p);
MaxPoolResult max_pool3d_with_indices(const Tensor& x, const PoolParams& p);
Tensor avg_pool2d(const Tensor& x, const PoolParams& p);
Tensor avg_pool3d(const Tensor& x, const PoolParams& p);
// output_size: one value for every spatial dim, or one per dim.
Tensor adaptive_avg_pool2d(const Tensor& x, const std::vector<int64_t>& output_size);
Tensor adaptive_avg_pool3d(const Tensor& x, const std::vector<int64_t>& output_size);

// The gradient of the input from the output's, as the tape calls them.
Tensor max_pool_backward(const Tensor& dy, const Tensor& indices, const PoolProblem& p);
Tensor avg_pool_backward(const Tensor& dy, const PoolProblem& p);  // avg and adaptive_avg

// The kernels' buffer checks, called first by both backends.
void check_pool_forward_buffers(const Tensor& out, const Tensor& indices, const Tensor& x, const PoolProblem& p);
void check_pool_backward_buffers(const Tensor& dx, const Tensor& dy, const Tensor& indices, const PoolProblem& p);

}  // namespace tg
