// The engine's kernel for Hopper (sm_90a): the same operands, output map and split reduction
// as mainloop_sm80.cuh, with the products on wgmma and both operands read by the tensor cores
// straight from shared memory. Two warpgroups each own 64 rows of a 128x128 tile.
//
// Shared memory: each stage holds A and B as 128 rows x 32 k in the 128-byte-swizzled K-major
// layout (wgmma.cuh), which cp.async fills without bank conflicts from either kind of operand
// (k adjacent: 8 threads write one row's 128 bytes; rows adjacent: 8 rows x 4 k per warp).
//
// TF32: the tensor cores read the raw floats (truncation to TF32). One wgmma group stays in
// flight across the stage barrier (wait<1>), so the tensor cores work while the next copies
// are issued; 6 stages, copies 4 stages ahead.
// FP32 (split TF32): after its copies land, each thread rounds the elements it copied to a TF32
// head in place and writes the TF32 rounding of the remainder to a "low" tile; three products
// per k8 step (low*head, head*low, head*head) give FP32 accuracy. Each stage's products are summed
// in their own accumulators and added to the running sum with rounded FP32 adds (the tensor
// cores' accumulation does not round to nearest). 4 stages, copies 3 ahead, wait<0> per stage.
// Design note: docs/kernels/gemm.md.
#pragma once
#include <cstdint>

#include "../arch/wgmma.cuh"
#include "epilogue_sm90.cuh"
#include "mainloop_sm80.cuh"

namespace tg::cuda::engine {

template <bool kSplitTf32>
struct Sm90Pipeline {
  static constexpr int kBM = 128, kBN = 128, kThreads = 256;
  static constexpr int kTileFloats = 128 * kBK;            // one operand's stage: 16 KB
  static constexpr int kStages = kSplitTf32 ? 4 : 6;
  static constexpr int kDistance = kSplitTf32 ? 3 : 4;     // stages copied ahead
  static constexpr int kLowBuffers = kSplitTf32 ? 2 : 0;   // (A low, B low) pairs
  static constexpr int kFloats = (kStages + kLowBuffers) * 2 * kTileFloats;
  static constexpr int kSmemBytes = kFloats * int(sizeof(float)) + 1024;  // + alignment slack
  // Slot reuse: a slot refilled at iteration i was read by the wgmma of iteration
  // i + kDistance - kStages, which every warpgroup retired before iteration i's barrier.
  static_assert(kDistance <= kStages - (kSplitTf32 ? 1 : 2), "copies would overwrite a stage in use");
};

// Float index of element (row, k) in a 128-byte-swizzled K-major tile of 32 k per row.
__device__ __forceinline__ int sw128_index(int row, int k) {
  return row * kBK + ((((k >> 2) ^ row) & 7) << 2) + (k & 3);
}

// One operand's share of a stage for the swizzled layout (128 rows x 32 k, 256 threads; each
// thread 4 rows x 4 k). k adjacent: 8 threads along one row's 32 k (4 each, one 16-byte copy
// when adjacent and aligned), rows row_first + 32 j. Rows adjacent: warp w covers rows
// 64 (w / 4) .. +63 and k 8 (w % 4) .. +7; a lane takes row lane % 16 of each group of 16 and k
// parity lane / 16, so one copy instruction reads two 64-byte runs of rows and its 4-byte
// writes fall on 16 distinct banks (2-way conflict); every k's column state (the costly part of
// a gather) is computed for 4 k per thread.
template <class Op>
struct SwizzledLoader {
  static constexpr bool kK = Op::kContiguousK;
  static constexpr int kRowsPerThread = 4, kColsPerThread = 4;
  int row_first, k_first;
  typename Op::Row rows[kRowsPerThread];

  __device__ __forceinline__ int row_of(int j) const { return row_first + j * (kK ? 32 : 16); }
  __device__ __forceinline__ int k_of(int i) const { return kK ? k_first + i : k_first + 2 * i; }

