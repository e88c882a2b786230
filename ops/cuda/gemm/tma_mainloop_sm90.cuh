// The engine's TMA-fed Hopper kernel, C[M][N] = sum_k A[m][k] B[n][k] at TF32 or FP32 (split
// TF32: consume_split), shared by the
// products whose operands the TMA unit can fetch as whole boxes: plain k-contiguous matrices
// (matmul_sm90_tma.cu) and channels-last convolution inputs in im2col mode
// (conv_fprop_sm90_tma.cu). A `Producer` says where each k-tile's two boxes come from:
//   void prefetch() const;                                   // warm the tensor maps
//   Cursor start(k_tile, m0) const;                          // the block's first k-tile
//                                                            // (or start(k_tile, m0, n0))
//   void load(a_dst, b_dst, bar, cursor, k_tile, n0) const;  // ask for both boxes
//   void advance(Cursor&) const;                             // on to the next k-tile
// The one producer thread issues every request of the block, so whatever it computes per
// k-tile is on the pipeline's critical path: the cursor carries the coordinates from one k-tile
// to the next with additions, where decoding each k-tile afresh would take several divisions.
// Each box is 128 rows (A) or kBN rows (B) of 32 k in the 128-byte swizzle: chunk c of row r at
// c ^ (r % 8), exactly the K-major layout the wgmma descriptors of wgmma.cuh describe; or, for a
// producer with kChannelQuads (few-channel convolutions), A is eight 128 x 4 boxes without
// swizzle (a_desc below).
//
// Warp roles (288 threads): warp 8 is the producer; its lane 0 asks for each stage's boxes and
// announces their bytes on the stage's `full` barrier. Warpgroups 0 and 1 each own 64 rows of
// the 128 x kBN tile: per stage they wait on `full`, run four m64nNk8 wgmmas, keep one wgmma
// group in flight (wait<1>), and, once the previous stage's group has retired, release that
// stage (one arrival per consumer warp on `empty`); FP32 mode splits each landed stage into
// heads and remainders and runs three products per step (consume_split). Boxes reaching past the operands arrive as
// zeros, so ragged edges need no code. The tile leaves through shared memory: as TMA stores
// where the output is a plain, partial-sum or channels-first map (tma_epilogue_sm90.cuh), else
// through MainloopArgs::store (epilogue_sm90.cuh: permuted maps, misaligned rows). Design note:
// docs/kernels/gemm_tma.md.
#pragma once
#include "../../../core/cuda_context.h"
#include "../arch/cp_async.cuh"
#include "../arch/tma.cuh"
#include "../arch/wgmma.cuh"
#include "../arch/wgmma_bf16.cuh"
#include "../arch/tensor_map.h"
#include "../arch/tf32.cuh"
#include "epilogue_sm90.cuh"
#include "kernels.h"
#include "tma_epilogue_sm90.cuh"

namespace tg::cuda::engine {

constexpr int kTmaBM = 128;
constexpr int kTmaConsumerThreads = 256, kTmaThreads = kTmaConsumerThreads + 32;
constexpr int kTmaABytes = kTmaBM * kBK * 4;  // A's share of a stage: 16 KB

// Tile 128 x kBN (64, 128 or 256 columns): the wider tile reads fewer bytes per product (the
// limit on large problems is the L2 -> shared traffic), the narrower wastes less on narrow
// outputs and makes more blocks. kBlocksPerSm 1: as many stages as fit in about 192 KB; 2:
// half the stages, so that two blocks share an SM and one's pipeline fill and epilogue hide
// behind the other's products (64-wide tiles always run two per SM; 256-wide ones never fit).
// kSplit (FP32 mode): 64 or 128 wide, one block per SM, 4 stages plus two "low" stages.
template <int kBN, int kBlocksPerSmArg = 1, bool kSplit = false>
struct TmaTile {
  static_assert(kBN == 64 || kBN == 128 || kBN == 256, "TMA tile width");
  static_assert(!kSplit || ((kBN == 64 || kBN == 128) && kBlocksPerSmArg == 1),
                "FP32 mode: 64- or 128-wide tiles, one block per SM");
  static constexpr int kBlocksPerSm = kSplit ? 1 : kBN == 64 ? 2 : kBlocksPerSmArg;
  static_assert(kBlocksPerSm == 1 || (kBlocksPerSm == 2 && kBN <= 128), "two 256-wide blocks do not fit an SM");
  static constexpr int kBBytes = kBN * kBK * 4;
  static constexpr int kStageBytes = kTmaABytes + kBBytes;  // A then B
  static constexpr int kStages = kSplit ? 4 : kBlocksPerSm == 2 ? (kBN == 64 ? 4 : 3) : (kBN == 128 ? 6 : 4);
  static constexpr int kLowStages = kSplit ? 2 : 0;  // the remainders' ring, after the stages
  // + barriers, alignment
  static constexpr int kSmemBytes = (kStages + kLowStages) * kStageBytes + 2 * kStages * 8 + 1024;
};

// FP32 mode, by the 256 consumer threads once a stage has landed: every element becomes its
// TF32 head in place, and the TF32 rounding of its remainder goes to the same offset of `low`
// (the layout is per element, so the swizzle carries over). 16-byte chunks, consecutive
// threads on consecutive chunks: no bank conflicts.
template <int kStageBytes>
__device__ __forceinline__ void split_stage(unsigned char* stage, unsigned char* low, int tid) {
  static_assert(kStageBytes % (16 * kTmaConsumerThreads) == 0, "whole chunks per thread");
#pragma unroll
  for (int c = tid; c < kStageBytes / 16; c += kTmaConsumerThreads) {
    float4 v = reinterpret_cast<const float4*>(stage)[c], lo;
    float* vs = reinterpret_cast<float*>(&v);
    float* ls = reinterpret_cast<float*>(&lo);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float head = __uint_as_float(tf32_bits(vs[e]));
      ls[e] = __uint_as_float(tf32_bits(vs[e] - head));
      vs[e] = head;
    }
    reinterpret_cast<float4*>(stage)[c] = v;
    reinterpret_cast<float4*>(low)[c] = lo;
  }
}

