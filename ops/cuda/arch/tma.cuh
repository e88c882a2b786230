// Hopper's tensor memory accelerator (TMA, sm_90) and the transaction barriers it signals, for
// kernels whose tiles are plain boxes of a row-major matrix: one thread asks for a whole box
// (up to 256 rows) global -> shared or shared -> global, and no warp spends load / store
// instructions on it. Host side: ops/cuda/arch/tensor_map.h describes the matrix.
//
// Everything here follows the PTX ISA ("mbarrier", "cp.async.bulk.tensor", "Tensor copy
// completion mechanisms"):
//   - a load names an mbarrier; the barrier's current phase completes once its expected arrivals
//     have arrived AND the bytes announced by arrive_expect_tx have landed, and a thread that saw
//     it complete (wait on its parity) sees the box's bytes;
//   - a store reads shared memory in the async proxy: the threads that wrote the box call
//     fence_proxy_async (wgmma.cuh) before the barrier that precedes the store; the box may be
//     rewritten once bulk_wait_read says the store has read it; the kernel must not exit before
//     bulk_wait says it is done. A store's box may reach past the far end of any dimension (that
//     part is not written) but must not start at a negative coordinate: the unit raises an
//     illegal instruction (dev/tma_store_probe.cu). Loads take negative coordinates (zeros).
// Device code only; the wrappers are empty where sm_90 features are absent (callers guard their
// kernels as the wgmma kernels do).
#pragma once
#include <cstdint>

#include <cuda.h>  // CUtensorMap

#include "cp_async.cuh"  // shared_address

namespace tg::cuda::tma {
namespace {

// A barrier whose phase completes after `arrivals` arrive() calls (and the announced bytes).
__device__ __forceinline__ void mbar_init(uint64_t* bar, int arrivals) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
#endif
}
// After the inits, before other threads (and the TMA unit) use the barriers; a __syncthreads
// follows.
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// A pipeline's stage ring, by one thread: full[s] completes after `full_arrivals` arrivals
// (and the bytes announced), empty[s] after `empty_arrivals`, for s < stages; then the fence.
// A block-wide barrier must follow before any other thread uses them.
__device__ __forceinline__ void init_stage_ring(uint64_t* full, uint64_t* empty, int stages, int full_arrivals,
                                                int empty_arrivals) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(&full[s], full_arrivals);
    mbar_init(&empty[s], empty_arrivals);
  }
  mbar_init_fence();
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
#endif
}
// One arrival that also announces `bytes` of TMA traffic for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#endif
}
// Waits until the phase of parity `parity` has completed (phases alternate 0, 1, 0, ...; the
// k-th completion of a barrier ends phase k, of parity k & 1).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

// Box (c0: column, c1: row) of the matrix `map` describes -> shared memory at dst; its bytes
// count towards bar's current phase. Parts of the box outside the matrix arrive as zeros (and
// still count). The L2 keeps its default eviction priority.
__device__ __forceinline__ void load_box(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_address(bar))
      : "memory");
#endif
}
// The same under an L2 cache policy made by createpolicy (l2_evict_first_policy for data read once).
__device__ __forceinline__ void load_box(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                         uint64_t policy) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_address(bar)), "l"(policy)
      : "memory");
#endif
}
// The same for a box (c0: column, c1: row, c2: plane) of a stack of matrices (f32_planes_map).
__device__ __forceinline__ void load_box_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            uint64_t policy) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(shared_address(bar)), "l"(policy)
      : "memory");
#endif
}
// im2col mode (f32_im2col_map): the map's `pixels` consecutive output pixels starting at input
// coordinate (w, h, [d,] n) (the first pixel's window corner), each read at tap offset
// (off_w, off_h[, off_d]) from its corner, channels c0.. -> shared memory at dst, one row per pixel.
__device__ __forceinline__ void load_im2col_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int w, int h,
                                               int n, uint16_t off_w, uint16_t off_h) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(w), "r"(h), "r"(n), "r"(shared_address(bar)), "h"(off_w),
      "h"(off_h)
      : "memory");
#endif
}
__device__ __forceinline__ void load_im2col_5d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int w, int h,
                                               int d, int n, uint16_t off_w, uint16_t off_h, uint16_t off_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7], {%8, %9, %10};" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(w), "r"(h), "r"(d), "r"(n), "r"(shared_address(bar)),
      "h"(off_w), "h"(off_h), "h"(off_d)
      : "memory");
#endif
}
// `bytes` contiguous bytes global -> shared (both 16-byte aligned, bytes a multiple of 16), counted
// towards bar's current phase: one instruction for a whole block of memory, no tensor map.
__device__ __forceinline__ void load_bytes(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
#endif
}
// Shared memory at src -> box (c0, c1) of the matrix; the parts outside it are not written.
__device__ __forceinline__ void store_box(const CUtensorMap* map, const void* src, int c0, int c1) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(shared_address(src))
               : "memory");
#endif
}
// Shared memory at src -> box (c0, c1, c2) of a stack of matrices; the parts outside it are not written.
__device__ __forceinline__ void store_box_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(shared_address(src))
               : "memory");
#endif
}
// Closes the group of this thread's stores issued since the last commit.
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}
// All but the kPending most recent store groups of this thread have read their shared memory
// (it may be rewritten).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
#endif
}
// Every store group of this thread has completed.
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

}  // namespace
}  // namespace tg::cuda::tma
