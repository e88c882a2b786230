// Epilogue and tile walk of the 1x1 mma.sync kernels (conv1x1/fprop_sm80.cu, conv1x1/backward_sm80.cu):
// accumulators to global memory (direct, or staged through the tile's consumed stage so each
// instruction writes whole lines; bias and accumulate variants), and which 128-pixel tiles a
// block of the persistent grid visits. Design: docs/kernels/conv1x1.md.
#pragma once
#include <cstdint>

#include "tiles_sm80.cuh"

namespace tg::cuda::conv1x1_detail {

// ---------------------------------------------------------------------------------------------
// Epilogue: accumulators -> global memory

// GEMM tile element (i, j) (i: mma row, j: mma column, contiguous in memory in both layouts)
// lives at base[i * row_stride + j]; only i < valid_rows, j < valid_cols exist.
struct OutTile {
  float* base;
  int64_t row_stride;
  int valid_rows, valid_cols;
  bool vec;  // row starts are 16-byte aligned
};

// Stores 4 consecutive columns j..j+3 of row i (plus bias, plus the old value when
// accumulating). bias_rows / bias_cols: shared-memory bias indexed by i or by j, or null.
__device__ __forceinline__ void store4(const OutTile& o, int i, int j, float (&v)[4], const float* bias_rows,
                                       const float* bias_cols, bool accumulate) {
  if (i >= o.valid_rows) return;
  if (bias_rows != nullptr) {
    const float b = bias_rows[i];
    for (int e = 0; e < 4; ++e) v[e] += b;
  }
  if (bias_cols != nullptr)
    for (int e = 0; e < 4; ++e) v[e] += bias_cols[j + e];
  float* p = o.base + i * o.row_stride + j;
  if (o.vec && j + 3 < o.valid_cols) {
    float4 val = make_float4(v[0], v[1], v[2], v[3]);
    if (accumulate) {
      const float4 old = *reinterpret_cast<const float4*>(p);
      val.x += old.x, val.y += old.y, val.z += old.z, val.w += old.w;
    }
    __stcs(reinterpret_cast<float4*>(p), val);
  } else {
    for (int e = 0; e < 4; ++e) {
      if (j + e >= o.valid_cols) break;
      __stcs(p + e, accumulate ? v[e] + p[e] : v[e]);
    }
  }
}

// Any tile (edges, accumulation, unaligned rows): stores a warp's kMT x kNT accumulator tiles
// whose top-left is (row0, col0). Lanes t and t^1 trade halves: the even lane then holds row g,
// columns 4(t/2)..+3, the odd one row g+8.
template <int kMT, int kNT>
__device__ __forceinline__ void store_acc(float (&acc)[kMT][kNT][4], const OutTile& o, int row0, int col0, int g, int t,
                                       const float* bias_rows, const float* bias_cols, bool accumulate) {
  const bool odd = t & 1;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const float* c = acc[mt][nt];
      const float give0 = odd ? c[0] : c[2], give1 = odd ? c[1] : c[3];
      const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1), got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
      float v[4];
      v[0] = odd ? got0 : c[0];
      v[1] = odd ? got1 : c[1];
      v[2] = odd ? c[2] : got0;
      v[3] = odd ? c[3] : got1;
      store4(o, row0 + mt * 16 + g + (odd ? 8 : 0), col0 + nt * 8 + (t >> 1) * 4, v, bias_rows, bias_cols,
             accumulate);
    }
  }
}

// Shared-memory stores of values from different accumulator registers: through plain float2 /
// float4 stores ptxas split some into 4-byte stores at the 128-register cap, which conflict
// here. The PTX vector stores stay whole (the register moves
// they need are cheap): st_shared_v2 / st_shared_v4 (ops/cuda/arch/shared_memory.cuh).

// The read-back half of a staged store: one 16-row block of a warp's scratch (rows `stride`
// floats apart; this lane reads rows rr + 4i, i < 4, from rd) stored as whole rows at dst, which
// advances by `step` per row read, plus bias: bias[row0 + 4i] per row or bc per column.
enum BiasKind : int { kNoBias = 0, kBiasRows = 1, kBiasCols = 2 };
template <int kBias>
__device__ __forceinline__ void store_scratch_rows(const float* rd, int stride, float*& dst, int64_t step,
                                                   const float* bias, int row0, float4 bc) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float4 v = *reinterpret_cast<const float4*>(rd + 4 * i * stride);
    if constexpr (kBias == kBiasRows) {
      const float b = bias[row0 + 4 * i];
      v.x += b, v.y += b, v.z += b, v.w += b;
    } else if constexpr (kBias == kBiasCols) {
      v.x += bc.x, v.y += bc.y, v.z += bc.z, v.w += bc.w;
    }
    __stcs(reinterpret_cast<float4*>(dst), v);
    dst += step;
  }
}

