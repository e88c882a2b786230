// Experiment (not built by CMake): does a 2-CTA cluster that multicasts the shared operand
// stream a GEMM's k-tiles faster than CTAs that each load both operands? If the L2 or the
// issuing TMA unit limits the engine's loads, multicast halves the B rows each CTA asks for.
//
// Each block streams 64 k-tiles of an A box (128 rows x 32 floats, its own row tile) and a B
// box (kBN rows x 32 floats, the same for every block) through a 4-stage ring, consumers only
// wait and release. Cluster 2: each CTA loads its A box and half of B, multicast to both CTAs;
// a stage is reused once both CTAs' consumers released it (remote arrivals with release
// semantics at cluster scope, or at the instruction's default CTA scope). A checksum of every
// B byte each block saw must match between the modes. Then timings with 66, 132 and 264
// blocks.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <algorithm>
#include <cstdio>
#include <type_traits>
#include <vector>

#include <cuda.h>

#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/arch/tma.cuh"
#include "probe_common.h"

using namespace tg::cuda;

namespace probe {

// Cluster and multicast wrappers (PTX ISA: cp.async.bulk.tensor .multicast::cluster,
// barrier.cluster, mapa, mbarrier.arrive .shared::cluster).
namespace tma_cluster {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PROBE_SM90A(...) __VA_ARGS__
#else
#define PROBE_SM90A(...)
#endif
// The same box delivered to every CTA of the cluster in cta_mask (bit r: rank r), at dst's
// offset in each CTA's shared memory, counted on the barrier at bar's offset in each of them.
__device__ __forceinline__ void load_box_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                   uint16_t cta_mask) {
  PROBE_SM90A(asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_address(bar)), "h"(cta_mask)
      : "memory"));
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
  PROBE_SM90A(asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)));
  return r;
}
// Every thread of every CTA of the cluster arrives (releasing its writes), then waits for all.
__device__ __forceinline__ void cluster_arrive() {
  PROBE_SM90A(asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"));
}
__device__ __forceinline__ void cluster_wait() {
  PROBE_SM90A(asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"));
}
// One arrival on the barrier at bar's offset in CTA `rank` of the cluster. kClusterScope: with
// release semantics at cluster scope; else the instruction's default (release at CTA scope),
// as CUTLASS's cluster barriers use it.
template <bool kClusterScope>
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  [[maybe_unused]] uint32_t remote = 0;
  PROBE_SM90A(asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(bar)), "r"(rank)));
  if (kClusterScope)
    PROBE_SM90A(asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory"));
  else
    PROBE_SM90A(asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory"));
}
}  // namespace tma_cluster

constexpr int kK = 2048, kKTiles = kK / 32, kARows = 1024, kBRows = 256, kStages = 4;
constexpr int kABytes = 128 * 32 * 4;

template <int kBN, int kCluster, bool kClusterScope = true>
__global__ void __launch_bounds__(160) stream_kernel(const __grid_constant__ CUtensorMap a_map,
                                                     const __grid_constant__ CUtensorMap b_map,
                                                     unsigned* checksums) {
  constexpr int kBBytes = kBN * 32 * 4, kStageBytes = kABytes + kBBytes;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t rank = kCluster == 2 ? tma_cluster::cluster_rank() : 0;
  if (threadIdx.x == 0) tma::init_stage_ring(full, empty, kStages, 1, 4 * kCluster);
  if (kCluster == 2) {
    tma_cluster::cluster_arrive();
    tma_cluster::cluster_wait();
  } else {
    __syncthreads();
  }
  const int a_row = (blockIdx.x % (kARows / 128)) * 128;
  if (warp == 4) {
    if (lane == 0) {
      for (int i = 0; i < kKTiles; ++i) {
        const int s = i % kStages;
        if (i >= kStages) tma::mbar_wait(&empty[s], ((i / kStages) - 1) & 1);
        tma::mbar_arrive_expect_tx(&full[s], kStageBytes);
        unsigned char* dst = smem + s * kStageBytes;
        tma::load_box(dst, &a_map, &full[s], i * 32, a_row);
        if (kCluster == 1) {
          tma::load_box(dst + kABytes, &b_map, &full[s], i * 32, 0);
        } else {
          tma_cluster::load_box_multicast(dst + kABytes + rank * (kBBytes / 2), &b_map, &full[s], i * 32, int(rank) * (kBN / 2),
                                  0x3);
        }
      }
    }
  } else {
    unsigned sum = 0;
    for (int i = 0; i < kKTiles; ++i) {
      const int s = i % kStages;
      tma::mbar_wait(&full[s], (i / kStages) & 1);
      if (checksums) {
        const unsigned* b = reinterpret_cast<const unsigned*>(smem + s * kStageBytes + kABytes);
        for (int e = threadIdx.x; e < kBBytes / 4; e += 128) sum += b[e] * unsigned(e + 1);
        asm volatile("bar.sync 1, 128;" ::: "memory");
      }
      if (lane == 0) {
        if (kCluster == 1) {
          tma::mbar_arrive(&empty[s]);
        } else {
          tma_cluster::mbar_arrive_cluster<kClusterScope>(&empty[s], 0);
          tma_cluster::mbar_arrive_cluster<kClusterScope>(&empty[s], 1);
        }
      }
    }
    if (checksums) atomicAdd(&checksums[blockIdx.x], sum);
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if (kCluster == 2) {
    tma_cluster::cluster_arrive();
    tma_cluster::cluster_wait();
  }
}

template <int kBN, int kCluster, bool kClusterScope = true>
float run(const CUtensorMap& a, const CUtensorMap& b, int blocks, unsigned* checksums) {
  constexpr int smem = kStages * (kABytes + kBN * 128) + 2 * kStages * 8 + 1024;
  auto kernel = stream_kernel<kBN, kCluster, kClusterScope>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(160);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = kCluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return probe_common::median_ms(checksums ? 1 : 11, [&] { cudaLaunchKernelEx(&cfg, kernel, a, b, checksums); });
}

}  // namespace probe

