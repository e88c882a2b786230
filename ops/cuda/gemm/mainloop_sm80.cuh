// The engine's kernel for sm_80 and later: a C[M][N] = sum_k A[m][k] B[n][k] tile per block on
// mma.sync TF32 m16n8k8, operands gathered by cp.async into a multi-stage shared-memory ring.
// A and B are any of operands.cuh's types; the output goes through an OutputMap (layouts, bias)
// or, when the reduction is split over blockIdx.y, into a plain partial-sum workspace that
// engine.cu reduces in a fixed order (deterministic: no atomics anywhere).
// Design note: docs/kernels/gemm.md.
#pragma once
#include <cstdint>

#include "../../../core/half.h"
#include "../arch/cp_async.cuh"
#include "../arch/fast_divmod.h"
#include "../arch/mma_sync.cuh"
#include "../arch/tf32.cuh"

namespace tg::cuda::engine {

constexpr int kBK = 32;  // reduction slice per stage

template <int kBM_, int kBN_, int kWarpsM_, int kWarpsN_, int kStages_>
struct TileConfig {
  static constexpr int kBM = kBM_, kBN = kBN_, kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;
  static constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8;  // mma tiles per warp
  static_assert(kWarpM % 16 == 0 && kWarpN % 8 == 0, "warp tile must be whole mma tiles");
};
// BigTile: 256 threads, 64x32 per warp. Three stages let two blocks share an SM when the
// kernel fits 128 registers (plain matrices at TF32); the gathers need more registers, run one
// block per SM, and hide their longer address work behind a fourth stage.
using BigTile = TileConfig<128, 128, 2, 4, 3>;
using BigTileDeep = TileConfig<128, 128, 2, 4, 4>;
using SmallTile = TileConfig<64, 64, 2, 2, 4>;   // 128 threads, 32x32 per warp
using NarrowTile = TileConfig<128, 16, 4, 1, 4>;  // 128 threads, 32x16 per warp: N <= 16

// Floats of one operand's tile in shared memory. Rows of BK+4 (k adjacent) or BK rows of
// ROWS+8 (rows adjacent): both paddings make the fragment reads of a warp hit 32 banks.
template <int kRows, bool kContiguousK>
constexpr int tile_floats() {
  return kContiguousK ? kRows * (kBK + 4) : kBK * (kRows + 8);
}
template <int kRows, bool kContiguousK>
__device__ __forceinline__ int tile_index(int row, int k) {
  return kContiguousK ? row * (kBK + 4) + k : k * (kRows + 8) + row;
}

// Where each C element goes: the layouts of the convolution outputs, the bias, and the element
// type (f32, or bf16 rounded to nearest even: the BF16 products' outputs).
struct OutputMap {
  enum Mode : int32_t {
    kPlain,                // out[m * N + n]
    kChannelsFirst,        // m = (img, p): out[(img * N + n) * P + p]   (NCDHW outputs)
    kWeightsChannelsLast,  // n = t * C + c: out[m * N + c * kvol + t]   (wgrad of NHWC)
    kPhase,                // m = (img, j) of a dgrad stride phase: input pixel first + stride * j
  };
  // kPhase: the phase's pixel grid and the input it scatters into.
  struct Phase {
    FastDivmod div_count_volume, div_count_w, div_count_h;
    int32_t first[3], stride[3], in[3];
    int64_t in_volume;
    bool channels_last;
  };
  float* data;
  uint16_t* data_bf16;  // set (data null): a bf16 output at the same offsets, each sum rounded once
  const float* bias;    // (N) or null
  int32_t M, N;
  Mode mode;
  FastDivmod div;  // P (kChannelsFirst) or C (kWeightsChannelsLast)
  int32_t kvol;
  Phase phase;

