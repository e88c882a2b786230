// A ResNet-18-style network with GroupNorm in place of BatchNorm (no batch statistics: a
// sample's output depends on that sample only), for small images:
//
//   conv1 3x3 in->w s1 -> gn1 -> relu -> layer1..layer4 (2 BasicBlocks each: w, 2w, 4w, 8w
//   channels; the first block of layers 2-4 has stride 2 and a 1x1 stride-2 projection
//   "downsample" = conv + GroupNorm) -> mean over H, W -> fc 8w->classes
//
// w = 64 is ResNet-18's width. Parameter names follow PyTorch's torchvision naming
// (conv1.weight, layer2.0.downsample.0.weight, fc.bias, ...), so tg::save's file loads into
// the mirror module of bench/compare_zoo.py strictly. Used by examples/resnet.cpp and by the
// zoo benchmark's model row. A norm followed directly by a ReLU (gn1 of the stem and of each
// block) runs it inside (nn::GroupNormOptions::relu, group_norm_relu), and each block's gn2
// adds the shortcut and applies the ReLU in its forward pass (GroupNorm::forward_add_relu): the
// same function, without the add's and the ReLU's own passes over the activation.
#pragma once
#include <cstdint>
#include <memory>

#include "tapegrad/tapegrad.h"

namespace ex {

struct ResNetOptions {
  int64_t in_channels = 3;
  int64_t classes = 10;
  int64_t width = 64;   // channels of layer1; layers 2-4 double it each
  int64_t groups = 32;  // GroupNorm groups in every norm (must divide width)
};

class BasicBlock : public tg::nn::Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride, int64_t groups, tg::TensorOptions t);
  tg::Tensor forward(const tg::Tensor& x) override;

 private:
  std::shared_ptr<tg::nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<tg::nn::GroupNorm> gn1_, gn2_;
  std::shared_ptr<tg::nn::Sequential> downsample_;  // null: identity shortcut
};

class ResNet18GN : public tg::nn::Module {
 public:
  explicit ResNet18GN(const ResNetOptions& o = {}, tg::TensorOptions t = {});
  tg::Tensor forward(const tg::Tensor& x) override;  // (N, in, H, W) -> logits (N, classes)

 private:
  std::shared_ptr<tg::nn::Conv2d> conv1_;
  std::shared_ptr<tg::nn::GroupNorm> gn1_;
  std::shared_ptr<tg::nn::Sequential> layers_[4];
  std::shared_ptr<tg::nn::Linear> fc_;
};

}  // namespace ex
