// The TMA kernel's epilogue where the output is a plain row-major matrix (Linear, channels-last
// convolutions, grad-weight; f32 or bf16), the split partial sums, or a channels-first
// activation (NCDHW convolution outputs, f32 or bf16): the 128 x kBN accumulator tile is staged
// in the idle stages as 32 x 32 or 128 x 32 f32 boxes (32 x 64, 128 x 64 bf16 ones) in the
// 128-byte swizzle, and one thread hands them to the TMA unit, which clips what lies outside the
// output. Other outputs take store_tile_staged (epilogue_sm90.cuh):
// one store per element through the OutputMap. Design note: docs/kernels/gemm_tma.md.
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
    kChannelsFirst,  // map: the output as M / P images of N x P (args.out, channels-first mode;
                     // the bias added here)
    kRowsBf16,       // map: the M x N bf16 output (args.out.data_bf16, plain; the bias added here)
    kChannelsFirstBf16,  // map: as kChannelsFirst over args.out.data_bf16
  };
  CUtensorMap map;  // kRows, kSplits: boxes of 128 rows x 32 columns; kChannelsFirst: 32 channels
                    // x 32 pixels of one image (64 for kChannelsFirstBf16); kRowsBf16: 128 rows x 64
                    // columns; 128-byte swizzle
  Kind kind = kScalar;
};

constexpr int kStoreBoxBytes = 128 * 32 * 4;  // one 128 x 32 box (128 x 64 bf16): 16 KB, 1024-byte aligned

// Channels-first staging: box (i, j) holds pixels kPix i.. (rows of the tile) of channels 32 j..
// (columns), one 128-byte line per channel, so that the TMA unit writes runs of kPix pixels:
// 32 f32 or 64 bf16 (each sum plus its bias rounded once).
constexpr int kPixelBoxBytes = 32 * 128;
template <bool kBf16>
constexpr int kBoxPixels = kBf16 ? 64 : 32;

// Byte offset of element (r, c) of the tile in the channels-first staging: box (r / kPix, c / 32),
// line c % 32, 16-byte chunk (r % kPix) / (16 / size) XOR c % 8.
template <int kBN, bool kBf16>
__device__ __forceinline__ int channels_first_offset(int r, int c) {
  constexpr int kPix = kBoxPixels<kBf16>, kSize = kBf16 ? 2 : 4, kPerChunk = 16 / kSize;
  const int chunk = ((r % kPix) / kPerChunk) ^ (c % 8);
  return ((r / kPix) * (kBN / 32) + c / 32) * kPixelBoxBytes + (c % 32) * 128 + chunk * 16 + (r % kPerChunk) * kSize;
}

template <int kBN, bool kBf16>
__device__ __forceinline__ void stage_channels_first(const float (&acc)[kBN / 2], unsigned char* stage, int tid,
                                                     int32_t n0, const MainloopArgs& args) {
  // A warp's writes for one register: 8 consecutive rows (one chunk, or two for f32) times 4
  // columns of one parity (four XOR patterns): 32 distinct banks (f32), or 16 banks with two
  // lanes' halves of each word (bf16).
  const int lane = tid % 32, row0 = (tid / 32) * 16, g = lane / 4, t = lane % 4;
  // The bias of column 32 k + lane sits in lane's bias_of[k] and reaches the other lanes by
  // shuffles: loading each of the thread's kBN / 2 columns' own would hold them all in registers
  // beside the accumulators.
  float bias_of[kBN / 32];
#pragma unroll
  for (int k = 0; k < kBN / 32; ++k)
    bias_of[k] = args.out.bias && n0 + 32 * k + lane < args.N ? args.out.bias[n0 + 32 * k + lane] : 0.f;
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * t + e;
      const float b = __shfl_sync(0xffffffffu, bias_of[j / 4], col % 32);  // col / 32 == j / 4
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned char* dst = stage + channels_first_offset<kBN, kBf16>(row0 + g + 8 * h, col);
        if constexpr (kBf16) *reinterpret_cast<uint16_t*>(dst) = encode_bf16(acc[4 * j + 2 * h + e] + b);
        else *reinterpret_cast<float*>(dst) = acc[4 * j + 2 * h + e] + b;
      }
    }
  }
}

// Hands the channels-first boxes of the tile at (m0, n0) to the TMA unit, each clipped at its
// image's last pixel. The unit refuses a store that starts at a negative coordinate (an illegal
// instruction: dev/tma_store_probe.cu), so the rows of a box that run into the next images go
// out in store_straddling_rows.
template <int kBN, bool kBf16>
__device__ __forceinline__ void issue_channels_first(const unsigned char* stage, int32_t m0, int32_t n0,
                                                     const MainloopArgs& args, const TileStore& store) {
  constexpr int kPix = kBoxPixels<kBf16>;
  for (int i = 0; i < 128 / kPix && m0 + kPix * i < args.M; ++i) {
    uint32_t image, pixel;
    args.out.div.divmod(uint32_t(m0 + kPix * i), image, pixel);
    for (int j = 0; j < kBN / 32 && n0 + 32 * j < args.N; ++j)
      tma::store_box_3d(&store.map, stage + (i * (kBN / 32) + j) * kPixelBoxBytes, int(pixel), n0 + 32 * j, int(image));
  }
}

