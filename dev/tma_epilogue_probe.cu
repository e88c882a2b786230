// Experiment (not built by CMake): what does the engine TMA kernel's epilogue cost, and what
// would a cheaper or overlapped one save? Launches queued back to back, the engine kernel took
// 0.59 us per 128 x 128 x 32 k-tile on the 3x3 NHWC 192-channel convolution where its pipeline
// alone took 0.41 (wgmma_pipeline_probe): ~10 us per 54-k-tile tile.
//
// A copy of the kernel (tma_mainloop_sm90.cuh: one TMA producer warp, two wgmma warpgroups,
// 128 x 128 tiles) on that convolution's boxes, with four stages and a shared-memory buffer of
// its own for the epilogue, and four epilogues:
//   none     the accumulators summed into a sink (no output);
//   staged   the engine's own (store_tile_staged: rows of 129 floats, then one scalar store per
//            element through the OutputMap);
//   float4   rows of 132 floats, then one 16-byte store per 4 columns;
//   TMA      rows of 128 floats, then one TMA store of the 128 x 128 box, issued by one thread
//            and waited for only before the buffer is next written (or at exit).
// Each runs one tile per block (grid = tiles) and persistent (grid = one block per SM, each
// looping over tiles; its producer runs on into the next tile while the consumers store).
// The outputs of every storing variant are checked against the staged, one-tile-per-block
// one (the same bits). us per k-tile per wave of 132 blocks, 128 and 256 tiles.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <cuda.h>

#include "ops/cuda/arch/named_barrier.cuh"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/arch/tma.cuh"
#include "ops/cuda/arch/wgmma.cuh"
#include "ops/cuda/gemm/tma_mainloop_sm90.cuh"
#include "probe_common.h"

using namespace tg::cuda;
using namespace tg::cuda::engine;

namespace probe {

constexpr int kMaxImages = 32, kHW = 32, kC = 192, kKTiles = 9 * kC / 32;
constexpr int kBN = 128, kStages = 4;
constexpr int kStageBytes = kTmaABytes + kBN * kBK * 4;
constexpr int kEpilogueStride = kBN + 4;                         // the widest staging rows
constexpr int kEpilogueBytes = kTmaBM * kEpilogueStride * 4;     // 67.5 KB
constexpr int kSmemBytes = kStages * kStageBytes + kEpilogueBytes + 2 * kStages * 8 + 1024;
enum Epilogue { kNone, kStaged, kFloat4, kTmaStore, kEpilogues };
const char* const kNames[kEpilogues] = {"none", "staged", "float4", "TMA"};

struct Boxes {
  CUtensorMap x, w, y;
};

template <int kMode>
__global__ void __launch_bounds__(kTmaThreads, 1)
    epilogue_kernel(const __grid_constant__ Boxes boxes, const MainloopArgs args, int tiles, float* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  float* ebuf = reinterpret_cast<float*>(smem + kStages * kStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes + kEpilogueBytes);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) tma::init_stage_ring(full, empty, kStages, 1, kTmaConsumerThreads / 32);
  __syncthreads();
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  if (warp == kTmaConsumerThreads / 32) {
    if (lane == 0) {
      int i = 0;  // k-tiles issued by this block, over all its tiles
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        probe_common::Conv3x3Walk walk(tile * kTmaBM, kHW);
        for (int kt = 0; kt < kKTiles; ++kt, ++i) {
          const int s = i % kStages;
          if (i >= kStages) tma::mbar_wait(&empty[s], ((i / kStages) - 1) & 1);
          tma::mbar_arrive_expect_tx(&full[s], kStageBytes);
          unsigned char* dst = smem + s * kStageBytes;
          walk.load(dst, &boxes.x, &full[s]);
          tma::load_box(dst + kTmaABytes, &boxes.w, &full[s], kt * kBK, 0);
          walk.advance(kC);
        }
      }
    }
    return;
  }
  const int tid = threadIdx.x, warpgroup = warp / 4;
  // acc[4 j + 2 h + e] holds C[row0 + g + 8 h][8 j + 2 t + e] (epilogue_sm90.cuh).
  const int row0 = (tid / 32) * 16, g = lane / 4, t = lane % 4;
  const uint32_t stages = shared_address(smem), a_rows = uint32_t(warpgroup) * 64 * kBK * 4;
  int i = 0;  // k-tiles consumed
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int m0 = tile * kTmaBM;
    float acc[kBN / 2];
