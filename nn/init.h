// Parameter initialization, in place, drawn from the process-wide seeded generator
// (tg::manual_seed). The generator is counter-based, so a tensor initialized on the GPU holds
// the same numbers as one initialized on the CPU after the same sequence of draws.
#pragma once
#include <cstdint>

#include "../core/tensor.h"

namespace tg::nn::init {

// fan_in of a weight laid out as PyTorch's: (out, in) or (out, in, k...) -> in * prod(k).
int64_t fan_in(const Tensor& weight);

// U(lo, hi).
void uniform_(Tensor& t, double lo, double hi);
// U(-bound, bound) with bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)) (leaky_relu
// gain). PyTorch's default for Linear and Conv weights is a = sqrt(5), i.e. bound = 1/sqrt(fan_in).
void kaiming_uniform_(Tensor& t, double a, int64_t fan_in);
double kaiming_uniform_bound(double a, int64_t fan_in);
void constant_(Tensor& t, double value);
inline void zeros_(Tensor& t) { constant_(t, 0.0); }
inline void ones_(Tensor& t) { constant_(t, 1.0); }

}  // namespace tg::nn::init

namespace tg::nn {
// The initializers under tg::nn as well (nn::kaiming_uniform_, nn::uniform_), as in libtorch.
using init::kaiming_uniform_;
using init::uniform_;
}  // namespace tg::nn
