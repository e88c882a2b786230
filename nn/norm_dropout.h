// LayerNorm and the dropout modules over ops/layer_norm.h and ops/dropout.h, with PyTorch's
// state-dict names and defaults:
//
//   nn::LayerNorm ln({.normalized_shape = {768}});       // weight = 1, bias = 0, eps = 1e-5
//   nn::Dropout drop({.p = 0.1});                        // active in train(), identity in eval()
//   nn::Dropout2d drop2d({.p = 0.2, .seed = 7});         // whole channels of (N, C, H, W)
//
// A dropout module draws its seed once, at construction, from tg::manual_seed's generator
// (or takes options.seed), then advances its own counter offset by each call's mask size:
// successive calls drop different elements, and a program run twice drops the same ones.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "../ops/dropout.h"
#include "../ops/layer_norm.h"
#include "module.h"

namespace tg::nn {

struct LayerNormOptions {
  std::vector<int64_t> normalized_shape = {};  // the trailing dims normalized together
  double eps = 1e-5;
  bool elementwise_affine = true;  // weight (and bias) of shape normalized_shape
  bool bias = true;                // PyTorch's bias=False keeps the weight only
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(LayerNormOptions options, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  const LayerNormOptions& options() const { return options_; }

  Tensor weight;  // normalized_shape, ones; undefined without elementwise_affine
  Tensor bias;    // normalized_shape, zeros; undefined without elementwise_affine or bias

 private:
  LayerNormOptions options_;
};

struct DropoutOptions {
  double p = 0.5;
  std::optional<uint64_t> seed = std::nullopt;  // default: drawn from the global generator
};

// The three dropout modules differ only in the op they call.
class DropoutBase : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  const DropoutOptions& options() const { return options_; }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // counters used so far

 protected:
  DropoutBase(const char* name, DropoutOptions options, int spatial_dims);

 private:
  DropoutOptions options_;
  int spatial_dims_;  // 0: elementwise; 2, 3: channels
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

class Dropout : public DropoutBase {
 public:
  explicit Dropout(DropoutOptions options = {}) : DropoutBase("Dropout", options, 0) {}
};

class Dropout2d : public DropoutBase {
 public:
  explicit Dropout2d(DropoutOptions options = {}) : DropoutBase("Dropout2d", options, 2) {}
};

class Dropout3d : public DropoutBase {
 public:
  explicit Dropout3d(DropoutOptions options = {}) : DropoutBase("Dropout3d", options, 3) {}
};

}  // namespace tg::nn
