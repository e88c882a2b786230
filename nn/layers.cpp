#include "nn/layers.h"

#include <cmath>
#include <string>

#include "nn/init.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace tg::nn {
namespace {

void check_tensor_options(const char* layer, const TensorOptions& t) {
  TG_CHECK(is_floating(t.dtype), layer, ": parameters must be floating point, not ", dtype_name(t.dtype));
}

// PyTorch's default for Linear and Conv: weight kaiming_uniform(a = sqrt(5)), i.e.
// U(+-1/sqrt(fan_in)), then bias U(+-1/sqrt(fan_in)), drawn in that order.
void default_init(Tensor& weight, Tensor& bias) {
  int64_t fan_in = init::fan_in(weight);
  init::kaiming_uniform_(weight, std::sqrt(5.0), fan_in);
  if (bias.defined()) {
    double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    init::uniform_(bias, -bound, bound);
  }
}

// One value per spatial dim, or one for all; each within its allowed minimum.
void check_per_dim(const char* layer, const char* what, const std::vector<int64_t>& v, size_t dims,
                   int64_t min_value) {
  TG_CHECK(v.size() == 1 || v.size() == dims, layer, ": ", what, " needs 1 or ", dims, " values, got ",
           Shape(v));
  for (int64_t x : v)
    TG_CHECK(x >= min_value, layer, ": ", what, " ", Shape(v), " must be >= ", min_value, " in every dim");
}

// Shared by Conv2d and Conv3d: the options of a convolution with `dims` spatial dims.
template <class Options>
void check_conv_options(const char* layer, const Options& o, size_t dims) {
  TG_CHECK(o.in_channels > 0, layer, ": in_channels must be positive, got ", o.in_channels);
  TG_CHECK(o.out_channels > 0, layer, ": out_channels must be positive, got ", o.out_channels);
  TG_CHECK(!o.kernel_size.empty(), layer, ": kernel_size is required (it has no default); give it, e.g. ",
           ".kernel_size = 3 or ", layer, "Options::make(in_channels, out_channels, 3)");
  check_per_dim(layer, "kernel_size", o.kernel_size, dims, 1);
  check_per_dim(layer, "stride", o.stride, dims, 1);
  check_per_dim(layer, "padding", o.padding, dims, 0);
  check_per_dim(layer, "dilation", o.dilation, dims, 1);
  // The dilated kernel extent and twice the padding must be computable (conv.h's formula).
  for (size_t d = 0; d < dims; ++d) {
    auto at = [d](const std::vector<int64_t>& v) { return v.size() == 1 ? v[0] : v[d]; };
    conv_kernel_extent(at(o.kernel_size), at(o.dilation), layer);
    conv_padded_size(0, at(o.padding), layer);
  }
}

// (K, C, k...) with a single kernel_size value repeated over the spatial dims.
Shape conv_weight_shape(int64_t out, int64_t in, const std::vector<int64_t>& kernel, size_t dims) {
  std::vector<int64_t> s = {out, in};
  for (size_t d = 0; d < dims; ++d) s.push_back(kernel.size() == 1 ? kernel[0] : kernel[d]);
  return Shape(s);
}

// A convolution's weight (out, in, k...) and optional bias (out), allocated and initialized.
template <class Options>
void make_conv_parameters(const char* layer, const Options& o, size_t dims, TensorOptions t, Tensor& weight,
                          Tensor& bias) {
  const Shape w_shape = conv_weight_shape(o.out_channels, o.in_channels, o.kernel_size, dims);
  checked_tensor_bytes(layer, w_shape, t.dtype);  // an overflowing weight size fails naming the layer
  weight = Tensor::empty(w_shape, t);
  if (o.bias) bias = Tensor::empty({o.out_channels}, t);
  default_init(weight, bias);
}

// A transposed convolution's weight (in, out, k...) and optional bias (out), allocated and
// initialized like a convolution's (default_init takes fan_in from the weight's second dim).
template <int Dims>
void make_conv_transpose_parameters(const char* layer, const ConvTransposeOptions<Dims>& o, TensorOptions t,
                                    Tensor& weight, Tensor& bias) {
  const Shape w_shape = conv_weight_shape(o.in_channels, o.out_channels, o.kernel_size, Dims);
  checked_tensor_bytes(layer, w_shape, t.dtype);
  weight = Tensor::empty(w_shape, t);
  if (o.bias) bias = Tensor::empty({o.out_channels}, t);
  default_init(weight, bias);
}

}  // namespace


