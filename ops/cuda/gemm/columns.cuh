// Written-out input columns for the grad-weight products (conv_wgrad_sm90_tma.cu,
// conv_wgrad_shifted_sm90.cu): cols[c * kvol + t][r] = x at output pixel r (< N * P, over
// every image) and tap t, zero in the padding and from N * P up to the row length. Also a
// padded copy of a tensor: with a 1x1 "kernel", output extents larger than the input and the
// padding as the offset, the columns of one tap are the input placed inside a zero border.
#pragma once
#include <algorithm>

#include "operands.cuh"
#include "planning.h"

namespace tg::cuda::engine {

// Rows of whole 16 bytes (the TMA unit's row-stride rule, and where its boxes may start): 4
// floats, 8 bf16.
template <class T>
constexpr int64_t kRowMultiple = 16 / sizeof(T);

namespace {

// Input pixel of output pixel r (< N * P) at tap offsets (dz, dy, dx): its offset inside
// image n (-1 in the padding), and n.
__device__ __forceinline__ int64_t tap_pixel(const ConvGeometry& g, uint32_t r, int32_t dz, int32_t dy, int32_t dx,
                                             uint32_t& n) {
  uint32_t p;
  g.div_out_volume.divmod(r, n, p);
  int32_t od, oh, ow;
  g.unravel_out(p, od, oh, ow);
  const int32_t iw = ow * g.stride[2] - g.pad[2] + dx;
  const int32_t ih = oh * g.stride[1] - g.pad[1] + dy;
  const int32_t id = od * g.stride[0] - g.pad[0] + dz;
  if (iw < 0 || iw >= g.in[2] || ih < 0 || ih >= g.in[1] || id < 0 || id >= g.in[0]) return -1;
  return (int64_t(id) * g.in[1] + ih) * g.in[2] + iw;
}

// Where the columns go: copy 0 is the columns themselves; each further copy j (the shifted-rows
// grad-weight's, conv_wgrad_shifted_sm90.cu) is the same flat array read from element
// residue[j] on, copy_j[m] = copy_0[m + residue[j]], its last residue[j] elements zeros. Each
// element is written to every copy as it is computed: one pass instead of a copy per copy.
struct ColumnCopies {
  static constexpr int kMaxCopies = 8;  // one per residue of a 16-byte column: kRowMultiple<bf16>
  static_assert(kMaxCopies >= kRowMultiple<uint16_t>);
  int32_t count = 1;
  int32_t residue[kMaxCopies] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t copy_elements = 0;  // elements per copy

