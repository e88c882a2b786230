// nn::Upsample over ops/upsample.h, as PyTorch's nn.Upsample: no parameters or buffers.
//
//   nn::Upsample up({.scale_factor = {2}});                                  // nearest
//   nn::Upsample up2({.scale_factor = {2}, .mode = UpsampleMode::bilinear});  // (N, C, H, W)
//
// The options are checked when the module is built; their fit to the input's rank at forward.
#pragma once
#include <cstdint>
#include <vector>

#include "../ops/upsample.h"
#include "module.h"

namespace tg::nn {

struct UpsampleOptions {
  std::vector<double> scale_factor = {};  // exactly one of scale_factor and size
  std::vector<int64_t> size = {};
  UpsampleMode mode = UpsampleMode::nearest;
  bool align_corners = false;  // bilinear and trilinear only
};

class Upsample : public Module {
 public:
  explicit Upsample(UpsampleOptions options);
  Tensor forward(const Tensor& x) override;
  const UpsampleOptions& options() const { return options_; }

 private:
  UpsampleOptions options_;
};

}  // namespace tg::nn
