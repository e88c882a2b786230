// What the two Hopper 1x1 forward kernels share (conv1x1/fprop_sm90.cu: the weight resident for
// reductions up to 64 channels; conv1x1/fprop_streamed_sm90.cu: the weight streamed beside the
// activations, channels-first): the tile, where it lies, the order in which a k8 step's eight
// reduction channels meet the A fragment, and the channels-first fragment loads and staging.
// Design: docs/kernels/conv1x1.md.
#pragma once
#include <cstdint>

#include "ops/cuda/arch/cp_async.cuh"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tf32.cuh"

namespace tg::cuda::conv1x1_sm90 {

constexpr int kTileRows = 128;                 // pixels per tile
constexpr int kHalfRows = 64;                  // per warpgroup (wgmma's M)
constexpr int kOutChannels = 128;              // per tile (wgmma's N)
constexpr int kBoxFloats = 32;                 // the inner side of a swizzled box: 128 bytes
constexpr int kConsumers = 256, kThreads = kConsumers + 32;
constexpr int kStagingBytes = kHalfRows * kOutChannels * 4;  // 32 KB per warpgroup

constexpr int64_t kCoordinateLimit = (int64_t(1) << 31) - kTileRows;  // TMA coordinates are 32-bit

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// An activation value as wgmma's A operand: FP32 mode (kSplit) its TF32 head and the TF32
// rounding of the remainder; else the plain TF32 operand (lo unused).
template <bool kSplit>
__device__ __forceinline__ void tf32_fragment(float v, uint32_t& hi, uint32_t& lo) {
  if constexpr (kSplit) {
    hi = tf32_bits(v);
    lo = tf32_operand(v - __uint_as_float(hi));
  } else {
    hi = tf32_operand(v);
  }
}

// Makes the k8 steps' fragments exist before wgmma::fence: left to itself the compiler sinks
// their arithmetic between the wgmma, and ptxas then serializes them (C7519/C7520).
template <bool kSplit, int kSteps>
__device__ __forceinline__ void pin_fragments(uint32_t (&hi)[kSteps][4], uint32_t (&lo)[kSteps][4]) {
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    asm volatile("" : "+r"(hi[ks][0]), "+r"(hi[ks][1]), "+r"(hi[ks][2]), "+r"(hi[ks][3]));
    if constexpr (kSplit) asm volatile("" : "+r"(lo[ks][0]), "+r"(lo[ks][1]), "+r"(lo[ks][2]), "+r"(lo[ks][3]));
  }
}

// Where a tile lies: channels-first tiles never straddle two images.
struct TilePlace {
  int n, pixel;  // image and first pixel (channels-last: n = 0, pixel = first row)
};
template <bool kNchw>
__device__ __forceinline__ TilePlace place_of(int64_t tile, int64_t tiles_per_image) {
  if constexpr (kNchw) {
    const int64_t n = tile / tiles_per_image;
    return {static_cast<int>(n), static_cast<int>((tile - n * tiles_per_image) * kTileRows)};
  } else {
    return {0, static_cast<int>(tile * kTileRows)};
  }
}

// The reduction channel that column k of the product carries. Channels-first, lane (g, t) loads
// channels 2t and 2t + 1 of each k8 step (conflict-free with the swizzle) into the fragment's
// columns t and t + 4, so the weight's columns are stored in that order: only a reordering of
// the sum's terms.
template <bool kNchw>
__host__ __device__ __forceinline__ int channel_of_column(int k) {
  if constexpr (!kNchw) return k;
  const int c = k & 7;
  return (k & ~7) + (c < 4 ? 2 * c : 2 * (c - 4) + 1);
}

// Channels-first A fragments. A stage holds the tile's 128 pixels as four boxes of
// [channels][32 pixels] in the 128-byte swizzle, box_bytes apart. Lane (g, t)'s pixels
// 16 wi + g + 8 h of its warpgroup's 64 lie in box 2 wg + wi / 2 at 4-pixel chunk
// 4 (wi % 2) + 2 h + g / 4; its channels are rows 2 t + e (+ 8 per k8 step) of that box, so the
// chunk is stored at position chunk ^ (2 t + e): 8 values over the warp's (g / 4, t), 32
// different banks. a_off[2 e + h], for a[0..3] = (g, col t), (g + 8, t), (g, t + 4), (g + 8, t + 4);
// k8 step ks adds ks * 8 rows of 128 bytes.
__device__ __forceinline__ void nchw_fragment_offsets(uint32_t (&a_off)[4], int wg, int wi, int g, int t,
                                                      int box_bytes) {
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 2 * t + e, chunk = (4 * (wi & 1) + 2 * h + (g >> 2)) ^ row;
      a_off[2 * e + h] = (2 * wg + (wi >> 1)) * box_bytes + row * 128 + chunk * 16 + 4 * (g & 3);
    }
}

// Channels-first staging, [128 channels][64 pixels] dense: result (pixel 16 wi + g + 8 h,
// channel 8 j + 2 t + e) at float (8 j + 2 t + e) 64 + 16 wi + g + 8 h. Rows are 256 bytes, so a
// float's bank is its pixel's: a warp's 16 pixels can fill 16 banks at best, and with all lanes
// storing the same h the 4 lanes of a g would collide 4 ways. In step x lane (g, t) stores
// h = x ^ (t / 2): 2 ways (st_off[2 e + x]), accepted for the 256-byte rows of one dense TMA
// store (short 128-byte box rows store slower; see docs/kernels/conv1x1.md).
__device__ __forceinline__ void nchw_staging_offsets(uint32_t (&st_off)[4], float* staging, int wi, int g, int t) {
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int x = 0; x < 2; ++x)
      st_off[2 * e + x] = shared_address(staging + (2 * t + e) * kHalfRows + 16 * wi + g + 8 * (x ^ (t >> 1)));
}

// The warpgroup's 64 x 128 accumulators plus bias_of(j) (the bias of channels 8 j + 2 t and
// + 1) into its channels-first staging. acc[4 j + 2 h + e] = (pixel 16 wi + g + 8 h, channel
// 8 j + 2 t + e); step x stores h = x ^ (t / 2) (a select: a register index must be known at
// compile time), 8 rows per j.
template <class BiasOf>
__device__ __forceinline__ void stage_nchw_tile(const float (&acc)[64], const uint32_t (&st_off)[4], int t,
                                                BiasOf&& bias_of) {
  const bool upper = (t >> 1) != 0;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const bool h = upper != (x != 0);
      const float2 b = bias_of(j);
      st_shared(st_off[x] + j * 8 * kHalfRows * 4, (h ? acc[4 * j + 2] : acc[4 * j]) + b.x);
      st_shared(st_off[2 + x] + j * 8 * kHalfRows * 4, (h ? acc[4 * j + 3] : acc[4 * j + 1]) + b.y);
    }
}

}  // namespace tg::cuda::conv1x1_sm90