  __device__ __forceinline__ void init(const Op& op, int32_t tile_row0, int tid) {
    const int lane = tid % 32, warp = tid / 32;
    row_first = kK ? tid / 8 : 64 * (warp / 4) + lane % 16;
    k_first = kK ? (tid % 8) * 4 : 8 * (warp % 4) + lane / 16;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) rows[j] = op.row(tile_row0 + row_of(j));
  }

  __device__ __forceinline__ void load(const Op& op, float* tile, int32_t k0) const {
    if constexpr (kK) {
      if (op.k4) {  // one 16-byte copy per row from one offset (operands.cuh: k4)
        const typename Op::Col col = op.col(k0 + k_first);
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) {
          const int64_t off = op.offset(rows[j], col);
          cp_async<16>(tile + sw128_index(row_of(j), k_first), op.data + (off >= 0 ? off : 0), off >= 0);
        }
        return;
      }
    }
    typename Op::Col cols[kColsPerThread];
#pragma unroll
    for (int i = 0; i < kColsPerThread; ++i) cols[i] = op.col(k0 + k_of(i));
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      if constexpr (kK) {
        int64_t off[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) off[i] = op.offset(rows[j], cols[i]);
        float* dst = tile + sw128_index(row_of(j), k_first);
        const bool vector = off[0] >= 0 && off[1] == off[0] + 1 && off[2] == off[0] + 2 && off[3] == off[0] + 3 &&
                            (reinterpret_cast<uintptr_t>(op.data + off[0]) & 15) == 0;
        if (vector) {
          cp_async<16>(dst, op.data + off[0], true);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) cp_async<4>(dst + i, op.data + (off[i] >= 0 ? off[i] : 0), off[i] >= 0);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kColsPerThread; ++i) {
          const int64_t off = op.offset(rows[j], cols[i]);
          cp_async<4>(tile + sw128_index(row_of(j), k_of(i)), op.data + (off >= 0 ? off : 0), off >= 0);
        }
      }
    }
  }

  // FP32 mode, after this thread's copies of the stage landed: the elements it copied become
  // TF32 heads in place, and the TF32 roundings of their remainders go to `low` (same layout).
  __device__ __forceinline__ void split(float* tile, float* low) const {
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      if constexpr (kK) {
        const int idx = sw128_index(row_of(j), k_first);
        float4 v = *reinterpret_cast<const float4*>(tile + idx);
        float4 lo;
        split_head(v.x, lo.x);
        split_head(v.y, lo.y);
        split_head(v.z, lo.z);
        split_head(v.w, lo.w);
        *reinterpret_cast<float4*>(tile + idx) = v;
        *reinterpret_cast<float4*>(low + idx) = lo;
      } else {
#pragma unroll
        for (int i = 0; i < kColsPerThread; ++i) {
          const int idx = sw128_index(row_of(j), k_of(i));
          float v = tile[idx], lo;
          split_head(v, lo);
          tile[idx] = v;
          low[idx] = lo;
        }
      }
    }
  }
  __device__ __forceinline__ static void split_head(float& v, float& lo) {
    const float head = __uint_as_float(tf32_bits(v));
    lo = __uint_as_float(tf32_bits(v - head));
    v = head;
  }
};

template <class OpA, class OpB, bool kSplitTf32>
__global__ void __launch_bounds__(256, 1) igemm_sm90_kernel(const OpA a, const OpB b, const MainloopArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using P = Sm90Pipeline<kSplitTf32>;
  extern __shared__ float smem_raw[];
  // The swizzle pattern is anchored to 1024-byte boundaries of the shared window.
  float* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023) / 4;
  auto stage_a = [&](int s) { return smem + s * 2 * P::kTileFloats; };
  auto stage_b = [&](int s) { return smem + (s * 2 + 1) * P::kTileFloats; };
  auto low_a = [&](int s) { return smem + (P::kStages + s) * 2 * P::kTileFloats; };
  auto low_b = [&](int s) { return smem + ((P::kStages + s) * 2 + 1) * P::kTileFloats; };

  const int tid = threadIdx.x, warpgroup = tid / 128;
  const int32_t tile_n = blockIdx.x % args.tiles_n, tile_m = blockIdx.x / args.tiles_n;
  const int32_t m0 = tile_m * P::kBM, n0 = tile_n * P::kBN;
  const int32_t k_tiles = (args.red + kBK - 1) / kBK;
  const int32_t kt_begin = blockIdx.y * args.k_tiles_per_split;
  const int32_t kt_end = min(k_tiles, kt_begin + args.k_tiles_per_split);

  SwizzledLoader<OpA> load_a;
  SwizzledLoader<OpB> load_b;
  load_a.init(a, m0, tid);
  load_b.init(b, n0, tid);
