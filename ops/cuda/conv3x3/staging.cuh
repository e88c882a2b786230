// What the 3x3 convolution kernels (conv3x3/fprop_sm80.cu and conv3x3/wgrad_sm80.cu on mma.sync,
// conv3x3/fprop_sm90.cu and conv3x3/fprop_tf32_sm90.cu on wgmma) share: the predicated store, the row-grid
// loader and the NCHW input-halo stager (the mma.sync kernels and conv3x3/fprop_sm90.cu), the tile
// order and the per-stage load cursor, with the small integer helpers they use. One copy of the
// code, so the kernels walk and stage their tiles alike. Device code only; included inside those files' anonymous namespaces' parent
// (tg::cuda), each translation unit gets its own copy.
#pragma once
#include <cstdint>

#include "../arch/cp_async.cuh"
#include "../arch/int_math.h"
#include "../arch/named_barrier.cuh"
#include "../arch/tf32.cuh"

namespace tg::cuda {
namespace {

// Copies a grid of rows, row (outer, inner) for outer < kOuter, inner < kInner, each kPerRow
// vectors of kVec floats, from global memory (row start: src_base + outer * src_outer +
// inner * src_inner elements) to shared memory (dst + outer * dst_outer + inner * dst_inner
// floats). Rows with outer >= outer_end or inner outside [inner_begin, inner_end), and vectors
// outside [j_begin, j_end), are zero-filled. Consecutive lanes take consecutive vectors of a
// row (coalesced); kLanes lanes (a power of two covering kPerRow, at most 32) share a row and
// each pass moves every thread to a row a fixed distance away, so all trip counts are
// compile-time constants and a copy costs a few integer adds.
constexpr int lanes_for(int per_row) {
  int lanes = 1;
  while (lanes < per_row && lanes < 32) lanes *= 2;
  return lanes;
}
struct RowGrid {
  const float* src;
  int64_t src_base, src_outer, src_inner;  // elements
  int dst_outer, dst_inner;                // floats
  int outer_end, inner_begin, inner_end, j_begin, j_end;
};
template <int kThreads, int kOuter, int kInner, int kPerRow, int kVec>
__device__ __forceinline__ void copy_grid(float* dst, const RowGrid& g) {
  constexpr int kLanes = lanes_for(kPerRow), kSlots = kThreads / kLanes;  // rows per pass
  static_assert(kThreads % kLanes == 0, "rows must not straddle threads");
  // Either each slot keeps its inner row and steps over outer rows, or (when the slots do not
  // divide into whole outer rows) each slot keeps an outer row and steps through the inner ones
  // (all of them, or with more slots than outer rows every (kSlots / kOuter)-th one).
  constexpr bool kInnerFixed = kSlots % kInner == 0;
  if constexpr (!kInnerFixed && kOuter % kSlots != 0 && kSlots % kOuter == 0 &&
                kInner % (kSlots / kOuter) == 0) {
    // More slots than outer rows (512 threads over 8 channels of a 6-row halo): each slot keeps
    // an outer row and steps through every (kSlots / kOuter)-th inner row.
    constexpr int kStep = kSlots / kOuter, kPassesAll = kInner / kStep;
    constexpr int kColPassesAll = (kPerRow + kLanes - 1) / kLanes;
    const int lane_j_all = threadIdx.x % kLanes, slot_all = threadIdx.x / kLanes;
    const int outer = slot_all % kOuter, inner0 = slot_all / kOuter;
    int64_t row_src = g.src_base + outer * g.src_outer + inner0 * g.src_inner + lane_j_all * kVec;
    float* row_dst = dst + outer * g.dst_outer + inner0 * g.dst_inner + lane_j_all * kVec;
#pragma unroll
    for (int i = 0; i < kPassesAll; ++i) {
      const int inner = inner0 + i * kStep;
      const bool row_ok = outer < g.outer_end && inner >= g.inner_begin && inner < g.inner_end;
#pragma unroll
      for (int jj = 0; jj < kColPassesAll; ++jj) {
        const int j = lane_j_all + jj * kLanes;
        if (kPerRow % kLanes != 0 && j >= kPerRow) break;
        const bool ok = row_ok && j >= g.j_begin && j < g.j_end;
        cp_async<4 * kVec>(row_dst + jj * kLanes * kVec, g.src + (ok ? row_src + jj * kLanes * kVec : 0), ok);
      }
      row_src += kStep * g.src_inner;
      row_dst += kStep * g.dst_inner;
    }
  } else {  // fixed inner row per slot, or fixed outer row per slot
  static_assert(kInnerFixed || kOuter % kSlots == 0, "no fixed-stride row schedule");
  constexpr int kPasses = kInnerFixed ? (kOuter * kInner + kSlots - 1) / kSlots : kInner * (kOuter / kSlots);
  constexpr int kColPasses = (kPerRow + kLanes - 1) / kLanes;
  const int lane_j = threadIdx.x % kLanes, slot = threadIdx.x / kLanes;
  const int outer0 = kInnerFixed ? slot / kInner : slot, inner0 = kInnerFixed ? slot % kInner : 0;
  bool col_ok[kColPasses];
#pragma unroll
  for (int jj = 0; jj < kColPasses; ++jj) {
    const int j = lane_j + jj * kLanes;
    col_ok[jj] = j >= g.j_begin && j < g.j_end;
  }
  // Row starts advance by a fixed step per pass (or, with fixed outer rows, by one inner row and
  // a jump after each kInner passes): incremental, so nothing per pass is kept in registers.
  int64_t row_src = g.src_base + outer0 * g.src_outer + inner0 * g.src_inner + lane_j * kVec;
  float* row_dst = dst + outer0 * g.dst_outer + inner0 * g.dst_inner + lane_j * kVec;
  const int64_t src_step = kInnerFixed ? (kSlots / kInner) * g.src_outer : g.src_inner;
  const int dst_step = kInnerFixed ? (kSlots / kInner) * g.dst_outer : g.dst_inner;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int outer = outer0 + (kInnerFixed ? i * (kSlots / kInner) : (i / kInner) * kSlots);
    const int inner = inner0 + (kInnerFixed ? 0 : i % kInner);
    if (kInnerFixed && (kOuter * kInner) % kSlots != 0 && outer >= kOuter) break;
    const bool row_ok = outer < g.outer_end && inner >= g.inner_begin && inner < g.inner_end;
#pragma unroll
    for (int jj = 0; jj < kColPasses; ++jj) {
      if (kPerRow % kLanes != 0 && lane_j + jj * kLanes >= kPerRow) break;  // the next row's space
      const bool ok = row_ok && col_ok[jj];
      // row_src lies past the tensor's edges when !row_ok: it is not read then.
      cp_async<4 * kVec>(row_dst + jj * kLanes * kVec, g.src + (ok ? row_src + jj * kLanes * kVec : 0), ok);
    }
    if (kInnerFixed || i % kInner != kInner - 1) {
      row_src += src_step;
      row_dst += dst_step;
    } else {  // next outer block of kSlots rows, back to inner row 0
      row_src += kSlots * g.src_outer - (kInner - 1) * g.src_inner;
      row_dst += kSlots * g.dst_outer - (kInner - 1) * g.dst_inner;
    }
  }
  }
}

// *ptr = v if pred, as one predicated store: no branch for the compiler to sink address
// arithmetic into (it would recompute a 64-bit address per store under register pressure).
__device__ __forceinline__ void store_if(float* ptr, float v, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.global.f32 [%0], %1;\n}\n" ::"l"(ptr), "f"(v),
      "r"(static_cast<int>(pred))
      : "memory");
}

