// The register-A wgmma kernel of conv3x3/fprop_sm90.cu (which says what it computes and how),
// its tiles, parameters, weight re-layout and planning. Included by that file only: everything
// here is in an anonymous namespace.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tf32.cuh"
#include "ops/cuda/arch/wgmma.cuh"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv3x3/staging.cuh"
#include "ops/cuda/conv3x3/fprop_sm90.h"

namespace tg::cuda {
namespace {

// The sm_90a-only instructions are compiled only where the architecture has them
// (__CUDA_ARCH_FEAT_SM90_ALL: -arch sm_90a); elsewhere the kernel is a trap and
// conv3x3_wgmma_applies says false. wgmma building blocks: ops/cuda/arch/wgmma.cuh (shared with
// conv3x3/fprop_tf32_sm90.cu); dynamic shared memory: ops/cuda/arch/shared_memory.cuh.

constexpr int kStages = 4;  // smem pipeline depth; a stage is refilled 2 steps after its use (see the header)

// Smallest stride >= n (a multiple of 4 floats, for 16-byte copies) such that the 8 x 4 lanes
// of a fragment load, at addresses (lane % 4) * stride + lane / 4, hit 32 distinct banks.
constexpr int stride_for_rows_of_4(int n) {
  while (n % 4 != 0 || (n % 32 != 8 && n % 32 != 24)) ++n;
  return n;
}

// The halos are staged by copy_grid (ops/cuda/conv3x3/staging.cuh, shared with the mma.sync kernels).

// Block tile: kRows x kCols output pixels of one image times kN output channels, kWarpgroups
// warpgroups. The tile has kRows * 2 m64 tiles (64 consecutive columns of one row); m64 tile
// m lies in row m / 2, columns 64 (m % 2) .. + 63. Warpgroup w owns m64 tiles w kMT .. w kMT +
// kMT - 1 (kMT = 1, or even so that its tiles start at column 0 of a row).
// Warpgroups per block (2 or 4; see the header for why 2).
#ifndef TG_CONV3X3_WGMMA_WARPGROUPS
#define TG_CONV3X3_WGMMA_WARPGROUPS 2
#endif
template <int kRows_, int kN_, bool kSplit_ = false>
struct WgTile {
  static constexpr int kRows = kRows_, kCols = 128, kN = kN_;
  // FP32-accurate split products (see "FP32 mode" in the header): a second accumulator set for
  // the cross terms and a second B image (the weights' low parts) per tap.
  static constexpr bool kSplit = kSplit_;
  static constexpr int kWarpgroups = TG_CONV3X3_WGMMA_WARPGROUPS, kThreads = 128 * kWarpgroups;
  static constexpr int kMT = kRows * (kCols / 64) / kWarpgroups;  // m64 tiles per warpgroup
  static_assert(kMT == 1 || kMT % 2 == 0, "a warpgroup's m64 tiles start at column 0 of a row or are one tile");
  static constexpr int kOutChannels = kN;  // per tile (conv3x3/staging.cuh walks tiles by it)
  static constexpr int kAcc = kN / 2;                 // f32 accumulators per thread per m64 tile
  static_assert(kMT * kAcc * (kSplit ? 2 : 1) * kWarpgroups == 256,
                "256 / warpgroups accumulators per thread (64 at 512 threads: 128 registers)");
  static constexpr int kChunk = 8;  // input channels per stage: one k8 step per tap
  static constexpr int kHaloRows = kRows + 2;
  static constexpr int kRowLen = kCols + 8;  // kCols + 2 halo columns + <= 3 alignment shift, whole vectors
  static constexpr int kXChan = stride_for_rows_of_4(kHaloRows * kRowLen);  // A: lanes t -> channels
  static constexpr int kXStage = kChunk * kXChan;
  // B image of one tap: [k half (2)][n (kN)][4 floats]; of one stage: 9 taps (FP32 split: the 9
  // high-part images, then the 9 low-part images).
  static constexpr int kTapFloats = kChunk * kN;
  static constexpr int kImages = kSplit ? 2 : 1;
  static constexpr int kWStage = kImages * 9 * kTapFloats;
  static constexpr int kStageFloats = kXStage + kWStage;
  static_assert(kXStage % 4 == 0 && kStageFloats % 4 == 0, "B images must start on 16-byte boundaries");
  static constexpr uint32_t kLboBytes = kN * 16;  // k 4..7 of a row after k 0..3 (core matrices along K)
  static constexpr uint32_t kSboBytes = 8 * 16;   // the next 8 output channels (core matrices along N)
  static constexpr size_t kSmemBytes = sizeof(float) * kStages * kStageFloats;
  // Staged stores: a warpgroup's scratch (32 channels x its kMT * 64 pixels, rows padded by 4);
  // two retired stages hold all warpgroups' (warpgroups 2 i and 2 i + 1 at offset i).
  static constexpr int kScratchFloats = 32 * (kMT * 64 + 4);
  static_assert((kWarpgroups + 1) / 2 * kScratchFloats <= kStageFloats, "staged stores fit in two stages");
  static_assert(kN % 32 == 0, "staged stores: rounds of 32 channels");
  // Halo offset of m64 tile m (row m / 2, column 64 (m % 2)); of this warpgroup's tile mt
  // relative to its first one (compile-time: kMT is 1 or even).
  __host__ __device__ static constexpr int tile_offset(int m) { return (m / 2) * kRowLen + 64 * (m % 2); }
};
// More than 64 output channels: 2 x 128 pixels x 128 channels (218 KB of shared memory), m64n128
// tiles. At most 64: 4 x 128 pixels x 64 channels (179 KB), m64n64 tiles.
using WideWg = WgTile<2, 128>;
using NarrowWg = WgTile<4, 64>;
// FP32 mode, any number of output channels (in tiles of 64): 2 x 128 pixels x 64 channels,
// m64n64 tiles with 32 + 32 accumulators each (218 KB of shared memory).
using SplitWg = WgTile<2, 64, true>;

// One implicit-GEMM pass: out (N, Kout, Hout, Wout) = conv3x3(in (N, Cin, Hin, Win), prepared w)
// with input row = output row + tap row - pad_h (likewise columns); pads may be negative.
struct WgParams {
  int64_t N, Cin, Hin, Win;
  int64_t Kout, Hout, Wout;
  int64_t pad_h, pad_w;
  int64_t chunks;  // ceil(Cin / 8)
  int64_t row_tiles, col_tiles, k_tiles, tiles;
  int vec;     // floats per input copy (4, 2 or 1): rows of `in` allow this alignment
  bool pairs;  // Wout even and out 8-byte aligned: staged stores, two adjacent columns per store
};

// Issues the copies of the cursor's (tile, chunk) into `stage`: the halo, then the chunk's
// B images (one contiguous block of the prepared weights, laid out as in shared memory).
template <class T>
__device__ __forceinline__ void load_step(float* stage, const float* __restrict__ in, const float* __restrict__ wp,
                                          const WgParams& p, const LoadCursor& cur, int xoff) {
  load_chunk_halo<T>(stage, in, p, cur, xoff);

  const float* src = wp + (cur.chunk * p.k_tiles + cur.tc.k0 / T::kN) * T::kWStage;
  float* dst = stage + T::kXStage;
  constexpr int kVectors = T::kWStage / 4;
#pragma unroll
  for (int i = 0; i < (kVectors + T::kThreads - 1) / T::kThreads; ++i) {
    const int v = threadIdx.x + i * T::kThreads;
    if (kVectors % T::kThreads != 0 && v >= kVectors) break;
    cp_async<16>(dst + 4 * v, src + 4 * v, true);
  }
}

// The A fragments of one tap for this thread's kMT m64 tiles. xa: the thread's base in the
// stage (channel t, the halo position of its warpgroup's first m64 tile, column + 16 * warp + g,
// plus the shift). FP32 split: hi = tf32(x) in a, lo = x - hi (exact) in a_lo; lo's low 13 bits
// are left for the tensor core to drop (truncating lo costs ~2^-22 of x: far below 1e-5).
template <class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[T::kMT][4], uint32_t (&a_lo)[T::kMT][4], const float* xa,
                                       int tap) {
  const float* xt = xa + (tap / 3) * T::kRowLen + tap % 3;
#pragma unroll
  for (int mt = 0; mt < T::kMT; ++mt) {
    const float* q = xt + T::tile_offset(mt);
    // (pixel g, channel t), (pixel g + 8, channel t), (pixel g, channel t + 4), (g + 8, t + 4)
    const float v[4] = {q[0], q[8], q[4 * T::kXChan], q[4 * T::kXChan + 8]};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[mt][i] = tf32_bits(v[i]);
      if constexpr (T::kSplit) a_lo[mt][i] = __float_as_uint(v[i] - __uint_as_float(a[mt][i]));
    }
  }
}

