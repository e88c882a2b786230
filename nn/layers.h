// Layers with PyTorch's parameter names, shapes and default initialization:
//
//   nn::Conv2d conv({.in_channels = 64, .out_channels = 128, .kernel_size = {3, 3}, .bias = false});
//   nn::Conv2d same(nn::Conv2dOptions::make(64, 128, 3).bias(false));   // options.h
//   nn::Linear head({.in_features = 24, .out_features = 10}, {.device = Device::cuda()});
//
// The optional second argument says where (and in which dtype) the parameters are created;
// they are initialized there directly, with the same numbers on every device (the generator
// is counter-based). Options are validated when the layer is built.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "../ops/conv_transpose.h"
#include "module.h"
#include "options.h"

namespace tg::nn {

// y = x w^T + b. weight (out, in), bias (out); x (..., in) -> (..., out): any leading dims
// (none, (B), (B, T), ...) are flattened into one batch dim around the product, on the tape.
class Linear : public Module {
 public:
  explicit Linear(LinearOptions options, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  const LinearOptions& options() const { return options_; }

  Tensor weight;
  Tensor bias;  // undefined when options.bias is false

 private:
  LinearOptions options_;
};

// weight (out, in, kh, kw), bias (out).
class Conv2d : public Module {
 public:
  explicit Conv2d(Conv2dOptions options, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  const Conv2dOptions& options() const { return options_; }
  ConvParams params() const;

  Tensor weight;
  Tensor bias;

 private:
  Conv2dOptions options_;
};

// weight (out, in, kd, kh, kw), bias (out).
class Conv3d : public Module {
 public:
  explicit Conv3d(Conv3dOptions options, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  const Conv3dOptions& options() const { return options_; }
  ConvParams params() const;

  Tensor weight;
  Tensor bias;

 private:
  Conv3dOptions options_;
};

// Transposed convolution (ops/conv_transpose.h), Dims = 2 or 3: x (N, in, *) -> (N, out, *').
// weight (in, out, k...), bias (out), PyTorch's names and default initialization (fan_in from
// the weight's second dim, out * prod(k), as PyTorch computes it).
//   nn::ConvTranspose2d up({.in_channels = 64, .out_channels = 32, .kernel_size = 2, .stride = 2});
template <int Dims>
class ConvTranspose : public Module {
 public:
  explicit ConvTranspose(ConvTransposeOptions<Dims> options, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  const ConvTransposeOptions<Dims>& options() const { return options_; }
  ConvTransposeParams params() const;

  Tensor weight;
  Tensor bias;

 private:
  ConvTransposeOptions<Dims> options_;
};
extern template class ConvTranspose<2>;
extern template class ConvTranspose<3>;
using ConvTranspose2d = ConvTranspose<2>;
using ConvTranspose3d = ConvTranspose<3>;

// x (N, C, *) -> same shape. weight = gamma (C) = 1, bias = beta (C) = 0 when affine.
class GroupNorm : public Module {
 public:
  explicit GroupNorm(GroupNormOptions options, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  // relu(this norm of x + residual) in one op (group_norm_add_relu): a residual block's tail.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);
  const GroupNormOptions& options() const { return options_; }

  Tensor weight;
  Tensor bias;

 private:
  GroupNormOptions options_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// (N, d1, d2, ...) -> (N, d1 * d2 * ...), a view.
class Flatten : public Module {
 public:
  // PyTorch's nn.Flatten(start_dim = 1, end_dim = -1): dims start..end (negative from the end)
  // become one (ops/shape.h flatten; a view recorded on the tape).
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_dim_(start_dim), end_dim_(end_dim) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t start_dim_, end_dim_;
};

// Mean over every dim after the first two: (N, C, *) -> (N, C). Global average pooling
// for 2-D and 3-D feature maps.
class MeanPool : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// Runs its children in order; they are named "0", "1", ... as in PyTorch.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);

  // Appends a child and returns it, typed (`auto conv = seq.add(std::make_shared<Conv2d>(...))`).
  template <class M>
  std::shared_ptr<M> add(std::shared_ptr<M> m) {
    append(m);
    return m;
  }
  size_t size() const { return named_children().size(); }
  Module& operator[](size_t i) const;

  Tensor forward(const Tensor& x) override;

 private:
  void append(std::shared_ptr<Module> m);
};

}  // namespace tg::nn