// ---- Linear -----------------------------------------------------------------------------

Linear::Linear(LinearOptions o, TensorOptions t) : options_(o) {
  TG_CHECK(o.in_features > 0, "Linear: in_features must be positive, got ", o.in_features);
  TG_CHECK(o.out_features > 0, "Linear: out_features must be positive, got ", o.out_features);
  check_tensor_options("Linear", t);
  checked_tensor_bytes("Linear", {o.out_features, o.in_features}, t.dtype);  // before any allocation
  weight = Tensor::empty({o.out_features, o.in_features}, t);
  if (o.bias) bias = Tensor::empty({o.out_features}, t);
  default_init(weight, bias);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

Tensor Linear::forward(const Tensor& x) {
  // linear() takes (B, in) or (in); more leading dims are folded into B and unfolded after.
  // Both reshapes are views recorded on the tape, so gradients reach x in its own shape.
  if (!x.defined() || x.dim() <= 2) return linear(x, weight, bias);
  const int64_t in = x.size(x.dim() - 1);
  TG_CHECK_AS(ShapeError, in == options_.in_features, "Linear: expected input (..., ", options_.in_features,
              "), got ", describe(x));
  std::vector<int64_t> out_dims(x.shape().dims().begin(), x.shape().dims().end() - 1);
  int64_t batch = 1;
  for (int64_t d : out_dims) batch = checked_mul(batch, d, "Linear: ", describe(x));
  out_dims.push_back(options_.out_features);
  return linear(x.reshape({batch, in}), weight, bias).reshape(Shape(out_dims));
}

// ---- Conv2d / Conv3d --------------------------------------------------------------------

Conv2d::Conv2d(Conv2dOptions o, TensorOptions t) : options_(std::move(o)) {
  check_conv_options("Conv2d", options_, 2);
  check_tensor_options("Conv2d", t);
  make_conv_parameters("Conv2d", options_, 2, t, weight, bias);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

ConvParams Conv2d::params() const {
  return {.stride = options_.stride, .padding = options_.padding, .dilation = options_.dilation,
          .layout = options_.layout};
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, params()); }

Conv3d::Conv3d(Conv3dOptions o, TensorOptions t) : options_(std::move(o)) {
  check_conv_options("Conv3d", options_, 3);
  TG_CHECK(options_.layout == Layout::NCHW, "Conv3d: only the channels-first layout (N, C, D, H, W) is "
           "supported; leave layout at Layout::NCHW");
  check_tensor_options("Conv3d", t);
  make_conv_parameters("Conv3d", options_, 3, t, weight, bias);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

ConvParams Conv3d::params() const {
  return {.stride = options_.stride, .padding = options_.padding, .dilation = options_.dilation,
          .layout = Layout::NCHW};
}

Tensor Conv3d::forward(const Tensor& x) { return conv3d(x, weight, bias, params()); }

// ---- GroupNorm --------------------------------------------------------------------------

GroupNorm::GroupNorm(GroupNormOptions o, TensorOptions t) : options_(o) {
  TG_CHECK(o.num_groups > 0, "GroupNorm: num_groups must be positive, got ", o.num_groups);
  TG_CHECK(o.num_channels > 0, "GroupNorm: num_channels must be positive, got ", o.num_channels);
  TG_CHECK(o.num_channels % o.num_groups == 0, "GroupNorm: num_channels ", o.num_channels,
           " is not divisible by num_groups ", o.num_groups);
  TG_CHECK(o.eps > 0, "GroupNorm: eps must be positive, got ", o.eps);
  check_tensor_options("GroupNorm", t);
  if (o.affine) {
    weight = Tensor::empty({o.num_channels}, t);
    bias = Tensor::empty({o.num_channels}, t);
    init::ones_(weight);
    init::zeros_(bias);
  }
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

Tensor GroupNorm::forward(const Tensor& x) {
  TG_CHECK_AS(ShapeError, x.defined() && x.dim() >= 3 && x.size(1) == options_.num_channels, "GroupNorm: expected input (N, ",
           options_.num_channels, ", *) of rank >= 3, got ", describe(x));
  return options_.relu ? group_norm_relu(x, weight, bias, options_.num_groups, options_.eps)
                       : group_norm(x, weight, bias, options_.num_groups, options_.eps);
}

Tensor GroupNorm::forward_add_relu(const Tensor& x, const Tensor& residual) {
  TG_CHECK_AS(ShapeError, x.defined() && x.dim() >= 3 && x.size(1) == options_.num_channels, "GroupNorm: expected input (N, ",
           options_.num_channels, ", *) of rank >= 3, got ", describe(x));
  TG_CHECK(!options_.relu, "GroupNorm::forward_add_relu: the norm's own relu option would apply the ReLU before "
                           "the residual; build it without");
  return group_norm_add_relu(x, weight, bias, options_.num_groups, residual, options_.eps);
}

// ---- shape-only layers ------------------------------------------------------------------

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

Tensor Flatten::forward(const Tensor& x) {
  TG_CHECK_AS(ShapeError, x.defined() && x.dim() >= 1, "Flatten: expected a tensor with a batch dim, got ", describe(x));
  return flatten(x, start_dim_, end_dim_);
}

Tensor MeanPool::forward(const Tensor& x) {
  TG_CHECK_AS(ShapeError, x.defined() && x.dim() >= 3, "MeanPool: expected (N, C, *) of rank >= 3, got ", describe(x));
  std::vector<int64_t> dims;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return mean(x, dims);
}

// ---- Sequential -------------------------------------------------------------------------

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) append(m);
}

void Sequential::append(std::shared_ptr<Module> m) {
  TG_CHECK(m != nullptr, "Sequential::add: null module at position ", size());
  register_module(std::to_string(size()), std::move(m));
}

Module& Sequential::operator[](size_t i) const {
  TG_CHECK(i < size(), "Sequential: index ", i, " out of range (", size(), " modules)");
  return *named_children()[i].second;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& [name, m] : named_children()) y = m->forward(y);
  return y;
}

