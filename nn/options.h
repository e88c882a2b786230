// Options of the layers, in two spellings:
//
//   nn::Conv2d a({.in_channels = 3, .out_channels = 8, .kernel_size = 3, .stride = 2});
//   nn::Conv2d b(nn::Conv2dOptions::make(3, 8, 3).stride(2).padding(1).bias(false));
//
// Why a `make` factory rather than libtorch's `Conv2dOptions(3, 8, 3).stride(2)`: the
// designated-initializer form needs an aggregate whose data members are named `stride`,
// `padding`, ..., and a class cannot also have member functions of those names. So each
// options struct stays a plain aggregate, and `make(required...)` returns its Builder: a
// struct derived from it whose setters (libtorch's names, each returning *this) hide the
// data members of the same names. A Builder is an options struct, so it is passed to a
// layer as is. The required options are make's arguments, so they cannot be forgotten.
//
// Spatial options (kernel_size, stride, padding, dilation) take one value per spatial dim
// or one for all (PyTorch's int form): `.kernel_size = 3`, `.kernel_size = {3, 5}`.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "../ops/conv.h"

namespace tg::nn {

// One value per spatial dim, or a single value for all of them. A vector underneath, so
// code that reads options as std::vector<int64_t> keeps working; implicit from one value
// (as libtorch's ExpandingArray) so that `.kernel_size = 3` reads as in PyTorch.
struct PerDim : std::vector<int64_t> {
  PerDim() = default;
  PerDim(int64_t v) : std::vector<int64_t>{v} {}  // NOLINT(google-explicit-constructor)
  PerDim(std::initializer_list<int64_t> v) : std::vector<int64_t>(v) {}
  PerDim(std::vector<int64_t> v) : std::vector<int64_t>(std::move(v)) {}  // NOLINT
};

// One chainable setter of a Builder: sets the base's member `name`, returns the builder.
#define TG_OPTIONS_SETTER(Base, type, name) \
  auto& name(type value) {                  \
    Base::name = std::move(value);          \
    return *this;                           \
  }

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;

  struct Builder;
  static Builder make(int64_t in_features, int64_t out_features);
};

struct LinearOptions::Builder : LinearOptions {
  TG_OPTIONS_SETTER(LinearOptions, int64_t, in_features)
  TG_OPTIONS_SETTER(LinearOptions, int64_t, out_features)
  TG_OPTIONS_SETTER(LinearOptions, bool, bias)
};

inline LinearOptions::Builder LinearOptions::make(int64_t in_features, int64_t out_features) {
  Builder b;  // its setters hide the members: b.in_features names the setter
  b.in_features(in_features).out_features(out_features);
  return b;
}

// kernel_size has no default: a layer built without one throws tg::Error (it used to be
// 3x3 silently, which hid a forgotten option).
struct Conv2dOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  PerDim kernel_size = {};  // required
  PerDim stride = 1;
  PerDim padding = 0;
  PerDim dilation = 1;
  bool bias = true;
  Layout layout = Layout::NCHW;  // NHWC: input and output are channels-last (N, H, W, C)

  struct Builder;
  static Builder make(int64_t in_channels, int64_t out_channels, PerDim kernel_size);
};

struct Conv3dOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  PerDim kernel_size = {};  // required
  PerDim stride = 1;
  PerDim padding = 0;
  PerDim dilation = 1;
  bool bias = true;
  Layout layout = Layout::NCHW;  // conv3d is NCDHW only: must stay Layout::NCHW

  struct Builder;
  static Builder make(int64_t in_channels, int64_t out_channels, PerDim kernel_size);
};

