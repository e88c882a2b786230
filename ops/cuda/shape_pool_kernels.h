// CUDA launchers of the shape and pooling families; same signatures and meaning as tg::cpu
// in ops/cpu/shape_pool_kernels.h. Defined only when TG_CUDA is on; ordered on the framework
// stream of the tensors' device. Each checks its buffers before it launches anything.
#pragma once
#include "../../core/tensor.h"
#include "../pool.h"
#include "../shape.h"

namespace tg::cuda {

void slice_gather(const Tensor& small, const Tensor& big, const SliceProblem& p);
void slice_scatter(const Tensor& big, const Tensor& small, const SliceProblem& p);

void pool_forward(const Tensor& out, const Tensor& indices, const Tensor& x, const PoolProblem& p);
void pool_backward(const Tensor& dx, const Tensor& dy, const Tensor& indices, const PoolProblem& p);

}  // namespace tg::cuda
