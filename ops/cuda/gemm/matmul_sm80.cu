// The engine's matrix product, for every transpose combination.
#include "ops/cuda/gemm/launch.cuh"

namespace tg::cuda::engine {

void launch_matmul(const float* a, bool a_k_contiguous, int64_t lda, const float* b, bool b_k_contiguous,
                   int64_t ldb, const Plan& plan, const MainloopArgs& args, bool split_tf32, cudaStream_t stream) {
  const MatrixOperand<true> a_k{a, args.M, args.red, lda};
  const MatrixOperand<false> a_m{a, args.M, args.red, lda};
  const MatrixOperand<true> b_k{b, args.N, args.red, ldb};
  const MatrixOperand<false> b_n{b, args.N, args.red, ldb};
  if (a_k_contiguous && b_k_contiguous) launch(a_k, b_k, plan, args, split_tf32, stream);
  else if (a_k_contiguous) launch(a_k, b_n, plan, args, split_tf32, stream);
  else if (b_k_contiguous) launch(a_m, b_k, plan, args, split_tf32, stream);
  else launch(a_m, b_n, plan, args, split_tf32, stream);
}

}  // namespace tg::cuda::engine
