// The engine's convolution input gradient, one stride phase per launch: dy gathered by the
// phase's input pixels through the taps that reach them, times that phase's packed weights
// (C, taps*K).
#include "ops/cuda/gemm/launch.cuh"

namespace tg::cuda::engine {

void launch_conv_dgrad(const ConvGeometry& g, const PhaseGeometry& phase, bool channels_last, const float* dy,
                       const float* packed_w, const Plan& plan, const MainloopArgs& args, bool split_tf32,
                       cudaStream_t stream) {
  const MatrixOperand<true> w{packed_w, g.C, args.red, args.red};
  if (channels_last) {
    launch(PhaseGradOutputOperand<true>{dy, g, phase, args.M, args.red}, w, plan, args, split_tf32, stream);
  } else {
    launch(PhaseGradOutputOperand<false>{dy, g, phase, args.M, args.red}, w, plan, args, split_tf32, stream);
  }
}

}  // namespace tg::cuda::engine
