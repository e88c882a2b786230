// Transposed convolution (PyTorch's conv_transpose2d / conv_transpose3d, groups = 1): the
// gradient of a convolution with respect to its input, used as a forward op (U-Net decoders,
// learned upsampling). It runs on the convolution's own kernels, roles swapped:
//   forward      y  = conv_backward_input(x, w)   (the convolution whose input is y and whose
//                                                  output is x; w is its weight)
//   input grad   dx = conv(dy, w)
//   weight grad  dw = conv_backward_weight(x, dy)
// so every fast path (3x3, 1x1, the tensor-core engine) serves it, on the CPU and the GPU.
//
// Shapes (NCHW; NHWC for 2-D with layout = NHWC; NCDHW for 3-D):
//   x (N, C_in, *in), w (C_in, C_out, *k), bias (C_out) or undefined -> y (N, C_out, *out)
//   out = (in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1
// output_padding (per dim, below the stride; PyTorch also allows it below the dilation, which
// is refused here as unsupported) picks one of the input sizes that a strided convolution maps
// to the same output size.
#pragma once
#include <vector>

#include "../core/tensor.h"
#include "conv.h"

namespace tg {

struct ConvTransposeParams {
  std::vector<int64_t> stride = {1};  // one value for every spatial dim, or one per dim
  std::vector<int64_t> padding = {0};
  std::vector<int64_t> output_padding = {0};
  std::vector<int64_t> dilation = {1};
  Layout layout = Layout::NCHW;
};

// Recorded on an active tape as one entry with inputs {x, w, bias}.
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(),
                        const ConvTransposeParams& p = {});
Tensor conv_transpose3d(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(),
                        const ConvTransposeParams& p = {});

// The output shape of a transposed convolution of x by a weight of shape w_shape (validates
// both; the error names `op`).
Shape conv_transpose_output_shape(const char* op, const Shape& x_shape, const Shape& w_shape,
                                  const ConvTransposeParams& p);

}  // namespace tg
