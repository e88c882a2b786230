#include "nn/norm_dropout.h"

#include <cmath>

#include "nn/init.h"

namespace tg::nn {

LayerNorm::LayerNorm(LayerNormOptions o, TensorOptions t) : options_(std::move(o)) {
  const Shape ns(options_.normalized_shape);
  TG_CHECK(ns.rank() > 0, "LayerNorm: normalized_shape must name at least one dim");
  for (int64_t d : ns) TG_CHECK(d > 0, "LayerNorm: normalized_shape ", ns, " must be positive in every dim");
  TG_CHECK(std::isfinite(options_.eps) && options_.eps > 0, "LayerNorm: eps must be positive, got ", options_.eps);
  TG_CHECK(is_floating(t.dtype), "LayerNorm: parameters must be floating point, not ", dtype_name(t.dtype));
  if (options_.elementwise_affine) {
    weight = Tensor::empty(ns, t);
    init::ones_(weight);
    if (options_.bias) {
      bias = Tensor::empty(ns, t);
      init::zeros_(bias);
    }
  }
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, options_.normalized_shape, weight, bias, options_.eps);
}

DropoutBase::DropoutBase(const char* name, DropoutOptions options, int spatial_dims)
    : options_(options), spatial_dims_(spatial_dims) {
  TG_CHECK(std::isfinite(options_.p) && options_.p >= 0 && options_.p <= 1, name,
           ": dropout probability has to be between 0 and 1, but got ", options_.p);
  if (options_.seed) {
    seed_ = *options_.seed;
  } else {
    // One counter of the global stream, mixed into a seed of this module's own stream.
    const RandomDraw d = next_random_draw(1);
    seed_ = mix64(d.seed ^ mix64(d.offset));
  }
}

Tensor DropoutBase::forward(const Tensor& x) {
  const DropoutParams params{.p = options_.p, .training = is_training(), .seed = seed_, .offset = offset_};
  Tensor y = spatial_dims_ == 0 ? dropout(x, params)
             : spatial_dims_ == 2 ? dropout2d(x, params)
                                  : dropout3d(x, params);
  if (params.training && params.p > 0) {
    // The counters this call used: one per element, or one per channel.
    int64_t inner = 1;
    for (int64_t d = x.dim() - spatial_dims_; d < x.dim(); ++d) inner *= x.size(d);
    offset_ += static_cast<uint64_t>(inner > 0 ? x.numel() / inner : 0);
  }
  return y;
}

}  // namespace tg::nn