// A stage's A operand as the wgmma descriptors see it. Most producers land one 128 x 32 box in
// the 128-byte swizzle: a warpgroup's 64 rows start 8 KB in, k8 step ks 32 bytes along the row.
// Producers with kChannelQuads (Im2colQuadBoxes) land eight 128 x 4 boxes one after another:
// a warpgroup's rows start 1 KB in, k8 step ks is boxes 2 ks and 2 ks + 1 (LBO: one box, 2 KB;
// SBO: 8 rows of 16 bytes).
template <class Producer>
constexpr bool kChannelQuadA = requires { Producer::kChannelQuads; };
// Producers with kBf16 true land bf16 boxes: the same 128-byte rows hold 64 k, not 32, and each of
// the four steps per stage is one k16 BF16 product instead of a k8 TF32 one.
template <class Producer>
constexpr bool bf16_operands() {
  if constexpr (requires { Producer::kBf16; }) return Producer::kBf16;
  else return false;
}
template <class Producer>
constexpr bool kBf16Operands = bf16_operands<Producer>();
template <bool kBf16>
constexpr int kTileK = kBf16 ? 2 * kBK : kBK;  // k per stage
template <bool kQuads>
__device__ __forceinline__ uint32_t a_rows_offset(int warpgroup) {
  return kQuads ? uint32_t(warpgroup) * 64 * 16 : uint32_t(warpgroup) * 64 * kBK * 4;
}
template <bool kQuads>
__device__ __forceinline__ uint64_t a_desc(uint32_t addr, int ks) {
  constexpr uint32_t kQuadBoxBytes = kTmaBM * 4 * 4;
  if constexpr (kQuads) return wgmma::kmajor_desc(addr + ks * 2 * kQuadBoxBytes, kQuadBoxBytes, 128);
  else return wgmma::sw128_kmajor_desc(addr + ks * 32);
}

// TF32 mode's consumer loop: per stage, wait for its boxes, run four m64nNk8 wgmmas (m64nNk16
// for bf16 operands), keep one wgmma group in flight (wait<1>), and release the previous stage
// once its group retired.
template <int kBN, int kStages, int kStageBytes, bool kQuads, bool kBf16>
__device__ __forceinline__ void consume_tf32(float (&acc)[kBN / 2], unsigned char* smem, uint64_t* full,
                                             uint64_t* empty, int32_t count, uint32_t a_rows, int lane) {
  const uint32_t stages = shared_address(smem);
  for (int32_t i = 0; i < count; ++i) {
    const int s = i % kStages;
    tma::mbar_wait(&full[s], uint32_t(i / kStages) & 1);
    wgmma::fence();
    const uint32_t a_addr = stages + s * kStageBytes + a_rows, b_addr = stages + s * kStageBytes + kTmaABytes;
#pragma unroll
    for (int ks = 0; ks < kBK / 8; ++ks) {
      if constexpr (kBf16)
        wgmma::mma_ss_bf16<kBN>(acc, a_desc<kQuads>(a_addr, ks), wgmma::sw128_kmajor_desc(b_addr + ks * 32), true);
      else
        wgmma::mma_ss_tf32<kBN>(acc, a_desc<kQuads>(a_addr, ks), wgmma::sw128_kmajor_desc(b_addr + ks * 32), true);
    }
    wgmma::commit();
    wgmma::wait<1>();  // the previous stage's products retired: release its slot
    if (i > 0 && lane == 0) tma::mbar_arrive(&empty[(i - 1) % kStages]);
  }
}

