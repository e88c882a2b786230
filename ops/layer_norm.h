// Layer normalization (Ba et al., 2016), PyTorch semantics: the trailing dims named by
// normalized_shape are normalized together with their biased variance, eps inside the sqrt,
// then scaled by weight and shifted by bias (each of shape normalized_shape, or undefined).
// x is viewed as (M, D): M rows of D = prod(normalized_shape) contiguous elements.
//
//   Tensor y = tg::layer_norm(x, {x.size(-1)}, ln_weight, ln_bias);  // over the last dim
#pragma once
#include <cstdint>
#include <vector>

#include "../core/tensor.h"

namespace tg {

Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// The flattened problem, shared by the CPU reference and the CUDA kernels.
struct LayerNormProblem {
  int64_t M = 0;  // rows
  int64_t D = 0;  // elements per row
  double eps = 1e-5;
};

// Throw unless the kernels' buffers fit the problem (x, y, dy, dx: M*D elements; mean, rstd:
// M; weight, bias and their gradients: D, each of them optional where marked so), one
// floating dtype and one device. Both backends call them first.
void check_layer_norm_forward_buffers(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                      const Tensor& weight, const Tensor& bias, const LayerNormProblem& p);
void check_layer_norm_backward_buffers(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                       const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                       const Tensor& rstd, const LayerNormProblem& p);

}  // namespace tg

// Kernel entry points (outputs, inputs, problem), used by ops/layer_norm.cpp and by tests.
// The CUDA twins with the same signatures are in ops/cuda/layer_norm.h.
namespace tg::cpu {
// y like x; mean and rstd (M) are saved for backward; weight, bias (D) or undefined.
void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, const LayerNormProblem& p);
// dx like x, dweight and dbias (D): each may be undefined, and is then not computed.
void layer_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                         const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                         const LayerNormProblem& p);
}  // namespace tg::cpu