// (ptr[0], ptr[1]) = (v0, v1) if pred (ptr 8-byte aligned), predicated like store_if.
__device__ __forceinline__ void store2_if(float* ptr, float v0, float v1, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p st.global.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(ptr), "f"(v0),
      "f"(v1), "r"(static_cast<int>(pred))
      : "memory");
}

__host__ __device__ constexpr int64_t pos_mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }
__host__ __device__ constexpr int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ constexpr int64_t clamp_i64(int64_t a, int64_t lo, int64_t hi) { return a < lo ? lo : a > hi ? hi : a; }

// The NCHW input halo of a 3x3 convolution tile (T: the kernel's tile, with kRowLen, kXChan,
// kChunk, kHaloRows, kThreads; Params: its launch parameters, with Hin, Win, Cin).
// Stages input channels [c0, c0 + 8) of the halo rows; out-of-range elements become 0.
// The row window starts at column iw0, a multiple of kVec (as Win is).
template <class T, int kVec, class Params>
__device__ __forceinline__ void load_halo(float* xs, const float* __restrict__ in, const Params& p, int64_t n,
                                          int64_t c0, int64_t ih0, int64_t iw0) {
  constexpr int kPerRow = T::kRowLen / kVec;
  const int64_t plane = p.Hin * p.Win;
  const RowGrid g{in,
                  (n * p.Cin + c0) * plane + ih0 * p.Win + iw0,  // element (c0, ih0, iw0), maybe outside
                  plane,
                  p.Win,
                  T::kXChan,
                  T::kRowLen,
                  static_cast<int>(min_i64(T::kChunk, p.Cin - c0)),
                  static_cast<int>(clamp_i64(-ih0, 0, T::kHaloRows)),
                  static_cast<int>(clamp_i64(p.Hin - ih0, 0, T::kHaloRows)),
                  static_cast<int>(clamp_i64(ceil_div(-iw0, kVec), 0, kPerRow)),
                  static_cast<int>(clamp_i64(ceil_div(p.Win - iw0, kVec), 0, kPerRow))};
  copy_grid<T::kThreads, T::kChunk, T::kHaloRows, kPerRow, kVec>(xs, g);
}