  template <class T>
  __device__ __forceinline__ void store(T* cols, int64_t i, T v) const {
    cols[i] = v;
    for (int j = 1; j < count; ++j) {
      T* copy = cols + j * copy_elements;
      if (i >= residue[j]) copy[i - residue[j]] = v;
      else copy[copy_elements - residue[j] + i] = T(0);  // the first residue[j] elements zero the tail
    }
  }
};

// Channels-first x: cols[j = c * kvol + t][r = n * P + p] for r < N * P, zeros up to row_len.
// One row j per blockIdx.y (its channel and tap decoded once), threads along r: reads run
// along the input row, writes are coalesced. Each thread takes several r (the grid is sized
// for it): per-thread setup would otherwise cost more than the copy. 32-bit unsigned indices:
// row_len fits int32, and a stride past it cannot wrap.
// T: float, or uint16_t (bf16 bit patterns, copied as they are; zeros +0).
template <class T>
__global__ void columns_kernel(T* __restrict__ cols, const T* __restrict__ x, ConvGeometry g, uint32_t row_len,
                               int64_t rows, ColumnCopies copies) {
  const uint32_t pixels = uint32_t(int64_t(g.N) * g.out_volume);
  for (int64_t j = blockIdx.y; j < rows; j += gridDim.y) {
    uint32_t c, t;
    g.div_kernel_volume.divmod(uint32_t(j), c, t);
    int32_t dz, dy, dx;
    g.tap_offsets(t, dz, dy, dx);
    for (uint32_t r = blockIdx.x * blockDim.x + threadIdx.x; r < row_len; r += gridDim.x * blockDim.x) {
      T v = T(0);
      if (r < pixels) {
        uint32_t n;
        const int64_t pixel = tap_pixel(g, r, dz, dy, dx, n);
        if (pixel >= 0) v = x[(int64_t(n) * g.C + c) * g.in_volume + pixel];
      }
      copies.store(cols, j * row_len + r, v);
    }
  }
}

// Channels-last x: the same columns through a 32 x 32 shared tile per (32 pixels, 32
// channels, tap), so that reads run along the channels and writes along the pixels (a direct
// gather would read one float per C * 4 bytes). 32 x 8 threads.
constexpr int kColumnsTile = 32, kColumnsTileRows = 8;
template <class T>
__global__ void columns_channels_last_kernel(T* __restrict__ cols, const T* __restrict__ x, ConvGeometry g,
                                             uint32_t row_len, int32_t kvol, ColumnCopies copies) {
  __shared__ T tile[kColumnsTile][kColumnsTile + 1];
  const uint32_t pixels = uint32_t(int64_t(g.N) * g.out_volume);
  const int lane = threadIdx.x, row = threadIdx.y;
  for (int32_t t = blockIdx.z; t < kvol; t += gridDim.z) {
    int32_t dz, dy, dx;
    g.tap_offsets(uint32_t(t), dz, dy, dx);
    for (int32_t c0 = blockIdx.y * kColumnsTile; c0 < g.C; c0 += gridDim.y * kColumnsTile) {
      for (uint32_t r0 = blockIdx.x * kColumnsTile; r0 < row_len; r0 += gridDim.x * kColumnsTile) {
        for (int i = row; i < kColumnsTile; i += kColumnsTileRows) {  // tile[pixel][channel]
          const uint32_t r = r0 + i;
          T v = T(0);
          if (r < pixels && c0 + lane < g.C) {
            uint32_t n;
            const int64_t pixel = tap_pixel(g, r, dz, dy, dx, n);
            if (pixel >= 0) v = x[(int64_t(n) * g.in_volume + pixel) * g.C + c0 + lane];
          }
          tile[i][lane] = v;
        }
        __syncthreads();
        for (int i = row; i < kColumnsTile; i += kColumnsTileRows) {  // cols[channel c0 + i][pixel]
          const uint32_t r = r0 + lane;
          if (c0 + i < g.C && r < row_len) copies.store(cols, (int64_t(c0 + i) * kvol + t) * row_len + r, tile[lane][i]);
        }
        __syncthreads();
      }
    }
  }
}

// Blocks along a row of row_len elements for columns_kernel: about 8 per thread.
inline unsigned row_blocks(int64_t row_len) {
  constexpr int64_t kPerThread = 8;
  return static_cast<unsigned>(std::clamp<int64_t>((row_len + kThreads * kPerThread - 1) / (kThreads * kPerThread), 1, 1024));
}

// cols (C * kvol rows of row_len) of s's input x, s's layout, and its shifted copies after it;
// on `stream`. row_len < 2^31.
template <class T>
void write_columns(T* cols, const T* x, const ConvShape& s, int64_t row_len, cudaStream_t stream,
                   const ColumnCopies& copies = {}) {
  if (s.channels_last()) {
    const int64_t pixel_tiles = (row_len + kColumnsTile - 1) / kColumnsTile;
    const int64_t channel_tiles = (s.C + kColumnsTile - 1) / kColumnsTile;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(pixel_tiles, 2048)),
                    static_cast<unsigned>(std::min<int64_t>(channel_tiles, 65535)),
                    static_cast<unsigned>(std::min<int64_t>(s.kernel_volume(), 65535)));
    columns_channels_last_kernel<T><<<grid, dim3(kColumnsTile, kColumnsTileRows), 0, stream>>>(
        cols, x, geometry(s), uint32_t(row_len), int32_t(s.kernel_volume()), copies);
  } else {
    const int64_t col_rows = s.C * s.kernel_volume();
    const dim3 grid(row_blocks(row_len), static_cast<unsigned>(std::min<int64_t>(col_rows, 65535)));
    columns_kernel<T><<<grid, kThreads, 0, stream>>>(cols, x, geometry(s), uint32_t(row_len), col_rows, copies);
  }
  TG_LAUNCH_CHECK();
}

}  // namespace
}  // namespace tg::cuda::engine
