// The engine's TF32 and FP32 matrix product on Hopper when both operands are row-major with the
// reduction index contiguous (C = A B^T: Linear's forward, x w^T): both tiles are plain boxes of
// the two matrices, moved by the TMA unit (tma_mainloop_sm90.cuh), so no consumer thread spends
// an instruction on loading. Design note: docs/kernels/gemm_tma.md.
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/gemm/operands.cuh"
#include "ops/cuda/gemm/tma_mainloop_sm90.cuh"

namespace tg::cuda::engine {

// The producer for tma_mainloop_sm90.cuh (outside the anonymous namespace: unused internal
// members would warn in the device passes without sm_90a code).
// k-tile kt of A (rows m0..) and of B (rows n0..): box (k, row) of each matrix.
struct MatrixBoxes {
  CUtensorMap a, b;
  struct Cursor {
    int32_t m0;
  };

  __device__ __forceinline__ void prefetch() const {
    tma::prefetch_map(&a);
    tma::prefetch_map(&b);
  }
  __device__ __forceinline__ Cursor start(int32_t, int32_t m0) const { return {m0}; }
  __device__ __forceinline__ void advance(Cursor&) const {}
  __device__ __forceinline__ void load(unsigned char* a_dst, unsigned char* b_dst, uint64_t* bar, const Cursor& at,
                                       int32_t kt, int32_t n0) const {
    tma::load_box(a_dst, &a, bar, kt * kBK, at.m0);
    tma::load_box(b_dst, &b, bar, kt * kBK, n0);
  }
};

bool matmul_tma_applies(const float* a, const float* b, int64_t red, int dev) {
  return red > 0 && red % 4 == 0 && aligned16(a) && aligned16(b) && device_runs_wgmma(dev);
}

void launch_matmul_tma(const float* a, const float* b, const Plan& plan, const MainloopArgs& args,
                       cudaStream_t stream) {
  MatrixBoxes boxes;
  const TmaBox a_box{.rows = kTmaBM, .cols = kBK, .swizzle128 = true};
  const TmaBox b_box{.rows = plan.tma_cols, .cols = kBK, .swizzle128 = true};
  boxes.a = f32_matrix_map("engine matmul (A)", a, args.M, args.red, a_box);
  boxes.b = f32_matrix_map("engine matmul (B)", b, args.N, args.red, b_box);
  launch_tma_wgmma(boxes, plan, args, stream);
}

}  // namespace tg::cuda::engine