// Matrix descriptor of the B image at shared address `addr` (no swizzle, K-major; the header
// explains LBO and SBO).
template <class T>
__device__ __forceinline__ uint64_t b_descriptor(uint32_t addr) {
  return wgmma::kmajor_desc(addr, T::kLboBytes, T::kSboBytes);
}

template <class T>
__device__ __forceinline__ void wgmma_tile(float (&d)[T::kAcc], const uint32_t (&a)[4], uint64_t desc,
                                           bool accumulate) {
  wgmma::mma_rs_tf32<T::kN>(d, a, desc, accumulate);
}

// The 9 k8 steps (taps) of one stage for this warpgroup. a: 3 register sets of A fragments,
// tap uses a[tap % 3]; on entry no running wgmma reads a[0] (the previous stage's tap 8 wait
// retired its tap 6). w_addr: shared address of the stage's B images. accumulate: false for
// the first stage of a tile (the wgmma overwrite the accumulators).
// FP32 split (T::kSplit): x = hi + lo, w = hi' + lo' (all TF32); acc += hi*hi' and
// cross += lo*hi' + hi*lo': three m64nNk8 of one shape per m64 tile and tap (no wgmma.fence
// needed between them: same-shape accumulation is ordered by the hardware). a_lo: lo fragments.
template <class T>
__device__ __forceinline__ void wgmma_stage(float (&acc)[T::kMT][T::kAcc], float (&cross)[T::kMT][T::kAcc],
                                            uint32_t (&a)[3][T::kMT][4], uint32_t (&a_lo)[3][T::kMT][4],
                                            const float* xa, uint32_t w_addr, bool accumulate) {
  load_a<T>(a[0], a_lo[0], xa, 0);
#pragma unroll
  for (int tap = 0; tap < 9; ++tap) {
    const uint64_t desc = b_descriptor<T>(w_addr + tap * T::kTapFloats * 4);
    wgmma::fence();  // a[tap % 3] (and, after an epilogue, the accumulators) were written by this thread
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt) {
      wgmma_tile<T>(acc[mt], a[tap % 3][mt], desc, accumulate || tap > 0);
      if constexpr (T::kSplit) {
        const uint64_t desc_lo = b_descriptor<T>(w_addr + (9 + tap) * T::kTapFloats * 4);
        wgmma_tile<T>(cross[mt], a_lo[tap % 3][mt], desc, accumulate || tap > 0);  // lo * hi'
        wgmma_tile<T>(cross[mt], a[tap % 3][mt], desc_lo, true);                    // + hi * lo'
      }
    }
    wgmma::commit();
    // tap - 2 retired: a[(tap + 1) % 3] is free. FP32 split: tap - 1 retired too, so only 2 of
    // the 3 sets are live at once (with 3 live, ptxas ran out of registers and serialized every
    // wgmma with a full wait); one tap of 3 wgmma per warpgroup stays in flight over the loads.
    wgmma::wait<T::kSplit ? 1 : 2>();
    if (tap < 8) load_a<T>(a[(tap + 1) % 3], a_lo[(tap + 1) % 3], xa, tap + 1);
  }
}