// Where tile `tile` of a pass lies (T: the kernel's tile, with kOutChannels output channels, kRows x
// kCols pixels; Params: its launch parameters). Channel tiles vary fastest, then columns, rows, images:
// blocks running together share their input halo rows in L2.
struct TileCoord {
  int64_t n, oh0, ow0, k0;
};
template <class T, class Params>
__device__ __forceinline__ TileCoord tile_coord(int64_t tile, const Params& p) {
  TileCoord c;
  c.k0 = (tile % p.k_tiles) * T::kOutChannels;
  tile /= p.k_tiles;
  c.ow0 = (tile % p.col_tiles) * T::kCols;
  tile /= p.col_tiles;
  c.oh0 = (tile % p.row_tiles) * T::kRows;
  c.n = tile / p.row_tiles;
  return c;
}

// The block's next (tile, channel chunk) to load. Advanced once per stage; the tile's
// coordinates are recomputed (64-bit divisions) only when the tile changes.
struct LoadCursor {
  int64_t tile, chunk;
  TileCoord tc;
};
template <class T, class Params>
__device__ __forceinline__ void advance(LoadCursor& c, const Params& p) {
  if (++c.chunk < p.chunks) return;
  c.chunk = 0;
  c.tile += gridDim.x;
  if (c.tile < p.tiles) c.tc = tile_coord<T>(c.tile, p);
}

// The input halo of the cursor's (tile, channel chunk) into `stage`, with the widest copies
// p.vec allows; `xoff` aligns the window's first column to the copy width.
template <class T, class Params>
__device__ __forceinline__ void load_chunk_halo(float* stage, const float* __restrict__ in, const Params& p,
                                                const LoadCursor& cur, int xoff) {
  const int64_t c0 = cur.chunk * T::kChunk;
  const int64_t ih0 = cur.tc.oh0 - p.pad_h;
  const int64_t iw0 = cur.tc.ow0 - p.pad_w - xoff;
  if (p.vec == 4) load_halo<T, 4>(stage, in, p, cur.tc.n, c0, ih0, iw0);
  else if (p.vec == 2) load_halo<T, 2>(stage, in, p, cur.tc.n, c0, ih0, iw0);
  else load_halo<T, 1>(stage, in, p, cur.tc.n, c0, ih0, iw0);
}

}  // namespace
}  // namespace tg::cuda