// FP32 mode's consumer loop (split TF32, as mainloop_sm90.cuh): three products per k8 step,
// remainder x head, head x remainder, head x head, into `part`, which is added to the running
// sum with rounded FP32 adds once the stage's products have retired (the tensor cores'
// accumulation does not round to nearest). The split of stage i + 1 runs on the CUDA cores
// while the tensor cores work on stage i; a named barrier over the 256 consumer threads per
// stage makes every split visible before any warpgroup's products read it. Low stage i % 2
// is rewritten at i + 2, after both warpgroups passed stage i + 1's barrier, which each
// crossed only after its stage-i products retired.
template <int kBN, int kStages, int kStageBytes, bool kQuads>
__device__ __forceinline__ void consume_split(float (&acc)[kBN / 2], unsigned char* smem, uint64_t* full,
                                              uint64_t* empty, int32_t count, uint32_t a_rows, int lane) {
  const int tid = threadIdx.x;
  const uint32_t stages = shared_address(smem);
  auto stage = [&](int32_t i) { return smem + (i % kStages) * kStageBytes; };
  auto low = [&](int32_t i) { return smem + (kStages + i % 2) * kStageBytes; };
  float part[kBN / 2];
#pragma unroll
  for (int q = 0; q < kBN / 2; ++q) part[q] = 0.f;  // never read (the first product overwrites it)
  if (count > 0) {
    tma::mbar_wait(&full[0], 0);
    split_stage<kStageBytes>(stage(0), low(0), tid);
    wgmma::fence_proxy_async();
    named_barrier_sync(1, kTmaConsumerThreads);
  }
  for (int32_t i = 0; i < count; ++i) {
    const int s = i % kStages;
    wgmma::fence();
    const uint32_t a_addr = stages + s * kStageBytes + a_rows, b_addr = stages + s * kStageBytes + kTmaABytes;
    const uint32_t low_addr = stages + (kStages + i % 2) * kStageBytes;
    const uint32_t al_addr = low_addr + a_rows, bl_addr = low_addr + kTmaABytes;
#pragma unroll
    for (int ks = 0; ks < kBK / 8; ++ks) {
      const uint32_t k_bytes = ks * 32;
      const uint64_t da = a_desc<kQuads>(a_addr, ks), db = wgmma::sw128_kmajor_desc(b_addr + k_bytes);
      wgmma::mma_ss_tf32<kBN>(part, a_desc<kQuads>(al_addr, ks), db, ks > 0);
      wgmma::mma_ss_tf32<kBN>(part, da, wgmma::sw128_kmajor_desc(bl_addr + k_bytes), true);
      wgmma::mma_ss_tf32<kBN>(part, da, db, true);
    }
    wgmma::commit();
    if (i + 1 < count) {  // the next stage's split, while the tensor cores work
      tma::mbar_wait(&full[(i + 1) % kStages], uint32_t((i + 1) / kStages) & 1);
      split_stage<kStageBytes>(stage(i + 1), low(i + 1), tid);
      wgmma::fence_proxy_async();
    }
    wgmma::wait<0>();
#pragma unroll
    for (int q = 0; q < kBN / 2; ++q) {
      wgmma::fence_operand(part[q]);
      acc[q] += part[q];
    }
    if (lane == 0) tma::mbar_arrive(&empty[s]);  // this warp is done with stage i
    named_barrier_sync(1, kTmaConsumerThreads);  // stage i + 1's split is complete
  }
}

// The producer's cursor for the block's first k-tile: producers whose B boxes depend on the
// tile's columns take n0 too.
template <class Producer>
__device__ __forceinline__ auto start_cursor(const Producer& producer, int32_t k_tile, int32_t m0, int32_t n0) {
  if constexpr (requires { producer.start(k_tile, m0, n0); }) return producer.start(k_tile, m0, n0);
  else return producer.start(k_tile, m0);
}