// Writes a finished tile (+ bias). This thread holds, for its m64 tile mt (m = wg kMT + mt of the
// block tile), pixels (row m / 2, column 64 (m % 2) + 16 wi + g + 8 half) and channels
// k0 + 8 j + 2 t + e:
// acc[mt][4 j + 2 half + e]. Pixel offsets inside the tile are 32-bit and computed once; the
// channel pointer steps by whole planes (addresses past the tensor are formed for channels
// >= Kout or pixels outside the output, and never stored to).
template <class T>
__device__ __forceinline__ void store_tile(float* __restrict__ out, const float* __restrict__ bias,
                                           const WgParams& p, const TileCoord& tc,
                                           const float (&acc)[T::kMT][T::kAcc], int wg, int wi, int g, int t) {
  const int64_t plane = p.Hout * p.Wout;
  int pix[T::kMT][2];
  unsigned pix_ok = 0;  // bit 2 * mt + half
#pragma unroll
  for (int mt = 0; mt < T::kMT; ++mt) {
    const int m = wg * T::kMT + mt;  // m64 tile of the block tile
    const int row = m / 2;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int col = 64 * (m % 2) + 16 * wi + g + 8 * half;
      pix[mt][half] = row * static_cast<int>(p.Wout) + col;  // < kRows * Wout: fits
      if (tc.oh0 + row < p.Hout && tc.ow0 + col < p.Wout) pix_ok |= 1u << (2 * mt + half);
    }
  }
  const int64_t k_first = tc.k0 + 2 * t;
  float* channel = out + ((tc.n * p.Kout + k_first) * p.Hout + tc.oh0) * p.Wout + tc.ow0;
