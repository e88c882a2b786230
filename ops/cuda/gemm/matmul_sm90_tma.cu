// The engine's TF32 and FP32 matrix product on Hopper when both operands are row-major with the
// reduction index contiguous (C = A B^T: Linear's forward, x w^T): both tiles are plain boxes of
// the two matrices, moved by the TMA unit (tma_mainloop_sm90.cuh), so no consumer thread spends
// an instruction on loading. Design note: docs/kernels/gemm_tma.md.
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/gemm/operands.cuh"
#include "ops/cuda/gemm/matrix_boxes.cuh"

namespace tg::cuda::engine {

bool matmul_tma_applies(const float* a, const float* b, int64_t red, int dev) {
  return red > 0 && red % 4 == 0 && aligned16(a) && aligned16(b) && device_runs_wgmma(dev);
}

void launch_matmul_tma(const float* a, const float* b, const Plan& plan, const MainloopArgs& args,
                       cudaStream_t stream) {
  MatrixBoxes<false> boxes;
  const TmaBox a_box{.rows = kTmaBM, .cols = kBK, .swizzle128 = true};
  const TmaBox b_box{.rows = plan.tma_cols, .cols = kBK, .swizzle128 = true};
  boxes.a = f32_matrix_map("engine matmul (A)", a, args.M, args.red, a_box);
  boxes.b = f32_matrix_map("engine matmul (B)", b, args.N, args.red, b_box);
  launch_tma_wgmma(boxes, plan, args, stream);
}

}  // namespace tg::cuda::engine