template <int kBN, int kBlocksPerSm, class Producer, bool kSplit>
__global__ void __launch_bounds__(kTmaThreads, TmaTile<kBN, kBlocksPerSm, kSplit>::kBlocksPerSm)
    tma_wgmma_kernel(const __grid_constant__ Producer producer, const MainloopArgs args,
                     const __grid_constant__ TileStore store) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = TmaTile<kBN, kBlocksPerSm, kSplit>;
  constexpr int kStages = T::kStages, kStageBytes = T::kStageBytes;
  extern __shared__ unsigned char smem_raw[];
  // The swizzle pattern is anchored to 1024-byte boundaries of the shared window.
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + (kStages + T::kLowStages) * kStageBytes);
  uint64_t* empty = full + kStages;

  const int32_t tile_n = blockIdx.x % args.tiles_n, tile_m = blockIdx.x / args.tiles_n;
  const int32_t m0 = tile_m * kTmaBM, n0 = tile_n * kBN;
  constexpr bool kQuads = kChannelQuadA<Producer>, kBf16 = kBf16Operands<Producer>;
  static_assert(!(kBf16 && (kSplit || kQuads)), "bf16 operands: plain boxes, one product per step");
  const int32_t k_tiles = (args.red + kTileK<kBf16> - 1) / kTileK<kBf16>;
  const int32_t kt_begin = blockIdx.y * args.k_tiles_per_split;
  const int32_t kt_end = min(k_tiles, kt_begin + args.k_tiles_per_split);
  const int32_t count = kt_end - kt_begin;

  if (threadIdx.x == 0) tma::init_stage_ring(full, empty, kStages, 1, kTmaConsumerThreads / 32);
  __syncthreads();
  // From here on the roles part: no block-wide barrier below. A shuffle makes `warp` visibly
  // uniform, or ptxas treats the consumer path as divergent and serializes the wgmma.
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;

  if (warp == kTmaConsumerThreads / 32) {
    if (lane == 0) {
      producer.prefetch();
      auto cursor = start_cursor(producer, kt_begin, m0, n0);
      for (int32_t i = 0; i < count; ++i) {
        const int s = i % kStages;
        const uint32_t use = uint32_t(i / kStages);
        if (use > 0) tma::mbar_wait(&empty[s], (use - 1) & 1);  // every consumer warp released use - 1
        tma::mbar_arrive_expect_tx(&full[s], kStageBytes);
        unsigned char* dst = smem + s * kStageBytes;
        producer.load(dst, dst + kTmaABytes, &full[s], cursor, kt_begin + i, n0);
        producer.advance(cursor);
      }
    }
    return;
  }

  const int warpgroup = warp / 4;
  float acc[kBN / 2];
#pragma unroll
  for (int q = 0; q < kBN / 2; ++q) acc[q] = 0.f;
  const uint32_t a_rows = a_rows_offset<kQuads>(warpgroup);
  if constexpr (kSplit)
    consume_split<kBN, kStages, kStageBytes, kQuads>(acc, smem, full, empty, count, a_rows, lane);
  else
    consume_tf32<kBN, kStages, kStageBytes, kQuads, kBf16>(acc, smem, full, empty, count, a_rows, lane);
  wgmma::wait<0>();
#pragma unroll
  for (int q = 0; q < kBN / 2; ++q) wgmma::fence_operand(acc[q]);
  // Every load the producer issued has been waited for: the stages are free for the epilogue.
  static_assert(staged_tile_floats<128, kBN>() * 4 <= kStages * kStageBytes, "staged tile must fit the stages");
  static_assert(kBN / 32 * kStoreBoxBytes <= kStages * kStageBytes, "store boxes must fit the stages");
  if (store.kind == TileStore::kScalar)
    store_tile_staged<kBN>(acc, reinterpret_cast<float*>(smem), threadIdx.x, m0, n0, args);
  else
    store_tile_tma<kBN>(acc, smem, threadIdx.x, m0, n0, args, store);
#else
  __trap();  // launched only on devices that run sm_90a code
#endif
}

