// The engine's convolution input gradient: dy gathered by the input pixels that each output
// read, times the packed weights (C, kvol*K).
#include "ops/cuda/gemm/launch.cuh"

namespace tg::cuda::engine {

void launch_conv_dgrad(const ConvGeometry& g, bool channels_last, const float* dy, const float* packed_w,
                       const Plan& plan, const MainloopArgs& args, bool split_tf32, cudaStream_t stream) {
  const int64_t red = int64_t(g.K) * g.kernel[0] * g.kernel[1] * g.kernel[2];
  const MatrixOperand<true> w{packed_w, g.C, int32_t(red), red};
  if (channels_last) launch(GradOutputOperand<true>{dy, g, args.M, args.red}, w, plan, args, split_tf32, stream);
  else launch(GradOutputOperand<false>{dy, g, args.M, args.red}, w, plan, args, split_tf32, stream);
}

}  // namespace tg::cuda::engine