int main() {
  using namespace probe;
  std::vector<float> host(size_t(kARows) * kK);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float((i * 2654435761u) % 1000003) * 1e-3f;
  float *a, *b;
  cudaMalloc(&a, host.size() * 4);
  cudaMalloc(&b, size_t(kBRows) * kK * 4);
  cudaMemcpy(a, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(b, host.data() + 12345, size_t(kBRows) * kK * 4, cudaMemcpyHostToDevice);
  unsigned* sums;
  cudaMalloc(&sums, 3 * 264 * sizeof(unsigned));
  const CUtensorMap a_map = f32_matrix_map("probe A", a, kARows, kK, {128, 32, true});
  const CUtensorMap b_full = f32_matrix_map("probe B", b, kBRows, kK, {128, 32, true});
  const CUtensorMap b_half = f32_matrix_map("probe B", b, kBRows, kK, {64, 32, true});
  const CUtensorMap b_full256 = f32_matrix_map("probe B", b, kBRows, kK, {256, 32, true});
  // Without a cluster a block loads the whole B box; with one, each CTA half of it.
  struct Pair {
    CUtensorMap full, half;
  };
  const Pair p128{b_full, b_half};
  const Pair p256{b_full256, b_full};
  auto both = [&](auto bn, const Pair& p) {
    constexpr int kBN = decltype(bn)::value;
    const int n = 132;
    cudaMemset(sums, 0, 3 * n * sizeof(unsigned));
    run<kBN, 1>(a_map, p.full, n, sums);
    run<kBN, 2>(a_map, p.half, n, sums + n);
    run<kBN, 2, false>(a_map, p.half, n, sums + 2 * n);
    std::vector<unsigned> h(3 * n);
    cudaMemcpy(h.data(), sums, h.size() * sizeof(unsigned), cudaMemcpyDeviceToHost);
    int differ = 0;
    for (int i = 0; i < n; ++i) differ += (h[i] != h[n + i]) + (h[i] != h[2 * n + i]);
    std::printf("B %d rows: checksums differ in %d of %d blocks (%s)\n", kBN, differ, n,
                cudaGetErrorString(cudaGetLastError()));
    for (int blocks : {66, 132, 264}) {
      const float t1 = run<kBN, 1>(a_map, p.full, blocks, nullptr), t2 = run<kBN, 2>(a_map, p.half, blocks, nullptr);
      const float t3 = run<kBN, 2, false>(a_map, p.half, blocks, nullptr);
      std::printf("  %3d blocks: no cluster %7.1f us (%5.3f us per k-tile), cluster 2 multicast %7.1f us (%5.3f) -> %.2fx;"
                  " releases at CTA scope %7.1f us (%5.3f) -> %.2fx\n",
                  blocks, t1 * 1e3, t1 * 1e3 / kKTiles, t2 * 1e3, t2 * 1e3 / kKTiles, t1 / t2, t3 * 1e3,
                  t3 * 1e3 / kKTiles, t1 / t3);
    }
  };
  both(std::integral_constant<int, 128>{}, p128);
  both(std::integral_constant<int, 256>{}, p256);
  std::printf("probe done: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
