// The TMA kernel's epilogue where the output is row-major (a plain map: Linear, channels-last
// convolutions, grad-weight; or the split partial sums): the 128 x kBN accumulator tile is
// staged in the idle stages as 128-row x 32-column boxes in the 128-byte swizzle, and one
// thread hands them to the TMA unit, which clips rows past M and columns past N. Other outputs
// take store_tile_staged (epilogue_sm90.cuh): one store per element through the OutputMap.
// Design note: docs/kernels/gemm_tma.md.
#pragma once
#include <cuda.h>

#include "../arch/named_barrier.cuh"
#include "../arch/tma.cuh"
#include "../arch/wgmma.cuh"
#include "epilogue_sm90.cuh"

namespace tg::cuda::engine {

struct TileStore {
  enum Kind : int32_t {
    kScalar,  // store_tile_staged through MainloopArgs::store
    kRows,    // map: the M x N output (args.out.data, a plain map; the bias added here)
    kSplits,  // map: splits planes of M x N partial sums (args.partials), plane blockIdx.y
  };
  CUtensorMap map;  // boxes of 128 rows x 32 columns, 128-byte swizzle
  Kind kind = kScalar;
};

constexpr int kStoreBoxBytes = 128 * 32 * 4;  // one 128 x 32 box: 16 KB, 1024-byte aligned in the stages

// Called by the 256 consumer threads once every wgmma of the block has retired and no copy into
// `stage` (1024-byte aligned, at least kBN / 32 boxes) is pending; syncs them on named barrier 1.
template <int kBN>
__device__ __forceinline__ void store_tile_tma(const float (&acc)[kBN / 2], unsigned char* stage, int tid, int32_t m0,
                                               int32_t n0, const MainloopArgs& args, const TileStore& store) {
  named_barrier_sync(1, 256);  // both warpgroups are done with the stages' operands
  // acc[4 j + 2 h + e] holds C[row0 + g + 8 h][8 j + 2 t + e]. Element (r, c) goes to box c / 32,
  // row r (128 bytes each), 16-byte chunk (c % 32) / 4 XOR r % 8: a warp's 8-byte writes land in
  // 32 distinct banks.
  const int lane = tid % 32, row0 = (tid / 32) * 16, g = lane / 4, t = lane % 4;
  const float* bias = store.kind == TileStore::kRows ? args.out.bias : nullptr;
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    const int col = 8 * j + 2 * t;
    float b0 = 0.f, b1 = 0.f;
    if (bias) {
      if (n0 + col < args.N) b0 = bias[n0 + col];
      if (n0 + col + 1 < args.N) b1 = bias[n0 + col + 1];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + g + 8 * h;
      const int chunk = ((col % 32) / 4) ^ (row % 8);
      float2* dst = reinterpret_cast<float2*>(stage + (col / 32) * kStoreBoxBytes + row * 128 + chunk * 16 + (col % 4) * 4);
      *dst = make_float2(acc[4 * j + 2 * h] + b0, acc[4 * j + 2 * h + 1] + b1);
    }
  }
  wgmma::fence_proxy_async();  // the plain shared-memory writes, for the TMA unit
  named_barrier_sync(1, 256);
  if (tid == 0) {
    for (int b = 0; b < kBN / 32 && n0 + 32 * b < args.N; ++b) {
      if (store.kind == TileStore::kRows)
        tma::store_box(&store.map, stage + b * kStoreBoxBytes, n0 + 32 * b, m0);
      else
        tma::store_box_3d(&store.map, stage + b * kStoreBoxBytes, n0 + 32 * b, m0, int(blockIdx.y));
    }
    tma::bulk_commit();
    tma::bulk_wait();  // the stages stay valid until the unit has read them; the block then exits
  }
}

}  // namespace tg::cuda::engine
