#include "nn/upsample.h"

#include <cmath>

namespace tg::nn {

Upsample::Upsample(UpsampleOptions o) : options_(std::move(o)) {
  TG_CHECK(options_.scale_factor.empty() != options_.size.empty(),
           "Upsample: exactly one of scale_factor and size must be given");
  for (double f : options_.scale_factor)
    TG_CHECK(std::isfinite(f) && f > 0, "Upsample: scale_factor must be positive and finite, got ", f);
  for (int64_t s : options_.size) TG_CHECK(s > 0, "Upsample: size must be positive, got ", s);
  TG_CHECK(!options_.align_corners || options_.mode != UpsampleMode::nearest,
           "Upsample: align_corners can only be set with the interpolating modes (bilinear, trilinear)");
}

Tensor Upsample::forward(const Tensor& x) {
  return upsample(x, {.mode = options_.mode,
                      .scale_factor = options_.scale_factor,
                      .size = options_.size,
                      .align_corners = options_.align_corners});
}

}  // namespace tg::nn
