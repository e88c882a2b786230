// The engine's convolution forward: im2col(x) gathered on the fly times the packed weights.
#include "ops/cuda/gemm/launch.cuh"

namespace tg::cuda::engine {

void launch_conv_fprop(const ConvGeometry& g, bool channels_last, const float* x, const float* packed_w,
                       const Plan& plan, const MainloopArgs& args, bool split_tf32, cudaStream_t stream) {
  const MatrixOperand<true> w{packed_w, g.K, int32_t(int64_t(g.C) * g.kernel[0] * g.kernel[1] * g.kernel[2]),
                              int64_t(g.C) * g.kernel[0] * g.kernel[1] * g.kernel[2]};
  if (channels_last) launch(ImageOperand<true>{x, g, args.M, args.red}, w, plan, args, split_tf32, stream);
  else launch(ImageOperand<false>{x, g, args.M, args.red}, w, plan, args, split_tf32, stream);
}

}  // namespace tg::cuda::engine
