#include "nn/pool.h"

#include <utility>

namespace tg::nn {

namespace {

// The output size's checks that need no input: one value or one per dim, all positive.
std::vector<int64_t> checked_output_size(const char* op, int spatial, std::vector<int64_t> size) {
  TG_CHECK(size.size() == 1 || size.size() == static_cast<size_t>(spatial), op, ": output_size has ", size.size(),
           " values; expected 1 or ", spatial);
  for (int64_t v : size) TG_CHECK(v >= 1, op, ": output_size must be positive, got ", Shape(size));
  return size;
}

}  // namespace

MaxPool2d::MaxPool2d(PoolOptions options) : options_(std::move(options)) {
  check_pool_params("MaxPool2d", PoolKind::max, 2, options_);
}
Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, options_); }

MaxPool3d::MaxPool3d(PoolOptions options) : options_(std::move(options)) {
  check_pool_params("MaxPool3d", PoolKind::max, 3, options_);
}
Tensor MaxPool3d::forward(const Tensor& x) { return max_pool3d(x, options_); }

AvgPool2d::AvgPool2d(PoolOptions options) : options_(std::move(options)) {
  check_pool_params("AvgPool2d", PoolKind::avg, 2, options_);
}
Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, options_); }

AvgPool3d::AvgPool3d(PoolOptions options) : options_(std::move(options)) {
  check_pool_params("AvgPool3d", PoolKind::avg, 3, options_);
}
Tensor AvgPool3d::forward(const Tensor& x) { return avg_pool3d(x, options_); }

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::vector<int64_t> output_size)
    : output_size_(checked_output_size("AdaptiveAvgPool2d", 2, std::move(output_size))) {}
Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size_); }

AdaptiveAvgPool3d::AdaptiveAvgPool3d(std::vector<int64_t> output_size)
    : output_size_(checked_output_size("AdaptiveAvgPool3d", 3, std::move(output_size))) {}
Tensor AdaptiveAvgPool3d::forward(const Tensor& x) { return adaptive_avg_pool3d(x, output_size_); }

}  // namespace tg::nn
