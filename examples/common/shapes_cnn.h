// The cnn example's network for the synthetic shapes task (shapes_dataset.h): two 3x3
// convolutions with GroupNorm and ReLU, global average pooling, one linear layer. Shared by
// examples/cnn.cpp and the CUDA-graphs benchmark (bench/graphs), which times its training step.
#pragma once
#include <memory>

#include "shapes_dataset.h"
#include "tapegrad/tapegrad.h"

namespace ex {

inline std::shared_ptr<tg::nn::Sequential> make_shapes_cnn(tg::Device device) {
  namespace nn = tg::nn;
  const tg::TensorOptions on{.device = device};
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Conv2d>(
      nn::Conv2dOptions{.in_channels = 1, .out_channels = 16, .kernel_size = 3, .padding = {1}}, on));
  m->add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 4, .num_channels = 16}, on));
  m->add(std::make_shared<nn::ReLU>());
  // Stride 2 halves the map to 8x8: four times less work, and a wider view for each unit.
  m->add(std::make_shared<nn::Conv2d>(
      nn::Conv2dOptions{.in_channels = 16, .out_channels = 32, .kernel_size = 3, .stride = {2}, .padding = {1}}, on));
  m->add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 8, .num_channels = 32}, on));
  m->add(std::make_shared<nn::ReLU>());
  m->add(std::make_shared<nn::MeanPool>());  // (N, 32, 8, 8) -> (N, 32)
  m->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 32, .out_features = kShapeClasses}, on));
  return m;
}

}  // namespace ex
