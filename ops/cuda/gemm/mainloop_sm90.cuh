// The engine's TF32 kernel for Hopper (sm_90a): the same operands, loaders' A side, output
// map and split reduction as mainloop_sm80.cuh, with the products on wgmma. Two warpgroups
// each own 64 rows of a 128x128 tile; A (the gathered side) is read from the padded shared
// tile into registers (the mma.sync fragment layout, which wgmma's register-A form shares) and
// B sits in shared memory in wgmma's K-major core-matrix layout without swizzle:
//   element (n, k) of a stage's B tile at float ((k / 4) * 128 + n) * 4 + k % 4,
// i.e. 8 rows x 4 k = one 128-byte core matrix; SBO (next 8 rows) = 128 bytes, LBO (next 4 k)
// = 2 KB (wgmma.cuh explains the descriptor). One k8 step = one m64n128k8 per warpgroup.
// FP32 mode stays on the sm80 kernel (its three products need B's low part in shared memory).
// Design note: docs/kernels/gemm.md.
#pragma once
#include <cstdint>

#include "../arch/wgmma.cuh"
#include "mainloop_sm80.cuh"

namespace tg::cuda::engine {

struct Sm90Tile {
  static constexpr int kBM = 128, kBN = 128, kThreads = 256, kStages = 4;
  static constexpr int kTileB = kBN * kBK;  // floats
  static constexpr uint32_t kLboBytes = kBN * 16, kSboBytes = 128;
};

// B's share of a stage: a warp's lanes along 32 consecutive rows (n), each warp one group of 4
// k (8 warps x 4 = BK); a lane copies its 4 k of 4 rows, 16 bytes at once when adjacent and
// aligned. Consecutive lanes write consecutive 16-byte chunks: no bank conflicts.
template <class Op>
struct CoreMatrixLoader {
  static constexpr int kRowsPerThread = Sm90Tile::kBN / 32;
  int lane, group;
  typename Op::Row rows[kRowsPerThread];

  __device__ __forceinline__ void init(const Op& op, int32_t tile_row0, int tid) {
    lane = tid % 32;
    group = tid / 32;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) rows[j] = op.row(tile_row0 + lane + 32 * j);
  }

  __device__ __forceinline__ void load(const Op& op, float* tile, int32_t k0) const {
    typename Op::Col cols[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) cols[i] = op.col(k0 + 4 * group + i);
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      int64_t off[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) off[i] = op.offset(rows[j], cols[i]);
      float* dst = tile + (group * Sm90Tile::kBN + lane + 32 * j) * 4;
      const bool vector = off[0] >= 0 && off[1] == off[0] + 1 && off[2] == off[0] + 2 && off[3] == off[0] + 3 &&
                          (reinterpret_cast<uintptr_t>(op.data + off[0]) & 15) == 0;
      if (vector) {
        cp_async<16>(dst, op.data + off[0], true);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) cp_async<4>(dst + i, op.data + (off[i] >= 0 ? off[i] : 0), off[i] >= 0);
      }
    }
  }
};

template <class OpA, class OpB>
constexpr int sm90_smem_bytes() {
  return Sm90Tile::kStages * (tile_floats<Sm90Tile::kBM, OpA::kContiguousK>() + Sm90Tile::kTileB) *
         int(sizeof(float));
}

template <class OpA, class OpB>
__global__ void __launch_bounds__(Sm90Tile::kThreads) igemm_sm90_kernel(const OpA a, const OpB b,
                                                                       const MainloopArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = Sm90Tile;
  constexpr bool kAK = OpA::kContiguousK;
  constexpr int kTileA = tile_floats<T::kBM, kAK>();
  extern __shared__ __align__(128) float smem[];  // kStages x (A tile, B tile)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = warp * 16;  // warpgroup w = warp / 4 owns rows 64 w .. 64 w + 63
  const int32_t tile_n = blockIdx.x % args.tiles_n, tile_m = blockIdx.x / args.tiles_n;
  const int32_t m0 = tile_m * T::kBM, n0 = tile_n * T::kBN;
  const int32_t k_tiles = (args.red + kBK - 1) / kBK;
  const int32_t kt_begin = blockIdx.y * args.k_tiles_per_split;
  const int32_t kt_end = min(k_tiles, kt_begin + args.k_tiles_per_split);

  TileLoader<OpA, T::kBM, T::kThreads> load_a;
  CoreMatrixLoader<OpB> load_b;
  load_a.init(a, m0, tid);
  load_b.init(b, n0, tid);
  auto stage_a = [&](int s) { return smem + s * (kTileA + T::kTileB); };
  auto stage_b = [&](int s) { return smem + s * (kTileA + T::kTileB) + kTileA; };

#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (kt_begin + s < kt_end) {
      load_a.load(a, stage_a(s), (kt_begin + s) * kBK);
      load_b.load(b, stage_b(s), (kt_begin + s) * kBK);
    }
    cp_async_commit();
  }

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;

  for (int32_t kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait<T::kStages - 2>();
    wgmma::fence_proxy_async();  // this thread's copies, visible to the async proxy ...
    __syncthreads();             // ... of every thread; and every wgmma of the refilled stage retired

    const int s = (kt - kt_begin) % T::kStages;
    const float* sa = stage_a(s);
    uint32_t af[kBK / 8][4];
#pragma unroll
    for (int ks = 0; ks < kBK / 8; ++ks) {
      const int r = row0 + g, k = 8 * ks + t;
      af[ks][0] = tf32_operand(sa[tile_index<T::kBM, kAK>(r, k)]);
      af[ks][1] = tf32_operand(sa[tile_index<T::kBM, kAK>(r + 8, k)]);
      af[ks][2] = tf32_operand(sa[tile_index<T::kBM, kAK>(r, k + 4)]);
      af[ks][3] = tf32_operand(sa[tile_index<T::kBM, kAK>(r + 8, k + 4)]);
    }
    const uint32_t b_addr = shared_address(stage_b(s));
    wgmma::fence();  // the A registers and (first stage) the accumulators were written above
#pragma unroll
    for (int ks = 0; ks < kBK / 8; ++ks) {
      const uint64_t desc = wgmma::kmajor_desc(b_addr + ks * 2 * T::kLboBytes, T::kLboBytes, T::kSboBytes);
      wgmma::mma_rs_tf32<128>(acc, af[ks], desc, true);
    }
    wgmma::commit();
    // The next stage's copies are issued while the tensor cores work on this one: the gathers'
    // address arithmetic overlaps the products. The stage they fill was last read by the
    // previous step's wgmma, retired before this step's barrier.
    const int32_t next = kt + T::kStages - 1;
    if (next < kt_end) {
      const int r = (next - kt_begin) % T::kStages;
      load_a.load(a, stage_a(r), next * kBK);
      load_b.load(b, stage_b(r), next * kBK);
    }
    cp_async_commit();
    wgmma::wait<0>();  // this stage may be refilled after the next barrier
#pragma unroll
    for (int i = 0; i < 64; ++i) wgmma::fence_operand(acc[i]);
  }
  cp_async_wait<0>();

  // acc[4 j + 2 h + e] holds C[row0 + g + 8 h][8 j + 2 t + e].
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) args.store(m0 + row0 + g + 8 * h, n0 + 8 * j + 2 * t + e, acc[4 * j + 2 * h + e]);
#else
  __trap();  // engine.cu launches this kernel only on devices that run sm_90a code
#endif
}

}  // namespace tg::cuda::engine