// How the launch's tiles leave (TileStore): TMA stores where plan.tma_store allows and the
// destination's rows (pixel runs, for channels-first outputs) are whole 16-byte units at a
// 16-byte-aligned address; else element-wise stores. bf16 outputs the same (plain and
// channels-first ones; split partial sums stay f32, rounded in the reduction).
inline TileStore tile_store_for(const Plan& plan, const MainloopArgs& args) {
  TileStore store{};
  store.kind = TileStore::kScalar;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  constexpr TmaBox kRowBox{.rows = 128, .cols = 32, .swizzle128 = true};    // kStoreBoxBytes
  constexpr TmaBox kPixelBox{.rows = 32, .cols = 32, .swizzle128 = true};   // kPixelBoxBytes
  if (!plan.tma_store) return store;
  if (args.partials) {
    if (args.N % 4 != 0 || !aligned(args.partials)) return store;
    store.map = f32_planes_map("engine partial sums", args.partials, plan.splits, args.M, args.N, kRowBox);
    store.kind = TileStore::kSplits;
  } else if (args.out.data_bf16) {
    constexpr TmaBox kBf16RowBox{.rows = 128, .cols = 64, .swizzle128 = true};    // kStoreBoxBytes
    constexpr TmaBox kBf16PixelBox{.rows = 32, .cols = 64, .swizzle128 = true};  // kPixelBoxBytes
    if (!aligned(args.out.data_bf16)) return store;
    if (args.out.mode == OutputMap::kPlain) {
      if (args.N % 8 != 0) return store;
      store.map = bf16_matrix_map("engine output, bf16", args.out.data_bf16, args.M, args.N, kBf16RowBox);
      store.kind = TileStore::kRowsBf16;
    } else if (args.out.mode == OutputMap::kChannelsFirst) {
      const int64_t pixels = args.out.div.divisor;
      if (pixels % 8 != 0 || args.M % pixels != 0) return store;
      store.map = bf16_planes_map("engine output, bf16", args.out.data_bf16, args.M / pixels, args.N, pixels,
                                  kBf16PixelBox);
      store.kind = TileStore::kChannelsFirstBf16;
    }
  } else if (args.out.mode == OutputMap::kPlain) {
    if (args.N % 4 != 0 || !aligned(args.out.data)) return store;
    store.map = f32_matrix_map("engine output", args.out.data, args.M, args.N, kRowBox);
    store.kind = TileStore::kRows;
  } else if (args.out.mode == OutputMap::kChannelsFirst) {
    const int64_t pixels = args.out.div.divisor;
    if (pixels % 4 != 0 || args.M % pixels != 0 || !aligned(args.out.data)) return store;
    store.map = f32_planes_map("engine output", args.out.data, args.M / pixels, args.N, pixels, kPixelBox);
    store.kind = TileStore::kChannelsFirst;
  }
  return store;
}

// One launch of the kernel over plan's tiles: plan.tma_cols wide (plan.tiles_n counts such
// tiles), plan.tma_blocks_per_sm blocks per SM.
template <int kBN, int kBlocksPerSm, class Producer, bool kSplit = false>
void launch_tma_config(const Producer& producer, const Plan& plan, const MainloopArgs& args, cudaStream_t stream) {
  using T = TmaTile<kBN, kBlocksPerSm, kSplit>;
  const auto kernel = tma_wgmma_kernel<kBN, kBlocksPerSm, Producer, kSplit>;
  allow_dynamic_smem(kernel, T::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(int64_t(plan.tiles_m) * plan.tiles_n), static_cast<unsigned>(plan.splits));
  kernel<<<grid, kTmaThreads, T::kSmemBytes, stream>>>(producer, args, tile_store_for(plan, args));
  TG_LAUNCH_CHECK();
}

template <class Producer>
void launch_tma_wgmma(const Producer& producer, const Plan& plan, const MainloopArgs& args, cudaStream_t stream) {
  if constexpr (kBf16Operands<Producer>) {
    TG_CHECK(!plan.tma_split, "engine TMA kernel: bf16 operands have no FP32 (split) mode");
  } else if (plan.tma_split) {
    TG_CHECK((plan.tma_cols == 128 || plan.tma_cols == 64) && plan.tma_blocks_per_sm == 1,
             "engine TMA kernel: FP32 mode runs 64- or 128-wide tiles, one block per SM; plan has ", plan.tma_cols,
             " columns, ", plan.tma_blocks_per_sm, " blocks per SM");
    if (plan.tma_cols == 64) return launch_tma_config<64, 1, Producer, true>(producer, plan, args, stream);
    return launch_tma_config<128, 1, Producer, true>(producer, plan, args, stream);
  }
  if (plan.tma_cols == 64) launch_tma_config<64, 2>(producer, plan, args, stream);
  else if (plan.tma_cols == 256) launch_tma_config<256, 1>(producer, plan, args, stream);
  else if (plan.tma_blocks_per_sm == 2) launch_tma_config<128, 2>(producer, plan, args, stream);
  else launch_tma_config<128, 1>(producer, plan, args, stream);
}

}  // namespace tg::cuda::engine
