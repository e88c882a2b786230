// ConvTranspose2d / ConvTranspose3d: option checks, parameters, forward.
#include "nn/conv_transpose.h"

#include <cmath>

#include "core/checked.h"
#include "nn/init.h"

namespace tg::nn {
namespace {

void check_per_dim(const char* layer, const char* what, const std::vector<int64_t>& v, size_t dims,
                   int64_t min_value) {
  TG_CHECK(v.size() == 1 || v.size() == dims, layer, ": ", what, " needs 1 or ", dims, " values, got ", v.size());
  for (int64_t x : v) TG_CHECK(x >= min_value, layer, ": ", what, " must be >= ", min_value, ", got ", x);
}

int64_t at(const std::vector<int64_t>& v, size_t d) { return v.size() == 1 ? v[0] : v[d]; }

// Checks the options and makes weight (in, out, k...) and bias (out), PyTorch-initialized.
template <class Options>
void make_parameters(const char* layer, const Options& o, size_t dims, const TensorOptions& t,
                     Tensor& weight, Tensor& bias) {
  TG_CHECK(o.in_channels > 0, layer, ": in_channels must be positive, got ", o.in_channels);
  TG_CHECK(o.out_channels > 0, layer, ": out_channels must be positive, got ", o.out_channels);
  TG_CHECK(!o.kernel_size.empty(), layer, ": kernel_size is required (it has no default); give it, e.g. ",
           ".kernel_size = 2 or ", layer, "Options::make(in_channels, out_channels, 2)");
  check_per_dim(layer, "kernel_size", o.kernel_size, dims, 1);
  check_per_dim(layer, "stride", o.stride, dims, 1);
  check_per_dim(layer, "padding", o.padding, dims, 0);
  check_per_dim(layer, "output_padding", o.output_padding, dims, 0);
  check_per_dim(layer, "dilation", o.dilation, dims, 1);
  for (size_t d = 0; d < dims; ++d) {
    TG_CHECK(at(o.output_padding, d) < at(o.stride, d) || at(o.output_padding, d) < at(o.dilation, d), layer,
             ": output_padding must be smaller than the stride or the dilation in each dim");
  }
  TG_CHECK(is_floating(t.dtype), layer, ": parameters must be floating point, not ", dtype_name(t.dtype));
  std::vector<int64_t> w = {o.in_channels, o.out_channels};
  for (size_t d = 0; d < dims; ++d) w.push_back(at(o.kernel_size, d));
  checked_tensor_bytes(layer, Shape(w), t.dtype);
  weight = Tensor::empty(Shape(w), t);
  if (o.bias) bias = Tensor::empty({o.out_channels}, t);
  const int64_t fan_in = init::fan_in(weight);  // out * prod(k), as PyTorch computes it
  init::kaiming_uniform_(weight, std::sqrt(5.0), fan_in);
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    init::uniform_(bias, -bound, bound);
  }
}

template <class Options>
ConvTransposeParams params_of(const Options& o) {
  return {.stride = o.stride, .padding = o.padding, .output_padding = o.output_padding, .dilation = o.dilation,
          .layout = o.layout};
}

}  // namespace

ConvTranspose2d::ConvTranspose2d(ConvTranspose2dOptions o, TensorOptions t) : options_(std::move(o)) {
  make_parameters("ConvTranspose2d", options_, 2, t, weight, bias);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

ConvTransposeParams ConvTranspose2d::params() const { return params_of(options_); }

Tensor ConvTranspose2d::forward(const Tensor& x) { return conv_transpose2d(x, weight, bias, params()); }

ConvTranspose3d::ConvTranspose3d(ConvTranspose3dOptions o, TensorOptions t) : options_(std::move(o)) {
  TG_CHECK(options_.layout == Layout::NCHW, "ConvTranspose3d: only the channels-first layout (N, C, D, H, W) is "
           "supported; leave layout at Layout::NCHW");
  make_parameters("ConvTranspose3d", options_, 3, t, weight, bias);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

ConvTransposeParams ConvTranspose3d::params() const { return params_of(options_); }

Tensor ConvTranspose3d::forward(const Tensor& x) { return conv_transpose3d(x, weight, bias, params()); }

}  // namespace tg::nn
