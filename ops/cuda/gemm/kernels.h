// The engine's per-role launchers (one .cu each, so they compile in parallel), called by
// engine.cu once it has validated the problem, planned the tiles and packed the weights.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mainloop_sm80.cuh"
#include "operands.cuh"

namespace tg::cuda::engine {

// Tiles and reduction split of one launch.
enum class TileShape { Big, Small, Narrow };  // BigTile, SmallTile, NarrowTile

struct Plan {
  TileShape shape = TileShape::Big;
  bool sm90 = false;  // BigTile on the wgmma kernel (Hopper), else the mma.sync kernels
  int tma_cols = 128;  // the TMA kernels' tile width: 64, 128 or 256 (tiles_n counts such tiles)
  int tma_blocks_per_sm = 1;  // the TMA kernels' 128-wide tiles: 1 (six stages) or 2 (three)
  int32_t tiles_m = 0, tiles_n = 0;
  int32_t splits = 1, k_tiles_per_split = 0;
  bool tma_store = true;  // the TMA kernels may store tiles with TMA (EnginePolicy::tma_store)
  bool tma_split = false;  // the TMA kernel in FP32 mode (split TF32; 128-wide, one block per SM)
};

// y = conv(x, packed weights (K, kvol*C)); x NCDHW or NDHWC.
void launch_conv_fprop(const ConvGeometry& g, bool channels_last, const float* x, const float* packed_w,
                       const Plan& plan, const MainloopArgs& args, bool split_tf32, cudaStream_t stream);
// One stride phase of dx = conv_transpose(dy, that phase's packed weights (C, taps*K)).
void launch_conv_dgrad(const ConvGeometry& g, const PhaseGeometry& phase, bool channels_last, const float* dy,
                       const float* packed_w, const Plan& plan, const MainloopArgs& args, bool split_tf32,
                       cudaStream_t stream);
// dw (K, C*kvol) = dy x^T over batch and output pixels.
void launch_conv_wgrad(const ConvGeometry& g, bool channels_last, const float* dy, const float* x,
                       const Plan& plan, const MainloopArgs& args, bool split_tf32, cudaStream_t stream);
// c (M, N) = op(a) op(b): a_k_contiguous = !transA, b_k_contiguous = transB; lda/ldb the
// strides of the non-contiguous index.
void launch_matmul(const float* a, bool a_k_contiguous, int64_t lda, const float* b, bool b_k_contiguous,
                   int64_t ldb, const Plan& plan, const MainloopArgs& args, bool split_tf32, cudaStream_t stream);

// c (M, N) = a b^T with a (M, red) and b (N, red) row-major, TF32 or FP32 (plan.tma_split), on
// Hopper's TMA + wgmma kernel
// (matmul_sm90_tma.cu; a BigTile plan). Applies where red is a positive multiple of 4 (16-byte
// rows), both pointers are 16-byte aligned and the device runs sm_90a code.
bool matmul_tma_applies(const float* a, const float* b, int64_t red, int dev);
void launch_matmul_tma(const float* a, const float* b, const Plan& plan, const MainloopArgs& args,
                       cudaStream_t stream);
// The same over bf16 a and b (bit patterns; red a positive multiple of 8, 16-byte aligned rows)
// with BF16 products (matmul_bf16_sm90_tma.cu; a plan from make_tma_plan(..., bf16 = true)).
void launch_matmul_tma_bf16(const uint16_t* a, const uint16_t* b, const Plan& plan, const MainloopArgs& args,
                            cudaStream_t stream);

}  // namespace tg::cuda::engine