#pragma unroll
  for (int j = 0; j < T::kN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t k = k_first + 8 * j + e;
      const bool k_ok = k < p.Kout;
      const float b = bias && k_ok ? bias[k] : 0.f;
#pragma unroll
      for (int mt = 0; mt < T::kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half)
          store_if(channel + pix[mt][half], acc[mt][4 * j + 2 * half + e] + b,
                   k_ok && (pix_ok >> (2 * mt + half) & 1u));
      }
      channel += e == 0 ? plane : 7 * plane;  // channels 8 j + e: +1, then +7
    }
  }
}

// Writes a finished tile (+ bias) through `scratch` (this warpgroup's, in a stage the pipeline
// has retired), for outputs whose rows allow 8-byte stores (p.pairs). The fragments (lane g, t of
// warp wi: pixel 16 wi + g + 8 half of m64 tile mt, channel 8 j + 2 t + e) go into a
// [channel][pixel] image of 32 channels at a time (row stride kPx + 4 = 4 mod 32 words: the 32
// lanes of a write hit 32 banks); after a warpgroup barrier each warp reads 8 channel rows back
// and writes, per m64 tile, 64 consecutive pixels of one output row with one 8-byte store per
// lane (256 contiguous bytes per instruction). From the fragments (store_tile) every 4-byte store
// instruction would cover 4 channels x 8 pixels (32-byte pieces of 4 rows).
template <class T>
__device__ __forceinline__ void store_tile_staged(float* __restrict__ out, const float* __restrict__ bias,
                                                  const WgParams& p, const TileCoord& tc,
                                                  const float (&acc)[T::kMT][T::kAcc], float* scratch, int wg, int wi,
                                                  int lane) {
  constexpr int kPx = T::kMT * 64, kStride = kPx + 4, kRoundChannels = 32;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int round = 0; round < T::kN / kRoundChannels; ++round) {
#pragma unroll
    for (int jj = 0; jj < kRoundChannels / 8; ++jj)
#pragma unroll
      for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            scratch[(8 * jj + 2 * t + e) * kStride + 64 * mt + 16 * wi + g + 8 * half] =
                acc[mt][4 * (4 * round + jj) + 2 * half + e];
    named_barrier_sync(1 + wg, 128);  // the warpgroup's fragments are in
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int c = 8 * wi + r;  // channel of the round
      const int64_t k = tc.k0 + kRoundChannels * round + c;
      const float b = bias && k < p.Kout ? bias[k] : 0.f;
#pragma unroll
      for (int mt = 0; mt < T::kMT; ++mt) {
        const int m = wg * T::kMT + mt;  // m64 tile of the block tile: row m / 2, columns 64 (m % 2) ..
        const int64_t oh = tc.oh0 + m / 2, ow = tc.ow0 + 64 * (m % 2) + 2 * lane;
        const float2 v = *reinterpret_cast<const float2*>(scratch + c * kStride + 64 * mt + 2 * lane);
        store2_if(out + ((tc.n * p.Kout + k) * p.Hout + oh) * p.Wout + ow, v.x + b, v.y + b,
                  k < p.Kout && oh < p.Hout && ow < p.Wout);
      }
    }
    named_barrier_sync(1 + wg, 128);  // read back before the next round overwrites
  }
}