  __device__ __forceinline__ int64_t offset(int32_t m, int32_t n) const {
    if (mode == kPlain) return int64_t(m) * N + n;
    uint32_t q, r;
    if (mode == kPhase) {
      uint32_t img, jz, jy, jx;
      phase.div_count_volume.divmod(uint32_t(m), img, q);
      phase.div_count_w.divmod(q, q, jx);
      phase.div_count_h.divmod(q, jz, jy);
      const int64_t pixel = (int64_t(phase.first[0] + phase.stride[0] * int32_t(jz)) * phase.in[1] +
                             (phase.first[1] + phase.stride[1] * int32_t(jy))) * phase.in[2] +
                            (phase.first[2] + phase.stride[2] * int32_t(jx));
      return phase.channels_last ? (int64_t(img) * phase.in_volume + pixel) * N + n
                                 : (int64_t(img) * N + n) * phase.in_volume + pixel;
    }
    if (mode == kChannelsFirst) {
      div.divmod(uint32_t(m), q, r);
      return (int64_t(q) * N + n) * div.divisor + r;
    }
    div.divmod(uint32_t(n), q, r);  // q = tap, r = channel
    return int64_t(m) * N + int64_t(r) * kvol + q;
  }
  __device__ __forceinline__ void store(int32_t m, int32_t n, float v) const {
    if (bias) v += bias[n];
    if (data_bf16) data_bf16[offset(m, n)] = encode_bf16(v);
    else data[offset(m, n)] = v;
  }
  // Whether consecutive m (pixels) land on consecutive addresses: the channels-first layouts.
  __device__ __forceinline__ bool m_contiguous() const {
    return mode == kChannelsFirst || (mode == kPhase && !phase.channels_last);
  }
};

struct MainloopArgs {
  int32_t M, N, red;
  int32_t tiles_n;
  int32_t k_tiles_per_split;
  float* partials;  // [splits][M][N] when the reduction is split, else null
  OutputMap out;

  // C[m][n] of this block's split (blockIdx.y): into the partial sums, or through the map.
  __device__ __forceinline__ void store(int32_t m, int32_t n, float v) const {
    if (m >= M || n >= N) return;
    if (partials) partials[(int64_t(blockIdx.y) * M + m) * N + n] = v;
    else out.store(m, n, v);
  }
  __device__ __forceinline__ bool m_contiguous() const { return !partials && out.m_contiguous(); }
};

// The epilogue's second half, shared by the engine's kernels. Storing each accumulator straight
// through the OutputMap would unroll the map's branches and divisions once per element: code
// larger than the instruction cache, which then stalls every warp on instruction fetch. So the
// kernels first stage their kBM x kBN tile in shared memory (row stride kBN + 1: odd, so that
// reading a column is free of bank conflicts), and this one small loop applies the map,
// consecutive threads on consecutive addresses of the output's contiguous dimension.
template <int kBM, int kBN>
constexpr int staged_tile_floats() {
  return kBM * (kBN + 1);
}
template <int kBM, int kBN, int kThreads>
__device__ __forceinline__ void store_staged_tile(const float* stage, int tid, int32_t m0, int32_t n0,
                                                  const MainloopArgs& args) {
  constexpr int kStride = kBN + 1;
  const int rows = min(kBM, args.M - m0), cols = min(kBN, args.N - n0);
  if (args.m_contiguous()) {
    for (int e = tid; e < kBM * kBN; e += kThreads) {
      const int m = e % kBM, n = e / kBM;
      if (m < rows && n < cols) args.store(m0 + m, n0 + n, stage[m * kStride + n]);
    }
  } else {
    for (int e = tid; e < kBM * kBN; e += kThreads) {
      const int n = e % kBN, m = e / kBN;
      if (m < rows && n < cols) args.store(m0 + m, n0 + n, stage[m * kStride + n]);
    }
  }
}

// One operand's share of a stage: which rows and reduction indices this thread copies.
// k adjacent: 8 threads along k (4 consecutive each, one 16-byte copy when the four are
// adjacent and aligned), the rest along rows. Rows adjacent: a warp's lanes along rows.
template <class Op, int kRows, int kThreads>
struct TileLoader {
  static constexpr bool kK = Op::kContiguousK;
  static constexpr int kRowThreads = kK ? kThreads / 8 : 32;
  static constexpr int kRowsPerThread = kRows / kRowThreads;
  static constexpr int kKStep = kK ? 1 : kThreads / 32;
  static constexpr int kKPerThread = kK ? 4 : kBK / kKStep;
  static_assert(kRows % kRowThreads == 0 && kBK % kKStep == 0, "tile does not divide among threads");

  int row_first, k_first;
  typename Op::Row rows[kRowsPerThread];

