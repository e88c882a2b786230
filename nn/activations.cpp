#include "nn/activations.h"

#include <cmath>

namespace tg::nn {

Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

Tensor Tanh::forward(const Tensor& x) { return tg::tanh(x); }

GELU::GELU(GELUOptions options) : options_(options) {
  TG_CHECK(options_.approximate == GeluApproximate::none || options_.approximate == GeluApproximate::tanh,
           "GELU: approximate must be GeluApproximate::none or ::tanh, got ", static_cast<int>(options_.approximate));
}

Tensor GELU::forward(const Tensor& x) { return gelu(x, options_.approximate); }

Tensor SiLU::forward(const Tensor& x) { return silu(x); }

LeakyReLU::LeakyReLU(LeakyReLUOptions options) : options_(options) {
  TG_CHECK(std::isfinite(options_.negative_slope), "LeakyReLU: negative_slope must be finite, got ",
           options_.negative_slope);
}

Tensor LeakyReLU::forward(const Tensor& x) { return leaky_relu(x, options_.negative_slope); }

Tensor Softmax::forward(const Tensor& x) { return softmax(x, dim_); }

Tensor LogSoftmax::forward(const Tensor& x) { return log_softmax(x, dim_); }

}  // namespace tg::nn
