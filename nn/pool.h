// Pooling modules over the functional ops of ops/pool.h. They hold no parameters or buffers
// (empty state dicts, as in PyTorch); nn::Flatten is in nn/layers.h.
//
//   nn::MaxPool2d pool({.kernel_size = {3}, .stride = {2}, .padding = {1}});
//   nn::MaxPool2d dilated({.kernel_size = {3}, .dilation = {2}, .ceil_mode = true});
//   nn::AvgPool2d avg({.kernel_size = {3}, .padding = {1}, .count_include_pad = false});
//   nn::AdaptiveAvgPool2d gap({1, 1});
//
// Options are validated when the module is built; shapes against the input at forward.
#pragma once
#include <cstdint>
#include <vector>

#include "../ops/pool.h"
#include "module.h"

namespace tg::nn {

// As PyTorch's pooling modules, same names and defaults: kernel_size, stride (empty: =
// kernel_size), padding (0), ceil_mode (false); MaxPool's dilation (1); AvgPool's
// count_include_pad (true). An AvgPool refuses a dilation other than 1 (PyTorch's has none);
// a MaxPool ignores count_include_pad. divisor_override is not supported.
using PoolOptions = PoolParams;

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(PoolOptions options);
  Tensor forward(const Tensor& x) override;
  const PoolOptions& options() const { return options_; }

 private:
  PoolOptions options_;
};

class MaxPool3d : public Module {
 public:
  explicit MaxPool3d(PoolOptions options);
  Tensor forward(const Tensor& x) override;
  const PoolOptions& options() const { return options_; }

 private:
  PoolOptions options_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(PoolOptions options);
  Tensor forward(const Tensor& x) override;
  const PoolOptions& options() const { return options_; }

 private:
  PoolOptions options_;
};

class AvgPool3d : public Module {
 public:
  explicit AvgPool3d(PoolOptions options);
  Tensor forward(const Tensor& x) override;
  const PoolOptions& options() const { return options_; }

 private:
  PoolOptions options_;
};

// output_size: one value for every spatial dim, or one per dim.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::vector<int64_t> output_size);
  Tensor forward(const Tensor& x) override;
  const std::vector<int64_t>& output_size() const { return output_size_; }

 private:
  std::vector<int64_t> output_size_;
};

class AdaptiveAvgPool3d : public Module {
 public:
  explicit AdaptiveAvgPool3d(std::vector<int64_t> output_size);
  Tensor forward(const Tensor& x) override;
  const std::vector<int64_t>& output_size() const { return output_size_; }

 private:
  std::vector<int64_t> output_size_;
};

}  // namespace tg::nn