  __device__ __forceinline__ void init(const Op& op, int32_t tile_row0, int tid) {
    row_first = kK ? tid / 8 : tid % 32;
    k_first = kK ? (tid % 8) * 4 : tid / 32;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) rows[j] = op.row(tile_row0 + row_first + j * kRowThreads);
  }

  __device__ __forceinline__ void load(const Op& op, float* tile, int32_t k0) const {
    if constexpr (kK) {
      if (op.k4) {  // one 16-byte copy per row from one offset (operands.cuh: k4)
        const typename Op::Col col = op.col(k0 + k_first);
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) {
          const int64_t off = op.offset(rows[j], col);
          cp_async<16>(tile + tile_index<kRows, true>(row_first + j * kRowThreads, k_first),
                       op.data + (off >= 0 ? off : 0), off >= 0);
        }
        return;
      }
      typename Op::Col cols[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) cols[i] = op.col(k0 + k_first + i);
#pragma unroll
      for (int j = 0; j < kRowsPerThread; ++j) {
        int64_t off[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) off[i] = op.offset(rows[j], cols[i]);
        float* dst = tile + tile_index<kRows, true>(row_first + j * kRowThreads, k_first);
        const bool vector = off[0] >= 0 && off[1] == off[0] + 1 && off[2] == off[0] + 2 && off[3] == off[0] + 3 &&
                            (reinterpret_cast<uintptr_t>(op.data + off[0]) & 15) == 0;
        if (vector) {
          cp_async<16>(dst, op.data + off[0], true);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) cp_async<4>(dst + i, op.data + (off[i] >= 0 ? off[i] : 0), off[i] >= 0);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kKPerThread; ++i) {
        const int k = k_first + i * kKStep;
        const typename Op::Col col = op.col(k0 + k);
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) {
          const int64_t off = op.offset(rows[j], col);
          float* dst = tile + tile_index<kRows, false>(row_first + j * kRowThreads, k);
          cp_async<4>(dst, op.data + (off >= 0 ? off : 0), off >= 0);
        }
      }
    }
  }
};

// x as a TF32 operand (TF32 mode), or split into a TF32 head and the TF32 rounding of the
// remainder (FP32 mode: three products give FP32 accuracy).
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  big = tf32_bits(x);
  small = tf32_operand(x - __uint_as_float(big));
}

template <class Cfg, class OpA, class OpB, bool kSplitTf32>
__global__ void __launch_bounds__(Cfg::kThreads) igemm_sm80_kernel(const OpA a, const OpB b, const MainloopArgs args) {
  constexpr bool kAK = OpA::kContiguousK, kBKc = OpB::kContiguousK;
  constexpr int kTileA = tile_floats<Cfg::kBM, kAK>(), kTileB = tile_floats<Cfg::kBN, kBKc>();
  extern __shared__ __align__(128) float smem[];  // kStages x (A tile, B tile)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_m0 = (warp / Cfg::kWarpsN) * Cfg::kWarpM, warp_n0 = (warp % Cfg::kWarpsN) * Cfg::kWarpN;
  const int32_t tile_n = blockIdx.x % args.tiles_n, tile_m = blockIdx.x / args.tiles_n;
  const int32_t m0 = tile_m * Cfg::kBM, n0 = tile_n * Cfg::kBN;

  const int32_t k_tiles = (args.red + kBK - 1) / kBK;
  const int32_t kt_begin = blockIdx.y * args.k_tiles_per_split;
  const int32_t kt_end = min(k_tiles, kt_begin + args.k_tiles_per_split);

  TileLoader<OpA, Cfg::kBM, Cfg::kThreads> load_a;
  TileLoader<OpB, Cfg::kBN, Cfg::kThreads> load_b;
  load_a.init(a, m0, tid);
  load_b.init(b, n0, tid);
  auto stage_a = [&](int s) { return smem + s * (kTileA + kTileB); };
  auto stage_b = [&](int s) { return smem + s * (kTileA + kTileB) + kTileA; };

#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (kt_begin + s < kt_end) {
      load_a.load(a, stage_a(s), (kt_begin + s) * kBK);
      load_b.load(b, stage_b(s), (kt_begin + s) * kBK);
    }
    cp_async_commit();  // empty groups keep the count uniform
  }

  // The tensor cores' FP32 accumulation does not round to nearest, so its error grows with
  // the reduction's length. FP32 mode therefore sums each stage's products in `part` and adds
  // them to `acc` with ordinary (rounded) adds: the error then grows like a plain FP32 sum.
  float acc[Cfg::kMI][Cfg::kNI][4];
  float part[Cfg::kMI][Cfg::kNI][4];