// The rows of each kPix-pixel box past its first image's last pixel (none where the image size is
// a multiple of kPix), stored element by element through the output map by the 256 consumer
// threads: consecutive threads take consecutive pixels of one channel.
template <int kBN, bool kBf16>
__device__ __forceinline__ void store_straddling_rows(const unsigned char* stage, int tid, int32_t m0, int32_t n0,
                                                      const MainloopArgs& args) {
  constexpr int kPix = kBoxPixels<kBf16>;
  const int32_t pixels = int32_t(args.out.div.divisor);
  for (int i = 0; i < 128 / kPix && m0 + kPix * i < args.M; ++i) {
    const int32_t first = pixels - int32_t(uint32_t(m0 + kPix * i) % uint32_t(pixels));  // rows in the first image
    if (first >= kPix) continue;
    const int32_t rows = min(kPix, args.M - (m0 + kPix * i)) - first, cols = min(kBN, args.N - n0);
    for (int32_t idx = tid; idx < rows * cols; idx += 256) {
      const int32_t r = first + idx % rows, c = idx / rows;
      const unsigned char* src = stage + channels_first_offset<kBN, kBf16>(kPix * i + r, c);
      const int64_t at = args.out.offset(m0 + kPix * i + r, n0 + c);
      if constexpr (kBf16) args.out.data_bf16[at] = *reinterpret_cast<const uint16_t*>(src);
      else args.out.data[at] = *reinterpret_cast<const float*>(src);
    }
  }
}

// Row-major staging: box j holds columns kCols j.. of all 128 rows, one 128-byte line per row:
// 32 f32 columns, or 64 bf16 ones (each sum plus its bias rounded once to nearest even).
template <int kBN, bool kBf16>
__device__ __forceinline__ void stage_rows(const float (&acc)[kBN / 2], unsigned char* stage, int tid, int32_t n0,
                                           const float* bias, int32_t N) {
  // Element (r, c) goes to box c / kCols, line r, 16-byte chunk (c % kCols) / (16 / size) XOR
  // r % 8: a warp's writes of one column pair (8 bytes f32, 4 bf16) land in 32 distinct banks.
  constexpr int kCols = kBf16 ? 64 : 32, kSize = kBf16 ? 2 : 4, kPerChunk = 16 / kSize;
  const int lane = tid % 32, row0 = (tid / 32) * 16, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    const int col = 8 * j + 2 * t;
    float b0 = 0.f, b1 = 0.f;
    if (bias) {
      if (n0 + col < N) b0 = bias[n0 + col];
      if (n0 + col + 1 < N) b1 = bias[n0 + col + 1];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + g + 8 * h;
      const int chunk = ((col % kCols) / kPerChunk) ^ (row % 8);
      unsigned char* dst = stage + (col / kCols) * kStoreBoxBytes + row * 128 + chunk * 16 + (col % kPerChunk) * kSize;
      const float v0 = acc[4 * j + 2 * h] + b0, v1 = acc[4 * j + 2 * h + 1] + b1;
      if constexpr (kBf16)
        *reinterpret_cast<uint32_t*>(dst) = uint32_t(encode_bf16(v0)) | (uint32_t(encode_bf16(v1)) << 16);
      else
        *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    }
  }
}

// Called by the 256 consumer threads once every wgmma of the block has retired and no copy into
// `stage` (1024-byte aligned, room for the 128 x kBN tile) is pending; syncs them on named
// barrier 1. acc[4 j + 2 h + e] holds C[row0 + g + 8 h][8 j + 2 t + e] (wgmma's layout).
template <int kBN>
__device__ __forceinline__ void store_tile_tma(const float (&acc)[kBN / 2], unsigned char* stage, int tid, int32_t m0,
                                               int32_t n0, const MainloopArgs& args, const TileStore& store) {
  named_barrier_sync(1, 256);  // both warpgroups are done with the stages' operands
  if (store.kind == TileStore::kChannelsFirst)
    stage_channels_first<kBN, false>(acc, stage, tid, n0, args);
  else if (store.kind == TileStore::kChannelsFirstBf16)
    stage_channels_first<kBN, true>(acc, stage, tid, n0, args);
  else if (store.kind == TileStore::kRowsBf16)
    stage_rows<kBN, true>(acc, stage, tid, n0, args.out.bias, args.N);
  else
    stage_rows<kBN, false>(acc, stage, tid, n0, store.kind == TileStore::kRows ? args.out.bias : nullptr, args.N);
  wgmma::fence_proxy_async();  // the plain shared-memory writes, for the TMA unit
  named_barrier_sync(1, 256);
  if (store.kind == TileStore::kChannelsFirst) {
    if (tid == 0) issue_channels_first<kBN, false>(stage, m0, n0, args, store);
    store_straddling_rows<kBN, false>(stage, tid, m0, n0, args);
  } else if (store.kind == TileStore::kChannelsFirstBf16) {
    if (tid == 0) issue_channels_first<kBN, true>(stage, m0, n0, args, store);
    store_straddling_rows<kBN, true>(stage, tid, m0, n0, args);
  } else if (store.kind == TileStore::kRowsBf16) {
    if (tid == 0)
      for (int b = 0; b < kBN / 64 && n0 + 64 * b < args.N; ++b)
        tma::store_box(&store.map, stage + b * kStoreBoxBytes, n0 + 64 * b, m0);
  } else if (tid == 0) {
    for (int b = 0; b < kBN / 32 && n0 + 32 * b < args.N; ++b) {
      if (store.kind == TileStore::kRows)
        tma::store_box(&store.map, stage + b * kStoreBoxBytes, n0 + 32 * b, m0);
      else
        tma::store_box_3d(&store.map, stage + b * kStoreBoxBytes, n0 + 32 * b, m0, int(blockIdx.y));
    }
  }
  if (tid != 0) return;
  tma::bulk_commit();
  tma::bulk_wait();  // the stages stay valid until the unit has read them; the block then exits
}

}  // namespace tg::cuda::engine