#pragma unroll
    for (int q = 0; q < kBN / 2; ++q) acc[q] = 0.f;
    for (int kt = 0; kt < kKTiles; ++kt, ++i) {
      const int s = i % kStages;
      tma::mbar_wait(&full[s], uint32_t(i / kStages) & 1);
      wgmma::fence();
      const uint32_t a_addr = stages + s * kStageBytes + a_rows, b_addr = stages + s * kStageBytes + kTmaABytes;
#pragma unroll
      for (int ks = 0; ks < kBK / 8; ++ks)
        wgmma::mma_ss_tf32<kBN>(acc, wgmma::sw128_kmajor_desc(a_addr + ks * 32),
                                wgmma::sw128_kmajor_desc(b_addr + ks * 32), true);
      wgmma::commit();
      wgmma::wait<1>();
      if (kt > 0 && lane == 0) tma::mbar_arrive(&empty[(i - 1) % kStages]);
    }
    wgmma::wait<0>();
    if (lane == 0) tma::mbar_arrive(&empty[(i - 1) % kStages]);  // the tile's last stage
#pragma unroll
    for (int q = 0; q < kBN / 2; ++q) wgmma::fence_operand(acc[q]);

    if constexpr (kMode == kNone) {
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < kBN / 2; ++q) sum += acc[q];
      if (sum == 12345.f) sink[blockIdx.x] = sum;  // keeps the products
    } else if constexpr (kMode == kStaged) {
      store_tile_staged<kBN>(acc, ebuf, tid, m0, 0, args);  // begins with a barrier: the buffer is free
    } else if constexpr (kMode == kFloat4) {
      named_barrier_sync(1, 256);  // every thread has stored the previous tile from the buffer
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float2*>(&ebuf[(row0 + g + 8 * h) * kEpilogueStride + 8 * j + 2 * t]) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      named_barrier_sync(1, 256);
      const int rows = min(kTmaBM, args.M - m0);
      for (int e = tid; e < kTmaBM * kBN / 4; e += 256) {
        const int m = e / (kBN / 4), n = (e % (kBN / 4)) * 4;
        if (m < rows)
          *reinterpret_cast<float4*>(&args.out.data[int64_t(m0 + m) * args.N + n]) =
              *reinterpret_cast<const float4*>(&ebuf[m * kEpilogueStride + n]);
      }
    } else {
      if (tid == 0) tma::bulk_wait_read<0>();  // the previous tile's store has read the buffer
      named_barrier_sync(1, 256);
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float2*>(&ebuf[(row0 + g + 8 * h) * kBN + 8 * j + 2 * t]) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      wgmma::fence_proxy_async();  // the plain stores, for the TMA unit
      named_barrier_sync(1, 256);
      if (tid == 0) {
        tma::store_box(&boxes.y, ebuf, 0, m0);
        tma::bulk_commit();
      }
    }
  }
  if constexpr (kMode == kTmaStore)
    if (tid == 0) tma::bulk_wait();
#else
  __trap();
#endif
}

template <int kMode>
void launch(const Boxes& boxes, const MainloopArgs& args, int tiles, int grid, float* sink) {
  auto kernel = epilogue_kernel<kMode>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  kernel<<<grid, kTmaThreads, kSmemBytes>>>(boxes, args, tiles, sink);
}

// us per k-tile per wave of 132 blocks.
template <int kMode>
double us_per_ktile(const Boxes& boxes, const MainloopArgs& args, int tiles, int grid, float* sink) {
  const float ms = probe_common::median_ms(11, [&] { launch<kMode>(boxes, args, tiles, grid, sink); }, 8);
  return ms * 1e3 / (kKTiles * std::ceil(tiles / 132.0));
}

