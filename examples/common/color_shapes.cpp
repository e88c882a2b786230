#include "common/color_shapes.h"

#include <random>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ex {

ColorShapes::ColorShapes(int64_t count, int64_t size, uint64_t seed)
    : base_(make_shapes_dataset(count, seed)), size_(size), seed_(seed) {}

tg::data::Example ColorShapes::get(int64_t i) const {
  constexpr int64_t S = kShapeImageSize;
  std::mt19937_64 rng(seed_ * 7919 + static_cast<uint64_t>(i));
  std::uniform_real_distribution<float> tint(0.4f, 1.6f);
  std::vector<float> pixels(static_cast<size_t>(3 * size_ * size_));
  const float* src = base_.images.data() + i * S * S;
  for (int64_t c = 0; c < 3; ++c) {
    const float t = tint(rng);
    float* dst = pixels.data() + c * size_ * size_;
    for (int64_t y = 0; y < size_; ++y)
      for (int64_t x = 0; x < size_; ++x) dst[y * size_ + x] = t * src[(y * S / size_) * S + x * S / size_];
  }
  return {tg::from_vector(pixels, {3, size_, size_}),
          tg::from_vector(std::vector<int64_t>{base_.labels[static_cast<size_t>(i)]}, tg::Shape{})};
}

EpochBatches::EpochBatches(std::shared_ptr<const tg::data::Dataset> dataset, tg::data::DataLoaderOptions options,
                           bool repeat_first)
    : loader_(std::move(dataset), options), repeat_first_(repeat_first) {}

const tg::data::Batch& EpochBatches::next() {
  if (repeat_first_ && first_.input.defined()) return first_;
  if (!it_ || *it_ == loader_.end()) {
    it_ = std::make_unique<tg::data::DataLoader::Iterator>(loader_.begin());
  } else {
    ++*it_;
    if (*it_ == loader_.end()) it_ = std::make_unique<tg::data::DataLoader::Iterator>(loader_.begin());
  }
  if (repeat_first_) {
    first_ = **it_;
    return first_;
  }
  return **it_;
}

}  // namespace ex
