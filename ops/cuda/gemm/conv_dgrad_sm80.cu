// The engine's convolution input gradient, one stride phase per launch: dy gathered by the
// phase's input pixels through the taps that reach them, times that phase's packed weights
// (C, taps*K). For few input channels, the columns product of the two-step path instead.
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

void launch_conv_dgrad_columns(const ConvGeometry& g1, bool channels_last, const float* dy, const float* w,
                               const Plan& plan, const MainloopArgs& args, bool split_tf32, cudaStream_t stream) {
  // w (K, C*kvol) row-major is B = (j, k) with the rows adjacent: element at k * (C*kvol) + j.
  const MatrixOperand<false> wt{w, args.N, args.red, args.N};
  if (channels_last) launch(ImageOperand<true>{dy, g1, args.M, args.red}, wt, plan, args, split_tf32, stream);
  else launch(ImageOperand<false>{dy, g1, args.M, args.red}, wt, plan, args, split_tf32, stream);
}

}  // namespace tg::cuda::engine
