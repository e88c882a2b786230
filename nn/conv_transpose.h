// ConvTranspose2d / ConvTranspose3d modules (ops/conv_transpose.h), PyTorch's state-dict names
// and default initialization: weight (in, out, k...) and bias (out), both U(+-1/sqrt(fan_in))
// with fan_in = out * prod(k) (PyTorch takes fan_in from the weight's second dim).
//   nn::ConvTranspose2d up({.in_channels = 64, .out_channels = 32, .kernel_size = 2, .stride = 2});
//   nn::ConvTranspose2d same(nn::ConvTranspose2dOptions::make(64, 32, 2).stride(2));
#pragma once
#include "../ops/conv_transpose.h"
#include "module.h"
#include "options.h"

namespace tg::nn {

struct ConvTranspose2dOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  PerDim kernel_size = {};  // required
  PerDim stride = 1;
  PerDim padding = 0;
  PerDim output_padding = 0;
  PerDim dilation = 1;
  bool bias = true;
  Layout layout = Layout::NCHW;  // NHWC: channels-last input and output (2-D only)

  struct Builder;
  static Builder make(int64_t in_channels, int64_t out_channels, PerDim kernel_size);
};
struct ConvTranspose3dOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  PerDim kernel_size = {};  // required
  PerDim stride = 1;
  PerDim padding = 0;
  PerDim output_padding = 0;
  PerDim dilation = 1;
  bool bias = true;
  Layout layout = Layout::NCHW;  // 3-D is NCDHW only: must stay Layout::NCHW

  struct Builder;
  static Builder make(int64_t in_channels, int64_t out_channels, PerDim kernel_size);
};

// options.h's chainable setter (it #undefs its own at its end).
#define TG_CT_SETTER(Base, type, name) \
  auto& name(type value) {             \
    Base::name = std::move(value);     \
    return *this;                      \
  }
#define TG_CONV_TRANSPOSE_BUILDER(Options)                                                              \
  struct Options::Builder : Options {                                                                   \
    TG_CT_SETTER(Options, int64_t, in_channels)                                                    \
    TG_CT_SETTER(Options, int64_t, out_channels)                                                   \
    TG_CT_SETTER(Options, PerDim, kernel_size)                                                     \
    TG_CT_SETTER(Options, PerDim, stride)                                                          \
    TG_CT_SETTER(Options, PerDim, padding)                                                         \
    TG_CT_SETTER(Options, PerDim, output_padding)                                                  \
    TG_CT_SETTER(Options, PerDim, dilation)                                                        \
    TG_CT_SETTER(Options, bool, bias)                                                              \
    TG_CT_SETTER(Options, Layout, layout)                                                          \
  };                                                                                                    \
  inline Options::Builder Options::make(int64_t in_channels, int64_t out_channels, PerDim kernel_size) { \
    Builder b;                                                                                          \
    b.in_channels(in_channels).out_channels(out_channels).kernel_size(std::move(kernel_size));          \
    return b;                                                                                           \
  }
TG_CONV_TRANSPOSE_BUILDER(ConvTranspose2dOptions)
TG_CONV_TRANSPOSE_BUILDER(ConvTranspose3dOptions)
#undef TG_CONV_TRANSPOSE_BUILDER
#undef TG_CT_SETTER

// x (N, in, H, W) -> (N, out, H', W'); weight (in, out, kh, kw), bias (out).
class ConvTranspose2d : public Module {
 public:
  explicit ConvTranspose2d(ConvTranspose2dOptions options, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  ConvTransposeParams params() const;

  Tensor weight;
  Tensor bias;

 private:
  ConvTranspose2dOptions options_;
};

// x (N, in, D, H, W) -> (N, out, D', H', W'); weight (in, out, kd, kh, kw), bias (out).
class ConvTranspose3d : public Module {
 public:
  explicit ConvTranspose3d(ConvTranspose3dOptions options, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  ConvTransposeParams params() const;

  Tensor weight;
  Tensor bias;

 private:
  ConvTranspose3dOptions options_;
};

}  // namespace tg::nn
