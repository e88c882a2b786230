// The Hopper kernels' epilogue: a 128 x kBN accumulator tile in wgmma's fragment layout (two
// warpgroups of 64 rows, 256 consumer threads) is staged in shared memory, then leaves through
// store_staged_tile (mainloop_sm80.cuh says why). Design note: docs/kernels/gemm.md.
#pragma once
#include "../arch/named_barrier.cuh"
#include "mainloop_sm80.cuh"

namespace tg::cuda::engine {

// Called by the 256 consumer threads (tid 0..255) once every wgmma of the block has retired
// and no copy into `stage` is pending; syncs them on named barrier 1.
template <int kBN>
__device__ __forceinline__ void store_tile_staged(const float (&acc)[kBN / 2], float* stage, int tid, int32_t m0,
                                                  int32_t n0, const MainloopArgs& args) {
  constexpr int kStride = kBN + 1;
  named_barrier_sync(1, 256);  // both warpgroups are done with the stages' operands
  // acc[4 j + 2 h + e] holds C[row0 + g + 8 h][8 j + 2 t + e], row0 the warp's first row.
  const int lane = tid % 32, row0 = (tid / 32) * 16, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) stage[(row0 + g + 8 * h) * kStride + 8 * j + 2 * t + e] = acc[4 * j + 2 * h + e];
  named_barrier_sync(1, 256);
  store_staged_tile<128, kBN, 256>(stage, tid, m0, n0, args);
}

}  // namespace tg::cuda::engine
