// Activation modules over the functional ops of ops/unary.h and ops/softmax.h. They hold no
// parameters or buffers (their state dicts are empty, as in PyTorch) and keep the input's
// shape:
//
//   nn::GELU gelu({.approximate = GeluApproximate::tanh});   // PyTorch's approximate="tanh"
//   nn::LeakyReLU leaky({.negative_slope = 0.2});
//   nn::Softmax softmax(1);                                  // over dim 1 (negative counts from the end)
//
// Options are validated when the module is built; the dim of Softmax/LogSoftmax against the
// input's rank at forward.
#pragma once
#include <cstdint>

#include "../ops/softmax.h"
#include "../ops/unary.h"
#include "module.h"

namespace tg::nn {

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

struct GELUOptions {
  GeluApproximate approximate = GeluApproximate::none;
};

class GELU : public Module {
 public:
  explicit GELU(GELUOptions options = {});
  Tensor forward(const Tensor& x) override;
  const GELUOptions& options() const { return options_; }

 private:
  GELUOptions options_;
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

struct LeakyReLUOptions {
  double negative_slope = 0.01;
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(LeakyReLUOptions options = {});
  Tensor forward(const Tensor& x) override;
  const LeakyReLUOptions& options() const { return options_; }

 private:
  LeakyReLUOptions options_;
};

// dim is required, as in PyTorch (whose implicit dim is deprecated).
class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : dim_(dim) {}
  Tensor forward(const Tensor& x) override;
  int64_t dim() const { return dim_; }

 private:
  int64_t dim_;
};

class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim) : dim_(dim) {}
  Tensor forward(const Tensor& x) override;
  int64_t dim() const { return dim_; }

 private:
  int64_t dim_;
};

}  // namespace tg::nn