template <int kMode>
std::vector<float> output_of(const Boxes& boxes, const MainloopArgs& args, int tiles, int grid, float* sink) {
  const size_t n = size_t(tiles) * kTmaBM * kBN;
  cudaMemset(args.out.data, 0xff, n * 4);  // poisoned: every element must be written
  launch<kMode>(boxes, args, tiles, grid, sink);
  std::vector<float> host(n);
  cudaMemcpy(host.data(), args.out.data, n * 4, cudaMemcpyDeviceToHost);
  return host;
}

template <int kMode>
size_t differing(const Boxes& boxes, const MainloopArgs& args, int tiles, int grid, float* sink,
                 const std::vector<float>& reference) {
  const std::vector<float> got = output_of<kMode>(boxes, args, tiles, grid, sink);
  size_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) n += got[i] != reference[i];
  return n;
}

}  // namespace probe

int main() {
  using namespace probe;
  const size_t xn = size_t(kMaxImages) * kHW * kHW * kC, wn = size_t(kBN) * 9 * kC;
  const int max_tiles = kMaxImages * kHW * kHW / kTmaBM;
  std::vector<float> xh(xn);
  for (size_t i = 0; i < xn; ++i) xh[i] = float((i * 2654435761u) % 1000003) * 1e-6f;
  float *x, *w, *y, *sink;
  cudaMalloc(&x, xn * 4);
  cudaMalloc(&w, wn * 4);
  cudaMalloc(&y, size_t(max_tiles) * kTmaBM * kBN * 4);
  cudaMalloc(&sink, 1024 * 4);
  cudaMemcpy(x, xh.data(), xn * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(w, xh.data() + 99, wn * 4, cudaMemcpyHostToDevice);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  Boxes boxes;
  boxes.x = f32_im2col_map("probe x", x, probe_common::conv3x3_geometry(kMaxImages, kHW, kHW, kC), 32, 128);
  boxes.w = f32_matrix_map("probe w", w, kBN, 9 * kC, {kBN, 32, true});
  for (int images : {16, 32}) {
    const int tiles = images * kHW * kHW / kTmaBM;
    boxes.y = f32_matrix_map("probe y", y, int64_t(tiles) * kTmaBM, kBN, {kTmaBM, kBN, false});
    const MainloopArgs args = probe_common::plain_args(tiles * kTmaBM, kBN, kKTiles, 1, y);
    const int persistent = std::min(tiles, sms);
    const std::vector<float> reference = output_of<kStaged>(boxes, args, tiles, tiles, sink);
    std::printf("%d images (%d tiles), outputs differing from the staged one-tile-per-block run: staged persistent "
                "%zu, float4 %zu / %zu, TMA %zu / %zu (one tile per block / persistent) (%s)\n",
                images, tiles, differing<kStaged>(boxes, args, tiles, persistent, sink, reference),
                differing<kFloat4>(boxes, args, tiles, tiles, sink, reference),
                differing<kFloat4>(boxes, args, tiles, persistent, sink, reference),
                differing<kTmaStore>(boxes, args, tiles, tiles, sink, reference),
                differing<kTmaStore>(boxes, args, tiles, persistent, sink, reference),
                cudaGetErrorString(cudaGetLastError()));
    const double one[kEpilogues] = {us_per_ktile<kNone>(boxes, args, tiles, tiles, sink),
                                    us_per_ktile<kStaged>(boxes, args, tiles, tiles, sink),
                                    us_per_ktile<kFloat4>(boxes, args, tiles, tiles, sink),
                                    us_per_ktile<kTmaStore>(boxes, args, tiles, tiles, sink)};
    const double per[kEpilogues] = {us_per_ktile<kNone>(boxes, args, tiles, persistent, sink),
                                    us_per_ktile<kStaged>(boxes, args, tiles, persistent, sink),
                                    us_per_ktile<kFloat4>(boxes, args, tiles, persistent, sink),
                                    us_per_ktile<kTmaStore>(boxes, args, tiles, persistent, sink)};
    std::printf("%d tiles, us per k-tile per wave by epilogue, one tile per block / persistent:", tiles);
    for (int m = 0; m < kEpilogues; ++m) std::printf(" %s %6.3f / %6.3f;", kNames[m], one[m], per[m]);
    std::printf(" (%s)\n", cudaGetErrorString(cudaGetLastError()));
  }
  std::printf("probe done: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
