#include "nn/fused.h"

#include "ops/fused.h"

namespace tg::nn {

Conv3dGroupNormMean::Conv3dGroupNormMean(Conv3dGroupNormMeanOptions o, TensorOptions t) : options_(o) {
  TG_CHECK(o.kernel_size > 0, "Conv3dGroupNormMean: kernel_size must be positive, got ", o.kernel_size);
  // The layers validate the rest (channels, groups, eps) with their own messages.
  conv = std::make_shared<Conv3d>(Conv3dOptions{.in_channels = o.in_channels,
                                                .out_channels = o.out_channels,
                                                .kernel_size = {o.kernel_size},
                                                .bias = true},
                                  t);
  norm = std::make_shared<GroupNorm>(
      GroupNormOptions{.num_groups = o.num_groups, .num_channels = o.out_channels, .eps = o.eps, .affine = true}, t);
  register_module("conv", conv);
  register_module("norm", norm);
}

Tensor Conv3dGroupNormMean::forward(const Tensor& x) {
  TG_CHECK_AS(ShapeError, x.defined() && x.dim() == 5 && x.size(1) == options_.in_channels,
           "Conv3dGroupNormMean: expected input (N, ", options_.in_channels, ", D, H, W), got ",
           x.defined() ? describe(x) : std::string("an undefined tensor"));
  return conv3d_group_norm_mean(x, conv->weight, conv->bias, norm->weight, norm->bias, options_.num_groups,
                                options_.eps);
}

}  // namespace tg::nn
