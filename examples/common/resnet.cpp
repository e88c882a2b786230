#include "common/resnet.h"

#include <string>

namespace ex {
namespace {

std::shared_ptr<tg::nn::Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride, tg::TensorOptions t) {
  return std::make_shared<tg::nn::Conv2d>(tg::nn::Conv2dOptions{.in_channels = in,
                                                                .out_channels = out,
                                                                .kernel_size = {k, k},
                                                                .stride = {stride},
                                                                .padding = {k / 2},
                                                                .bias = false},  // a norm follows
                                          t);
}

// relu: the ReLU that follows the norm, run inside it (nn::GroupNormOptions::relu).
std::shared_ptr<tg::nn::GroupNorm> norm(int64_t channels, int64_t groups, tg::TensorOptions t, bool relu = false) {
  return std::make_shared<tg::nn::GroupNorm>(
      tg::nn::GroupNormOptions{.num_groups = groups, .num_channels = channels, .relu = relu}, t);
}

}  // namespace

BasicBlock::BasicBlock(int64_t in, int64_t out, int64_t stride, int64_t groups, tg::TensorOptions t) {
  conv1_ = conv(in, out, 3, stride, t);
  gn1_ = norm(out, groups, t, /*relu=*/true);
  conv2_ = conv(out, out, 3, 1, t);
  gn2_ = norm(out, groups, t);
  register_module("conv1", conv1_);
  register_module("gn1", gn1_);
  register_module("conv2", conv2_);
  register_module("gn2", gn2_);
  if (stride != 1 || in != out) {
    downsample_ = std::make_shared<tg::nn::Sequential>();
    downsample_->add(conv(in, out, 1, stride, t));
    downsample_->add(norm(out, groups, t));
    register_module("downsample", downsample_);
  }
}

tg::Tensor BasicBlock::forward(const tg::Tensor& x) {
  // gn1 applies the ReLU; gn2 adds the shortcut and applies the ReLU.
  const tg::Tensor h = (*conv2_)((*gn1_)((*conv1_)(x)));
  return gn2_->forward_add_relu(h, downsample_ ? (*downsample_)(x) : x);
}

ResNet18GN::ResNet18GN(const ResNetOptions& o, tg::TensorOptions t) {
  TG_CHECK(o.width >= 1 && o.groups >= 1 && o.width % o.groups == 0, "ResNet18GN: width ", o.width,
           " must be a positive multiple of groups ", o.groups);
  conv1_ = conv(o.in_channels, o.width, 3, 1, t);
  gn1_ = norm(o.width, o.groups, t, /*relu=*/true);
  register_module("conv1", conv1_);
  register_module("gn1", gn1_);
  int64_t in = o.width;
  for (int i = 0; i < 4; ++i) {
    const int64_t out = o.width << i;
    layers_[i] = std::make_shared<tg::nn::Sequential>();
    layers_[i]->add(std::make_shared<BasicBlock>(in, out, i == 0 ? 1 : 2, o.groups, t));
    layers_[i]->add(std::make_shared<BasicBlock>(out, out, 1, o.groups, t));
    register_module("layer" + std::to_string(i + 1), layers_[i]);
    in = out;
  }
  fc_ = std::make_shared<tg::nn::Linear>(tg::nn::LinearOptions{.in_features = in, .out_features = o.classes}, t);
  register_module("fc", fc_);
}

tg::Tensor ResNet18GN::forward(const tg::Tensor& x) {
  tg::Tensor h = (*gn1_)((*conv1_)(x));  // gn1 applies the ReLU
  for (auto& layer : layers_) h = (*layer)(h);
  return (*fc_)(tg::nn::MeanPool()(h));
}

}  // namespace ex