#define TG_CONV_OPTIONS_BUILDER(Options)                  \
  struct Options::Builder : Options {                     \
    TG_OPTIONS_SETTER(Options, int64_t, in_channels)      \
    TG_OPTIONS_SETTER(Options, int64_t, out_channels)     \
    TG_OPTIONS_SETTER(Options, PerDim, kernel_size)       \
    TG_OPTIONS_SETTER(Options, PerDim, stride)            \
    TG_OPTIONS_SETTER(Options, PerDim, padding)           \
    TG_OPTIONS_SETTER(Options, PerDim, dilation)          \
    TG_OPTIONS_SETTER(Options, bool, bias)                \
    TG_OPTIONS_SETTER(Options, Layout, layout)            \
  };                                                      \
  inline Options::Builder Options::make(int64_t in_channels, int64_t out_channels, PerDim kernel_size) { \
    Builder b;                                            \
    b.in_channels(in_channels).out_channels(out_channels).kernel_size(std::move(kernel_size)); \
    return b;                                             \
  }
TG_CONV_OPTIONS_BUILDER(Conv2dOptions)
TG_CONV_OPTIONS_BUILDER(Conv3dOptions)
#undef TG_CONV_OPTIONS_BUILDER

struct GroupNormOptions {
  int64_t num_groups = 0;
  int64_t num_channels = 0;
  double eps = 1e-5;
  bool affine = true;
  // The ReLU that usually follows, in the same op (group_norm_relu): relu(GroupNorm(x)) with
  // the ReLU's own passes over the activation saved. No parameter of its own.
  bool relu = false;

  struct Builder;
  static Builder make(int64_t num_groups, int64_t num_channels);
};

struct GroupNormOptions::Builder : GroupNormOptions {
  TG_OPTIONS_SETTER(GroupNormOptions, int64_t, num_groups)
  TG_OPTIONS_SETTER(GroupNormOptions, int64_t, num_channels)
  TG_OPTIONS_SETTER(GroupNormOptions, double, eps)
  TG_OPTIONS_SETTER(GroupNormOptions, bool, affine)
  TG_OPTIONS_SETTER(GroupNormOptions, bool, relu)
};

inline GroupNormOptions::Builder GroupNormOptions::make(int64_t num_groups, int64_t num_channels) {
  Builder b;
  b.num_groups(num_groups).num_channels(num_channels);
  return b;
}

// ConvTranspose2d / ConvTranspose3d (Dims = 2 or 3): a convolution's options plus
// output_padding (below the stride or the dilation in each dim, as PyTorch requires).
template <int Dims>
struct ConvTransposeOptions {
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

template <int Dims>
struct ConvTransposeOptions<Dims>::Builder : ConvTransposeOptions<Dims> {
  TG_OPTIONS_SETTER(ConvTransposeOptions<Dims>, int64_t, in_channels)
  TG_OPTIONS_SETTER(ConvTransposeOptions<Dims>, int64_t, out_channels)
  TG_OPTIONS_SETTER(ConvTransposeOptions<Dims>, PerDim, kernel_size)
  TG_OPTIONS_SETTER(ConvTransposeOptions<Dims>, PerDim, stride)
  TG_OPTIONS_SETTER(ConvTransposeOptions<Dims>, PerDim, padding)
  TG_OPTIONS_SETTER(ConvTransposeOptions<Dims>, PerDim, output_padding)
  TG_OPTIONS_SETTER(ConvTransposeOptions<Dims>, PerDim, dilation)
  TG_OPTIONS_SETTER(ConvTransposeOptions<Dims>, bool, bias)
  TG_OPTIONS_SETTER(ConvTransposeOptions<Dims>, Layout, layout)
};

template <int Dims>
typename ConvTransposeOptions<Dims>::Builder ConvTransposeOptions<Dims>::make(int64_t in_channels,
                                                                              int64_t out_channels,
                                                                              PerDim kernel_size) {
  Builder b;
  b.in_channels(in_channels).out_channels(out_channels).kernel_size(std::move(kernel_size));
  return b;
}

using ConvTranspose2dOptions = ConvTransposeOptions<2>;
using ConvTranspose3dOptions = ConvTransposeOptions<3>;

#undef TG_OPTIONS_SETTER

}  // namespace tg::nn