// out = conv3x3(in, wp) (+ bias). Persistent: the grid loops over tiles and the pipeline runs
// over the block's (tile, chunk) steps without a break.
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    conv3x3_wgmma_kernel(float* __restrict__ out,         // (N, Kout, Hout, Wout)
                         const float* __restrict__ in,    // (N, Cin, Hin, Win)
                         const float* __restrict__ wp,    // (chunks, k_tiles, 9, 2, kN, 4)
                         const float* __restrict__ bias,  // (Kout) or null
                         WgParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float* smem = dynamic_smem<128>();
  const uint32_t smem_addr = shared_address(smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int wg = warp / 4, wi = warp % 4;  // warpgroup, warp within it
  // Every tile has the same alignment shift: ow0 is a multiple of kCols, hence of vec.
  const int xoff = static_cast<int>(pos_mod(-p.pad_w, p.vec));
  const int a_base = t * T::kXChan + T::tile_offset(wg * T::kMT) + 16 * wi + g + xoff;

  float acc[T::kMT][T::kAcc], cross[T::kMT][T::kAcc];  // cross: FP32 split only (else unused)
#pragma unroll
  for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
    for (int i = 0; i < T::kAcc; ++i) acc[mt][i] = cross[mt][i] = 0.f;
  uint32_t a[3][T::kMT][4], a_lo[3][T::kMT][4];

  LoadCursor cur{blockIdx.x, 0, tile_coord<T>(blockIdx.x, p)};
#pragma unroll 1
  for (int s = 0; s < 2; ++s) {
    if (cur.tile < p.tiles) {  // the cursor runs past the block's last tile when its steps are all loaded
      load_step<T>(smem + s * T::kStageFloats, in, wp, p, cur, xoff);
      advance<T>(cur, p);
    }
    cp_async_commit();
  }
  int load_stage = 2, compute_stage = 0;
  // One (tile, chunk) step: publish its stage, refill the one used 2 steps ago, run its 9 taps.
  const auto run_step = [&](bool accumulate) {
    cp_async_wait<1>();   // this thread's copies of this step have landed (one newer group may be open)
    wgmma::fence_proxy_async();  // ... and are visible to the wgmma's operand reads
    __syncthreads();      // everyone's are; stage (step + 2) % 4 was last read by step - 2: retired
    if (cur.tile < p.tiles) {
      load_step<T>(smem + load_stage * T::kStageFloats, in, wp, p, cur, xoff);
      advance<T>(cur, p);
    }
    cp_async_commit();
    load_stage = load_stage == kStages - 1 ? 0 : load_stage + 1;
    const int stage_off = compute_stage * T::kStageFloats;
    compute_stage = compute_stage == kStages - 1 ? 0 : compute_stage + 1;
    wgmma_stage<T>(acc, cross, a, a_lo, smem + stage_off + a_base, smem_addr + 4u * (stage_off + T::kXStage),
                   accumulate);
  };
  // The first chunk of a tile is peeled off the chunk loop so that wgmma are in flight on both
  // paths into the loop head (else ptxas drains the warpgroup on the back edge, C7517).
#pragma unroll 1
  for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
    run_step(/*accumulate=*/false);  // scale-d = 0: the tile's accumulators start over
#pragma unroll 1
    for (int chunk = 1; chunk < p.chunks; ++chunk) run_step(/*accumulate=*/true);  // chunks < 2^28
    wgmma::wait<0>();
#pragma unroll
    for (int mt = 0; mt < T::kMT; ++mt)
#pragma unroll
      for (int i = 0; i < T::kAcc; ++i) {
        wgmma::fence_operand(acc[mt][i]);
        if constexpr (T::kSplit) {
          wgmma::fence_operand(cross[mt][i]);
          acc[mt][i] += cross[mt][i];  // rounded to nearest (the tensor core's sums truncate)
        }
      }
    if (p.pairs) {
      // Both warpgroups retired the last step: its stage and the one before (loaded next only
      // after the next step's barrier; no copy is in flight into either) hold the scratch.
      __syncthreads();
      const int last = compute_stage == 0 ? kStages - 1 : compute_stage - 1;
      float* scratch = smem + (wg % 2 ? last : load_stage) * T::kStageFloats + (wg / 2) * T::kScratchFloats;
      store_tile_staged<T>(out, bias, p, tile_coord<T>(tile, p), acc, scratch, wg, wi, lane);
    } else {
      store_tile<T>(out, bias, p, tile_coord<T>(tile, p), acc, wg, wi, g, t);
    }
  }
  cp_async_wait<0>();  // nothing outstanding at exit (the last groups are empty)
#else
  __trap();  // conv3x3_wgmma_applies is false for builds without sm_90a code
#endif
}