#pragma unroll
  for (int s = 0; s < P::kDistance; ++s) {
    if (kt_begin + s < kt_end) {
      load_a.load(a, stage_a(s), (kt_begin + s) * kBK);
      load_b.load(b, stage_b(s), (kt_begin + s) * kBK);
    }
    cp_async_commit();  // empty groups keep the count uniform
  }

  float acc[64];
  float part[kSplitTf32 ? 64 : 1];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  // Each warpgroup's 64 rows start 64 rows (8 KB) into the A tile.
  const uint32_t a_rows = uint32_t(warpgroup) * 64 * kBK * 4;

  for (int32_t kt = kt_begin; kt < kt_end; ++kt) {
    const int i = kt - kt_begin, s = i % P::kStages;
    cp_async_wait<P::kDistance - 1>();
    if constexpr (kSplitTf32) {
      load_a.split(stage_a(s), low_a(i % 2));
      load_b.split(stage_b(s), low_b(i % 2));
    }
    wgmma::fence_proxy_async();  // this thread's shared writes, visible to the async proxy ...
    __syncthreads();             // ... of every thread
    wgmma::fence();
    const uint32_t a_addr = shared_address(stage_a(s)) + a_rows, b_addr = shared_address(stage_b(s));
    if constexpr (kSplitTf32) {
      const uint32_t al_addr = shared_address(low_a(i % 2)) + a_rows, bl_addr = shared_address(low_b(i % 2));
#pragma unroll
      for (int ks = 0; ks < kBK / 8; ++ks) {
        const uint32_t k_bytes = ks * 32;
        const uint64_t da = wgmma::sw128_kmajor_desc(a_addr + k_bytes), db = wgmma::sw128_kmajor_desc(b_addr + k_bytes);
        wgmma::mma_ss_tf32<128>(part, wgmma::sw128_kmajor_desc(al_addr + k_bytes), db, ks > 0);
        wgmma::mma_ss_tf32<128>(part, da, wgmma::sw128_kmajor_desc(bl_addr + k_bytes), true);
        wgmma::mma_ss_tf32<128>(part, da, db, true);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kBK / 8; ++ks) {
        const uint32_t k_bytes = ks * 32;
        wgmma::mma_ss_tf32<128>(acc, wgmma::sw128_kmajor_desc(a_addr + k_bytes),
                                wgmma::sw128_kmajor_desc(b_addr + k_bytes), true);
      }
    }
    wgmma::commit();
    // The copies of a later stage are issued while the tensor cores work on this one.
    const int32_t next = kt + P::kDistance;
    if (next < kt_end) {
      const int r = (i + P::kDistance) % P::kStages;
      load_a.load(a, stage_a(r), next * kBK);
      load_b.load(b, stage_b(r), next * kBK);
    }
    cp_async_commit();
    if constexpr (kSplitTf32) {
      wgmma::wait<0>();
#pragma unroll
      for (int q = 0; q < 64; ++q) {
        wgmma::fence_operand(part[q]);
        acc[q] += part[q];
      }
    } else {
      wgmma::wait<1>();  // the previous stage's products retired: its slot may be refilled
    }
  }
  wgmma::wait<0>();
#pragma unroll
  for (int q = 0; q < 64; ++q) wgmma::fence_operand(acc[q]);
  cp_async_wait<0>();  // this thread's copies; the epilogue's barrier covers the others'
  static_assert(staged_tile_floats<128, 128>() <= P::kFloats, "staged tile must fit the stages");
  store_tile_staged<128>(acc, smem, tid, m0, n0, args);
#else
  __trap();  // engine.cu launches this kernel only on devices that run sm_90a code
#endif
}

}  // namespace tg::cuda::engine
