// Convolution: conv2d and conv3d, forward and backward, on the CPU and the GPU.
//
// Weights are always PyTorch's (K, C, kh, kw) / (K, C, kd, kh, kw); the bias is (K) or an
// undefined Tensor(). Layout::NHWC means channels-last input and output (N, H, W, C) and is
// available for conv2d only. Every kernel sees one problem description, ConvShape, in which a
// 2-D convolution is a 3-D one with D = 1, so 2-D and 3-D share all their kernels.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "../core/random.h"  // TG_HOST_DEVICE
#include "../core/tensor.h"

namespace tg {

enum class Layout { NCHW, NHWC };  // NHWC = channels-last input/output (N,H,W,C); conv3d: NCDHW only

struct ConvParams {
  std::vector<int64_t> stride = {1};    // one value for every spatial dim, or one per dim
  std::vector<int64_t> padding = {0};
  std::vector<int64_t> dilation = {1};
  Layout layout = Layout::NCHW;
};

// The problem size shared by the public ops, the CPU reference and the CUDA kernels.
// Spatial arrays are always (D, H, W); a 2-D problem has D = 1, kernel depth 1, stride 1,
// padding 0 and dilation 1 in that slot, which makes it exactly a 3-D problem.
struct ConvShape {
  int64_t N = 0, C = 0, K = 0;  // batch, input channels, output channels
  int64_t in[3] = {1, 1, 1};    // input  (D, H, W)
  int64_t out[3] = {1, 1, 1};   // output (D, H, W)
  int64_t kernel[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1};
  int64_t pad[3] = {0, 0, 0};
  int64_t dilation[3] = {1, 1, 1};
  Layout layout = Layout::NCHW;  // NHWC: channels-last x and y, i.e. (N, D, H, W, C)
  int spatial_dims = 2;          // 2 or 3: how the public tensors are shaped

  TG_HOST_DEVICE int64_t in_volume() const { return in[0] * in[1] * in[2]; }
  TG_HOST_DEVICE int64_t out_volume() const { return out[0] * out[1] * out[2]; }
  TG_HOST_DEVICE int64_t kernel_volume() const { return kernel[0] * kernel[1] * kernel[2]; }
  TG_HOST_DEVICE bool channels_last() const { return layout == Layout::NHWC; }

  // Shapes of the public tensors: x, w, b, y.
  Shape x_shape() const;
  Shape w_shape() const;
  Shape y_shape() const;
};

// THE output-size formula, used everywhere: the dilated kernel spans d*(k-1)+1 inputs.
// Every step is checked (core/checked.h): padding, dilation or kernel sizes near INT64_MAX
// are a tg::Error naming `op`, not signed overflow. A stride below 1 is an error too.
inline int64_t conv_kernel_extent(int64_t kernel, int64_t dilation, const char* op = "conv_output_size") {
  return checked_add(checked_mul(dilation, checked_sub(kernel, 1, op, ": kernel size"), op, ": dilated kernel"),
                     1, op, ": dilated kernel extent");
}
inline int64_t conv_padded_size(int64_t in, int64_t pad, const char* op = "conv_output_size") {
  return checked_add(in, checked_mul(2, pad, op, ": padding"), op, ": padded input size");
}
inline int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const char* op = "conv_output_size";
  TG_CHECK(stride >= 1, op, ": stride must be positive, got ", stride);
  const int64_t span = checked_sub(conv_padded_size(in, pad, op), conv_kernel_extent(kernel, dilation, op), op,
                                   ": padded input minus kernel extent");
  return span / stride + 1;
}

// A per-dim parameter (one value for every spatial dim, or one per dim) expanded to `dims`
// values, each at least min_value; tg::Error naming `op` and `name` otherwise.
std::vector<int64_t> conv_per_dim(const char* op, const char* name, const std::vector<int64_t>& v, int dims,
                                  int64_t min_value);

// Validates a convolution's geometry (ranks, channels, per-dim params, kernel extent) and
// returns its ConvShape. `op` names the caller in error messages; the spatial rank is
// taken from the weight (4 -> conv2d, 5 -> conv3d).
ConvShape make_conv_shape(const char* op, const Shape& x_shape, const Shape& w_shape, const ConvParams& p);

// The public ops. Recorded on an active tape as one entry with inputs {x, w, b}.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), const ConvParams& p = {});
Tensor conv3d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), const ConvParams& p = {});

// The backward pieces, for fused code and benchmarks; the tape entry of conv2d/conv3d calls
// these. 2-D or 3-D follows the weight's rank. They validate their arguments like the ops
// do and are not themselves recorded on a tape (no double backward).
//   dx = conv_backward_input(dy, w, x.shape(), p)   dy: the gradient of conv's output
//   dw = conv_backward_weight(dy, x, w.shape(), p)
//   db = conv_backward_bias(dy, p.layout)           sums dy over everything but channels
Tensor conv_backward_input(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p = {});
Tensor conv_backward_weight(const Tensor& dy, const Tensor& x, const Shape& w_shape, const ConvParams& p = {});
// Both gradients at once: {dx, dw}. A fast path may read dy once for both (1x1 convolutions).
std::pair<Tensor, Tensor> conv_backward_input_weight(const Tensor& dy, const Tensor& x, const Tensor& w,
                                                     const ConvParams& p = {});
Tensor conv_backward_bias(const Tensor& dy, Layout layout = Layout::NCHW);

}  // namespace tg
