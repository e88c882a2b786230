// Named barriers (bar.sync with an id and a thread count), shared by the kernels that sync
// part of a block: one warpgroup (the 3x3 wgmma kernels' staged stores) or two roles of warps
// that reach the meeting point from different code paths (the fused 1x1 backward).
#pragma once

namespace tg::cuda {
namespace {

// Waits until `threads` threads (a multiple of 32) arrived at named barrier `id` (1..15; 0 is
// __syncthreads), without stopping the block's other warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace
}  // namespace tg::cuda
