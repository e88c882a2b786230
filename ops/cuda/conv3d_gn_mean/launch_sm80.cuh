// Host side shared by the tensor-core launchers of the fused Conv3d(3x3x3) -> GroupNorm -> mean
// (conv3d_gn_mean/stats_sm80.cu, conv3d_gn_mean/grad_sm80.cu): shared-memory sizes, the weight
// fragments, occupancy and persistent grids, and the dispatch over the instantiated shape
// classes. Design: docs/kernels/conv3d_gn_mean.md.
#pragma once
#include <algorithm>
#include <cstdint>

#include "../../../core/cuda_context.h"
#include "../../../core/tensor.h"
#include "../arch/hopper.h"
#include "tiles_sm80.cuh"
#include "../../fused.h"

namespace tg::cuda::conv3d_gn_mean_mma_detail {

// Grid of a one-thread-per-item kernel (no grid-stride loop, unlike grid_for's capped grids).
inline unsigned item_blocks(int64_t items, int threads) {
  const int64_t blocks = std::max<int64_t>(1, (items + threads - 1) / threads);
  TG_CHECK(blocks < (int64_t{1} << 31), "conv3d_gn_mean: ", items, " items exceed one grid");
  return static_cast<unsigned>(blocks);
}

// Shared-memory bytes of each kernel.
template <int C, int NT>
int forward_smem_bytes(const MmaGeom& g, int threads) {
  using T = Taps<C>;
  const int warps = threads / 32;
  return T::kSteps * NT * 32 * 16 + T::kSteps * 4 * 8 + 2 * warps * 2 * 8 * NT * 8 + 2 * g.xs_floats * 4;
}

template <int C, int NT>
int backward_smem_bytes(const MmaGeom& g, int threads) {
  using T = Taps<C>;
  constexpr int MC = (NT + 1) / 2;
  return T::kSteps * MC * 64 * 16 + (T::kSteps * 4 + T::kTapTiles * 8) * 8 + 2 * g.xs_floats * 4 +
         T::kTapTiles * NT * 4 * threads * 4;
}

inline MmaGeom geom_of(const Conv3dGnMeanProblem& p) {
  const ConvShape& s = p.conv;
  return make_mma_geom(s.N, static_cast<int>(s.C), static_cast<int>(s.K), s.in, s.out);
}

// The weight fragments of both GEMMs (tiny; recomputed per call, w may have changed).
template <int C, int NT>
Tensor weight_fragments(const Tensor& w, int terms, cudaStream_t st) {
  using T = Taps<C>;
  constexpr int MC = (NT + 1) / 2;
  const int fwd = T::kSteps * NT * 32, bwd = T::kSteps * MC * 64;  // float4s
  Tensor frags = Tensor::empty({4 * int64_t{fwd + bwd}}, {.dtype = DType::f32, .device = w.device()});
  float4* base = reinterpret_cast<float4*>(frags.data<float>());
  const int items = std::max(fwd, bwd / 2);
  weight_fragments_kernel<C, NT><<<(items + 127) / 128, 128, 0, st>>>(base, base + fwd, w.data<float>(), terms);
  TG_LAUNCH_CHECK();
  return frags;
}

// smem bytes of dynamic shared memory per block, and the largest shared-memory carveout: the
// double-buffered tiles fill an SM for workload C (forward 3 x 72.5 KB, backward
// 2 x 110.6 KB of the 228 KB, plus 1 KB reserved per block).
template <class Kernel>
void allow_shared_memory(Kernel kernel, int smem) {
  allow_dynamic_smem(kernel, smem, /*max_shared_carveout=*/true);
}

// Persistent grid: as many blocks as fit on the device, trimmed to the fewest that keep the
// same number of tiles per block (same makespan, fewer weight copies).
template <class Kernel>
int64_t persistent_blocks(Kernel kernel, int threads, int smem, int64_t tiles, int dev) {
  int per_sm = 0;
  TG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int sms = sm_count(dev);
  TG_CHECK(per_sm > 0, "conv3d_gn_mean: a ", threads, "-thread block with ", smem, " bytes of shared memory does not fit");
  const int64_t slots = std::clamp<int64_t>(int64_t{per_sm} * sms, 1, tiles);
  return ceil_div(tiles, ceil_div(tiles, slots));
}

// Instantiated shape classes: (C_in, K / 8) in {(3, 3), (1, 3)}; conv3d_gn_mean_mma_applies
// (conv3d_gn_mean/dispatch.cu) admits exactly these. TERMS: 1 in TF32 mode, else fp32_terms (2 for the
// forward, 3 for the backward).
template <template <int, int, int> class Launch, int kFp32Terms, class... Args>
void dispatch_shape(const Conv3dGnMeanProblem& p, bool tf32, Args&&... args) {
  const int64_t C = p.conv.C, K = p.conv.K;
  TG_CHECK(K == 24 && (C == 3 || C == 1), "conv3d_gn_mean: no tensor-core kernel for C_in ", C, ", K ", K);
  if (C == 3) {
    if (tf32) Launch<3, 3, 1>::run(args...);
    else Launch<3, 3, kFp32Terms>::run(args...);
  } else {
    if (tf32) Launch<1, 3, 1>::run(args...);
    else Launch<1, 3, kFp32Terms>::run(args...);
  }
}

}  // namespace tg::cuda::conv3d_gn_mean_mma_detail