// wp (chunks, k_tiles, images, 9 taps, 2 k halves, kN, 4) from w (K, C, 3, 3): element (chunk,
// kt, img, tap, h, n, q) belongs to input channel ci = 8 chunk + 4 h + q and output channel
// o = kt kN + n, zero outside. Forward: w[o][ci][tap]. Grad-input (the convolution of dy with the
// flipped kernel, channels swapped: Cin = K, Kout = C): w[ci][o][8 - tap]. Image 0 holds the
// weight rounded to TF32 once here (hi'); with 2 images (FP32 split), image 1 holds
// lo' = tf32(w - hi').
__global__ void prepare_wgmma_weights_kernel(float* __restrict__ wp, const float* __restrict__ w, int64_t K,
                                             int64_t C, int64_t chunks, int64_t k_tiles, int kN, int images,
                                             bool for_grad_input) {
  const int64_t total = chunks * k_tiles * images * 9 * 8 * kN;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t q = i % 4, n = i / 4 % kN, h = i / (4 * kN) % 2, tap = i / (8 * kN) % 9;
    const int64_t img = i / (72 * kN) % images, kt = i / (72 * kN * images) % k_tiles;
    const int64_t chunk = i / (72 * kN * images * k_tiles);
    const int64_t ci = 8 * chunk + 4 * h + q, o = kt * kN + n;
    float v = 0.f;
    if (!for_grad_input) {
      if (ci < C && o < K) v = w[(o * C + ci) * 9 + tap];
    } else {
      if (ci < K && o < C) v = w[(ci * C + o) * 9 + (8 - tap)];
    }
    const float hi = __uint_as_float(tf32_round(v));
    wp[i] = img == 0 ? hi : __uint_as_float(tf32_round(v - hi));
  }
}

// ---- planning (host) ----

inline WgParams forward_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo,
                               int64_t pad_h, int64_t pad_w) {
  WgParams p{};
  p.N = N, p.Cin = C, p.Hin = H, p.Win = W;
  p.Kout = K, p.Hout = Ho, p.Wout = Wo;
  p.pad_h = pad_h, p.pad_w = pad_w;
  return p;
}
// Grad-input: out = dx (N, C, H, W) from in = dy (N, K, Ho, Wo), padding 2 - pad.
inline WgParams grad_input_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo,
                                  int64_t pad_h, int64_t pad_w) {
  WgParams p{};
  p.N = N, p.Cin = K, p.Hin = Ho, p.Win = Wo;
  p.Kout = C, p.Hout = H, p.Wout = W;
  p.pad_h = 2 - pad_h, p.pad_w = 2 - pad_w;
  return p;
}
inline bool use_narrow_tile(const WgParams& p) { return p.Kout <= NarrowWg::kN; }

template <class T>
WgParams plan(WgParams p, int vec, bool out_aligned_8) {
  p.k_tiles = ceil_div(p.Kout, T::kN);
  p.chunks = ceil_div(p.Cin, T::kChunk);
  p.row_tiles = ceil_div(p.Hout, T::kRows);
  p.col_tiles = ceil_div(p.Wout, T::kCols);
  p.tiles = p.N * p.row_tiles * p.col_tiles * p.k_tiles;
  p.vec = vec;
  p.pairs = p.Wout % 2 == 0 && out_aligned_8;
  return p;
}

}  // namespace
}  // namespace tg::cuda