#pragma unroll
  for (int i = 0; i < Cfg::kMI; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kNI; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = part[i][j][r] = 0.f;
  float(&mma_acc)[Cfg::kMI][Cfg::kNI][4] = kSplitTf32 ? part : acc;

  for (int32_t kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();  // the stage is complete for every thread, and the one refilled below is free
    const int32_t next = kt + Cfg::kStages - 1;
    if (next < kt_end) {
      const int s = (next - kt_begin) % Cfg::kStages;
      load_a.load(a, stage_a(s), next * kBK);
      load_b.load(b, stage_b(s), next * kBK);
    }
    cp_async_commit();

    const int s = (kt - kt_begin) % Cfg::kStages;
    const float* sa = stage_a(s);
    const float* sb = stage_b(s);
#pragma unroll
    for (int ks = 0; ks < kBK; ks += 8) {
      uint32_t af[Cfg::kMI][4], bf[Cfg::kNI][2];
      uint32_t af_small[Cfg::kMI][4], bf_small[Cfg::kNI][2];
#pragma unroll
      for (int i = 0; i < Cfg::kMI; ++i) {
        const int r = warp_m0 + i * 16 + g;
        const float v[4] = {sa[tile_index<Cfg::kBM, kAK>(r, ks + t)], sa[tile_index<Cfg::kBM, kAK>(r + 8, ks + t)],
                            sa[tile_index<Cfg::kBM, kAK>(r, ks + t + 4)],
                            sa[tile_index<Cfg::kBM, kAK>(r + 8, ks + t + 4)]};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if constexpr (kSplitTf32) split_tf32(v[q], af[i][q], af_small[i][q]);
          else af[i][q] = tf32_operand(v[q]);
        }
      }
#pragma unroll
      for (int j = 0; j < Cfg::kNI; ++j) {
        const int c = warp_n0 + j * 8 + g;
        const float v[2] = {sb[tile_index<Cfg::kBN, kBKc>(c, ks + t)], sb[tile_index<Cfg::kBN, kBKc>(c, ks + t + 4)]};
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if constexpr (kSplitTf32) split_tf32(v[q], bf[j][q], bf_small[j][q]);
          else bf[j][q] = tf32_operand(v[q]);
        }
      }
#pragma unroll
      for (int i = 0; i < Cfg::kMI; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::kNI; ++j) {
          if constexpr (kSplitTf32) {
            mma_tf32(mma_acc[i][j], af_small[i], bf[j][0], bf[j][1]);
            mma_tf32(mma_acc[i][j], af[i], bf_small[j][0], bf_small[j][1]);
          }
          mma_tf32(mma_acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
    if constexpr (kSplitTf32) {
#pragma unroll
      for (int i = 0; i < Cfg::kMI; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::kNI; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            acc[i][j][r] += part[i][j][r];
            part[i][j][r] = 0.f;
          }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every copy landed and every fragment read: the stages are free

  // Accumulator r of mma tile (i, j) holds C[row + 8 (r / 2)][col + r % 2].
  constexpr int kStride = Cfg::kBN + 1;
  static_assert(staged_tile_floats<Cfg::kBM, Cfg::kBN>() <= Cfg::kStages * (kTileA + kTileB), "staged tile must fit");
#pragma unroll
  for (int i = 0; i < Cfg::kMI; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kNI; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        smem[(warp_m0 + i * 16 + g + 8 * (r / 2)) * kStride + warp_n0 + j * 8 + 2 * t + r % 2] = acc[i][j][r];
  __syncthreads();
  store_staged_tile<Cfg::kBM, Cfg::kBN, Cfg::kThreads>(smem, tid, m0, n0, args);
}

template <class Cfg, class OpA, class OpB>
constexpr int smem_bytes() {
  return Cfg::kStages * (tile_floats<Cfg::kBM, OpA::kContiguousK>() + tile_floats<Cfg::kBN, OpB::kContiguousK>()) *
         int(sizeof(float));
}

}  // namespace tg::cuda::engine