// The 16 x 32 block (m-tile mt, n-tiles 4 cg .. 4 cg + 3) of a warp's accumulators into its
// scratch in fragment order: this lane's rows g and g + 8, columns 8 nt + 2 t, + 1 (wr: row g,
// column 2 t), two 8-byte stores per n-tile.
template <int kMT, int kNT>
__device__ __forceinline__ void write_block_fragments(const float (&acc)[kMT][kNT][4], int mt, int cg, float* wr) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const float* c = acc[mt][4 * cg + nt];
    st_shared_v2(wr + nt * 8, c[0], c[1]);
    st_shared_v2(wr + 8 * kScratchStride + nt * 8, c[2], c[3]);
  }
}

// A full tile with 16-byte-aligned rows: a warp's kMT x kNT accumulator tiles, whose top-left
// element is out[0] (rows row_stride apart), go through `scratch` (kScratchFloats of shared
// memory that only this warp touches): each 16 x 32 block is written in fragment order, then
// read back by rows, 8 lanes x 16 bytes per row, so every store instruction writes four whole
// 128-byte lines. kBias: 0 none, 1 bias[row], 2 bias[column] (shared memory, from the warp's
// first row / column); a template argument, because even a zero bias costs an add per value.
template <int kMT, int kNT, int kBias>
__device__ __forceinline__ void store_acc_staged(float (&acc)[kMT][kNT][4], float* scratch, float* out,
                                                 int64_t row_stride, int lane, const float* bias) {
  static_assert(kNT % 4 == 0, "blocks of 32 columns");
  const int g = lane >> 2, t = lane & 3;
  const int rr = lane >> 3, cc = 4 * (lane & 7);  // read-back: rows rr + 4i, columns cc..cc+3
  float* wr = scratch + g * kScratchStride + 2 * t;
  const float* rd = scratch + rr * kScratchStride + cc;
  const int64_t step = 4 * row_stride;
#pragma unroll
  for (int cg = 0; cg < kNT / 4; ++cg) {  // 32-column blocks
    float* dst = out + rr * row_stride + 32 * cg + cc;
    float4 bc;
    if constexpr (kBias == kBiasCols) bc = *reinterpret_cast<const float4*>(bias + 32 * cg + cc);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      write_block_fragments(acc, mt, cg, wr);
      __syncwarp();
      store_scratch_rows<kBias>(rd, kScratchStride, dst, step, bias, mt * 16 + rr, bc);
      __syncwarp();  // the next block overwrites what this one read
    }
  }
}

// store_acc for accumulators whose 32 columns are in RowsKQuads order (NCHW: the forward and
// the grad-input): lane (g, t) holds columns 8t..8t+7 of rows g and g + 8, so no lanes trade.
template <int kMT>
__device__ __forceinline__ void store_acc_quads(float (&acc)[kMT][4][4], const OutTile& o, int row0, int col0, int g,
                                                int t, const float* bias_rows, bool accumulate) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v[4] = {acc[mt][0][e], acc[mt][1][e], acc[mt][2][e], acc[mt][3][e]};
      store4(o, row0 + mt * 16 + g + (e >= 2 ? 8 : 0), col0 + 8 * t + 4 * (e & 1), v, bias_rows, nullptr, accumulate);
    }
}

// store_acc_staged for RowsKQuads order: each 16 x 32 block is written as 16-byte row pieces
// (row g: columns 8t + 4e, e = 0, 1; row g + 8 likewise) -- half the shared-memory store
// instructions of fragment order -- then read back and stored exactly as store_acc_staged does.
// Row stride 36 floats (4 mod 32): the 8 lanes of a quarter-warp (g = 2i, 2i+1, t = 0..3) write
// 16-byte chunks 9g + 2t + e, distinct mod 8: conflict-free.
constexpr int kQuadScratchStride = 36;
static_assert(16 * kQuadScratchStride <= kScratchFloats, "fits the warp's scratch");
template <int kMT, int kBias>
__device__ __forceinline__ void store_acc_staged_quads(float (&acc)[kMT][4][4], float* scratch, float* out,
                                                       int64_t row_stride, int lane, const float* bias) {
  static_assert(kBias != kBiasCols, "NCHW: bias per row");
  constexpr int S = kQuadScratchStride;
  const int g = lane >> 2, t = lane & 3;
  const int rr = lane >> 3, cc = 4 * (lane & 7);  // read-back: rows rr + 4i, columns cc..cc+3
  float* wr = scratch + g * S + 8 * t;
  const float* rd = scratch + rr * S + cc;
  const int64_t step = 4 * row_stride;
  float* dst = out + rr * row_stride + cc;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      st_shared_v4(wr + (e >= 2 ? 8 * S : 0) + 4 * (e & 1), acc[mt][0][e], acc[mt][1][e], acc[mt][2][e], acc[mt][3][e]);
    __syncwarp();
    store_scratch_rows<kBias>(rd, S, dst, step, bias, mt * 16 + rr, float4{});
    __syncwarp();  // the next block overwrites what this one read
  }
}

