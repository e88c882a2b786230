// The engine's convolution weight gradient: dy (K rows) times im2col(x) (C*kvol rows), both
// reduced over batch and output pixels; the reduction is usually split (engine.cu).
#include "ops/cuda/gemm/launch.cuh"

namespace tg::cuda::engine {

void launch_conv_wgrad(const ConvGeometry& g, bool channels_last, const float* dy, const float* x,
                       const Plan& plan, const MainloopArgs& args, bool split_tf32, cudaStream_t stream) {
  if (channels_last) {
    launch(GradOutputRowsOperand<true>{dy, g, args.M, args.red}, ImageColumnsOperand<true>{x, g, args.N, args.red},
           plan, args, split_tf32, stream);
  } else {
    launch(GradOutputRowsOperand<false>{dy, g, args.M, args.red}, ImageColumnsOperand<false>{x, g, args.N, args.red},
           plan, args, split_tf32, stream);
  }
}

}  // namespace tg::cuda::engine
