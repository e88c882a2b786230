// A ConvShape's per-dimension sizes in 32 bits, for kernels that form coordinates in int32 (their
// callers check the ranges first). The kernels' geometry structs hold one.
#pragma once
#include <cstdint>

#include "../conv.h"

namespace tg::cuda {

struct ConvDims32 {
  int32_t in[3], out[3], kernel[3], stride[3], pad[3], dil[3];
};

inline ConvDims32 conv_dims32(const ConvShape& s) {
  ConvDims32 g{};
  for (int d = 0; d < 3; ++d) {
    g.in[d] = int32_t(s.in[d]);
    g.out[d] = int32_t(s.out[d]);
    g.kernel[d] = int32_t(s.kernel[d]);
    g.stride[d] = int32_t(s.stride[d]);
    g.pad[d] = int32_t(s.pad[d]);
    g.dil[d] = int32_t(s.dilation[d]);
  }
  return g;
}

}  // namespace tg::cuda