// ---------------------------------------------------------------------------------------------
// Tiles: which 128 pixels a block works on

// A block visits tiles blockIdx.x, + step, + 2 step, ... NCHW tiles are 128 pixels of one
// image (tile = n * tiles_per_image + rem); NHWC tiles are 128 rows of the (N*P, channels)
// matrix. step_n / step_rem = step / tiles_per_image and step % tiles_per_image, so that walking
// costs no division.
struct TileGrid {
  int64_t num_tiles, tiles_per_image, step, step_n, step_rem;
};
struct TileCursor {
  int64_t tile;
  int n, rem;  // NCHW only (the host checks that images and tiles per image fit in int)
};
template <bool kNHWC>
__device__ __forceinline__ TileCursor cursor_at(int64_t tile, const TileGrid& tg) {
  TileCursor c{tile, 0, 0};
  if constexpr (!kNHWC) {
    c.n = static_cast<int>(tile / tg.tiles_per_image);
    c.rem = static_cast<int>(tile - c.n * tg.tiles_per_image);
  }
  return c;
}
template <bool kNHWC>
__device__ __forceinline__ void advance(TileCursor& c, const TileGrid& tg) {
  c.tile += tg.step;
  if constexpr (!kNHWC) {
    c.n += static_cast<int>(tg.step_n);
    c.rem += static_cast<int>(tg.step_rem);
    if (c.rem >= tg.tiles_per_image) c.rem -= static_cast<int>(tg.tiles_per_image), ++c.n;
  }
}
// The tile `ahead` steps after c (the one a prefetch loads).
template <bool kNHWC>
__device__ __forceinline__ TileCursor ahead_of(TileCursor c, int ahead, const TileGrid& tg) {
  for (int i = 0; i < ahead; ++i) advance<kNHWC>(c, tg);
  return c;
}

// Where a tile lies.
struct TilePos {
  int64_t n, p0;  // NCHW: image and first pixel; NHWC: n = 0, p0 = first row of N*P
  int pixels;     // valid pixels (rows) in the tile
};
__host__ __device__ constexpr int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <bool kNHWC>
__device__ __forceinline__ TilePos tile_pos(const TileCursor& c, int64_t pixels, int64_t rows) {
  TilePos q;
  if constexpr (kNHWC) {
    q.n = 0;
    q.p0 = c.tile * kTilePixels;
    q.pixels = static_cast<int>(min64(kTilePixels, rows - q.p0));
  } else {
    q.n = c.n;
    q.p0 = int64_t(c.rem) * kTilePixels;
    q.pixels = static_cast<int>(min64(kTilePixels, pixels - q.p0));
  }
  return q;
}

// The tile of a tensor with `channels` channels, channel range [c0, c0 + count) (zero-padded
// to pad), at tile position q. NCHW: rows = channels, NHWC: rows = pixels.
__device__ __forceinline__ TileSource tile_source(bool nhwc, const float* base, const TilePos& q, int64_t channels,
                                                  int64_t pixels, int c0, int count, int pad) {
  if (nhwc) return {base + q.p0 * channels + c0, channels, q.pixels, count, kTilePixels, pad};
  return {base + (q.n * channels + c0) * pixels + q.p0, pixels, count, q.pixels, pad, kTilePixels};
}
// The matching output tile (mma rows = channels for NCHW, pixels for NHWC).
__device__ __forceinline__ OutTile out_tile(bool nhwc, float* base, const TilePos& q, int64_t channels,
                                            int64_t pixels, int c0, int count, bool vec) {
  if (nhwc) return {base + q.p0 * channels + c0, channels, q.pixels, count, vec};
  return {base + (q.n * channels + c0) * pixels + q.p0, pixels, count, q.pixels, vec};
}

}  // namespace tg::cuda::conv1x1_detail