// ---- ConvTranspose2d / ConvTranspose3d --------------------------------------------------

template <int Dims>
ConvTranspose<Dims>::ConvTranspose(ConvTransposeOptions<Dims> o, TensorOptions t) : options_(std::move(o)) {
  const char* layer = Dims == 2 ? "ConvTranspose2d" : "ConvTranspose3d";
  check_conv_options(layer, options_, Dims);
  check_per_dim(layer, "output_padding", options_.output_padding, Dims, 0);
  for (size_t d = 0; d < Dims; ++d) {
    auto at = [d](const std::vector<int64_t>& v) { return v.size() == 1 ? v[0] : v[d]; };
    TG_CHECK(at(options_.output_padding) < at(options_.stride) || at(options_.output_padding) < at(options_.dilation),
             layer, ": output_padding must be smaller than the stride or the dilation in each dim");
  }
  TG_CHECK(Dims == 2 || options_.layout == Layout::NCHW, layer, ": only the channels-first layout (N, C, D, H, W) "
           "is supported; leave layout at Layout::NCHW");
  check_tensor_options(layer, t);
  make_conv_transpose_parameters(layer, options_, t, weight, bias);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

template <int Dims>
ConvTransposeParams ConvTranspose<Dims>::params() const {
  return {.stride = options_.stride, .padding = options_.padding, .output_padding = options_.output_padding,
          .dilation = options_.dilation, .layout = options_.layout};
}

template <int Dims>
Tensor ConvTranspose<Dims>::forward(const Tensor& x) {
  return Dims == 2 ? conv_transpose2d(x, weight, bias, params()) : conv_transpose3d(x, weight, bias, params());
}

template class ConvTranspose<2>;
template class ConvTranspose<3>;

}  // namespace tg::nn
