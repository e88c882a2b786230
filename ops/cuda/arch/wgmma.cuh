// Hopper warpgroup MMA (wgmma, sm_90a) building blocks shared by the tensor-core kernels:
// shared-memory matrix descriptors (K-major, no swizzle or 128-byte swizzle), the async-proxy fence, wgmma
// fence / commit / wait, and the TF32 m64nNk8 instructions with both operands in shared
// memory (SS: mma_ss_tf32, N = 64, 128, 192, 256) or A in registers (RS: mma_rs_tf32, N = 64, 128,
// 256).
//
// Everything here follows the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate"
// and its "Matrix Descriptor" / "Shared Memory Matrix Layout" sections); cross-checked with
// CUTLASS (cute/arch/mma_sm90_desc.hpp: the descriptor bit fields; cute/atom/
// mma_traits_sm90_gmma.hpp: the K-major INTERLEAVE canonical layout ((8,m),(T,2)):((1T,SBO),(1,LBO))).
//
// .tf32 operands in shared memory must be K-major (no transpose for 32-bit types). The no-swizzle
// ("interleave") K-major layout of an operand tile of R rows (M for A, N for B) x 8 k:
//   a core matrix = 8 rows x 16 bytes (4 consecutive k of one row) = 128 CONTIGUOUS bytes;
//   element (row, k) at  start + (row / 8) * SBO + (row % 8) * 16 + (k / 4) * LBO + (k % 4) * 4,
//   SBO ("stride dimension byte offset") = distance between core matrices adjacent along M / N,
//   LBO ("leading dimension byte offset") = distance between the two core matrices along K.
// So rows inside a core matrix are always 16 bytes apart (only whole core matrices move) and a
// core matrix covers the 32 banks once: no-swizzle reads are free of bank conflicts at any
// 16-byte-aligned start address.
//
// Ordering rules the callers must keep (PTX ISA):
//   - generic-proxy writes to an operand (st.shared, cp.async once waited for) become visible to
//     wgmma only after fence.proxy.async by the writing thread, then a barrier: fence_proxy_async().
//   - wgmma.fence (fence()) before the first wgmma of a warpgroup and between any register access
//     to an accumulator or A fragment and a wgmma using the same registers (accumulator chains
//     of the same shape are ordered without it).
//   - results (and the right to overwrite A registers / smem operands) only after wait<n>
//     retired the commit group; re-bind the accumulators with fence_operand() after the wait so
//     the compiler does not hoist reads above it.
//
// On targets without sm_90a features the wrappers are empty: callers guard their kernels with
// __CUDA_ARCH_FEAT_SM90_ALL (and trap otherwise) and say "not applicable" on the host.
#pragma once
#include <cstdint>

#include "cp_async.cuh"  // shared_address

namespace tg::cuda::wgmma {

// ---- descriptors (plain C++, __host__ __device__: host-side tests can compute them too) ----
// 64-bit shared-memory matrix descriptor, K-major without swizzle:
//   bits  0-13  start address >> 4 (shared window address, 16-byte aligned, < 256 KB)
//   bits 16-29  LBO >> 4 (bytes between the core matrices along K)
//   bits 32-45  SBO >> 4 (bytes between core matrices along M / N)
//   bits 49-51  base offset = 0 (used by the swizzle modes only)
//   bits 62-63  layout type 0 = no swizzle ("interleave")
// Adding x to a descriptor moves its start address by 16 x bytes (no carry out of bits 0-13 as
// long as the result stays below 256 KB): per-tap operand offsets are plain integer adds.
__host__ __device__ constexpr uint64_t kmajor_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((smem_addr & 0x3ffffu) >> 4) | (uint64_t((lbo_bytes & 0x3ffffu) >> 4) << 16) |
         (uint64_t((sbo_bytes & 0x3ffffu) >> 4) << 32);
}
// 128-byte-swizzled K-major layout (layout type 1): rows of 128 bytes (32 floats of k), 8 rows
// = one 1024-byte atom whose 16-byte chunks are permuted: element (row, k) of a tile that starts
// 1024-byte aligned sits at byte row * 128 + (((k / 4) ^ (row % 8)) * 16) + (k % 4) * 4.
// SBO = 1024 (next 8 rows); LBO is unused while one instruction's k (8 floats) stays inside a
// row. A k8 step inside the 128-byte row moves the start address by 32 bytes: the hardware
// applies the XOR to the full address, so the tile's base must stay 1024-byte aligned.
__host__ __device__ constexpr uint64_t sw128_kmajor_desc(uint32_t smem_addr) {
  return uint64_t((smem_addr & 0x3ffffu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}
// The descriptor of the same layout `bytes` further on (bytes: a multiple of 16).
__host__ __device__ constexpr uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
// ---- instructions ----

// wgmma::shared_address: the one in cp_async.cuh.
using ::tg::cuda::shared_address;

// This thread's completed generic-proxy writes to shared memory (plain stores, cp.async after
// its wait_group) become visible to the async proxy (wgmma operand reads). A barrier must follow
// before other threads' wgmma read them.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// wgmma.fence: orders this warpgroup's prior register accesses (accumulators, A fragments)
// before the wgmma that follow.
__device__ __forceinline__ void fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
// Closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group takes 0..7");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Re-binds v after a wait: the compiler does not know that the wgmma asm writes its outputs
// asynchronously, so without this it could move reads of v above the wait.
__device__ __forceinline__ void fence_operand(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// D (64 x N, f32, registers) = A (64 x 8) * B (8 x N) + (accumulate ? D : 0), TF32 operands
// (the tensor core reads the top 19 bits of each 32-bit value: unrounded floats are truncated).
// D fragment (per warpgroup; warp w of the warpgroup, g = lane / 4, t = lane % 4): d[4 j + 2 h + e]
// = D[16 w + g + 8 h][8 j + 2 t + e], j < N / 8.
// SS: A (64 x 8) and B (N x 8) both from K-major shared-memory descriptors.
template <int N>
__device__ void mma_ss_tf32(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate);
// RS: A from registers, a[0..3] = A[16 w + g][t], A[16 w + g + 8][t], A[16 w + g][t + 4],
// A[16 w + g + 8][t + 4] (the mma.sync m16n8k8 A fragment per warp); B from a descriptor.
template <int N>
__device__ void mma_rs_tf32(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate);

// The accumulator operands of an m64nN wgmma (N / 2 floats d[0..]): their names in the
// instruction text (TG_WGMMA_REGS_<count>) and their "+f" constraints (TG_WGMMA_ACC_<count>).
#define TG_WGMMA_REGS_0_31 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TG_WGMMA_REGS_32_63 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TG_WGMMA_REGS_64_95 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define TG_WGMMA_REGS_96_127                                                                  \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define TG_WGMMA_REGS_32 TG_WGMMA_REGS_0_31
#define TG_WGMMA_REGS_64 TG_WGMMA_REGS_32 ", " TG_WGMMA_REGS_32_63
#define TG_WGMMA_REGS_96 TG_WGMMA_REGS_64 ", " TG_WGMMA_REGS_64_95
#define TG_WGMMA_REGS_128 TG_WGMMA_REGS_96 ", " TG_WGMMA_REGS_96_127
#define TG_WGMMA_ACC8(i)                                                                    \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define TG_WGMMA_ACC32(i) TG_WGMMA_ACC8(i), TG_WGMMA_ACC8(i + 8), TG_WGMMA_ACC8(i + 16), TG_WGMMA_ACC8(i + 24)
#define TG_WGMMA_ACC_32 TG_WGMMA_ACC32(0)
#define TG_WGMMA_ACC_64 TG_WGMMA_ACC_32, TG_WGMMA_ACC32(32)
#define TG_WGMMA_ACC_96 TG_WGMMA_ACC_64, TG_WGMMA_ACC32(64)
#define TG_WGMMA_ACC_128 TG_WGMMA_ACC_96, TG_WGMMA_ACC32(96)
// One wgmma with its accumulate predicate (operand `pred`): D = A B^T + (accumulate ? D : 0).
// SS: A and B from the descriptors desc_a, desc_b (operands `descs`); RS: A from the registers
// a[0..3] (operands `a_regs`), B from desc_b (operand `desc`). `tail`: the immediates after the
// predicate (scales, and for 16-bit types the transposes).
#define TG_WGMMA_SS(instr, pred, regs, descs, tail, acc)                                                   \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " pred ", 0;\n " instr " {" regs "}, " descs ", p, " tail \
               ";\n}\n"                                                                                    \
               : acc                                                                                      \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))
#define TG_WGMMA_RS(instr, pred, regs, a_regs, desc, acc)                                                   \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " pred ", 0;\n " instr " {" regs "}, {" a_regs "}, " desc  \
               ", p, 1, 1;\n}\n"                                                                           \
               : acc                                                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)))

template <>
__device__ __forceinline__ void mma_ss_tf32<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_SS("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32", "%34", TG_WGMMA_REGS_32, "%32, %33", "1, 1",
              TG_WGMMA_ACC_32);
#endif
}

template <>
__device__ __forceinline__ void mma_ss_tf32<128>(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_SS("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32", "%66", TG_WGMMA_REGS_64, "%64, %65", "1, 1",
              TG_WGMMA_ACC_64);
#endif
}

template <>
__device__ __forceinline__ void mma_ss_tf32<192>(float (&d)[96], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_SS("wgmma.mma_async.sync.aligned.m64n192k8.f32.tf32.tf32", "%98", TG_WGMMA_REGS_96, "%96, %97", "1, 1",
              TG_WGMMA_ACC_96);
#endif
}

template <>
__device__ __forceinline__ void mma_ss_tf32<256>(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_SS("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", "%130", TG_WGMMA_REGS_128, "%128, %129", "1, 1",
              TG_WGMMA_ACC_128);
#endif
}

template <>
__device__ __forceinline__ void mma_rs_tf32<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_RS("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32", "%37", TG_WGMMA_REGS_32,
              "%32, %33, %34, %35", "%36", TG_WGMMA_ACC_32);
#endif
}

template <>
__device__ __forceinline__ void mma_rs_tf32<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_RS("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32", "%69", TG_WGMMA_REGS_64,
              "%64, %65, %66, %67", "%68", TG_WGMMA_ACC_64);
#endif
}

template <>
__device__ __forceinline__ void mma_rs_tf32<256>(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_RS("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", "%133", TG_WGMMA_REGS_128,
              "%128, %129, %130, %131", "%132", TG_WGMMA_ACC_128);
#endif
}

}  // namespace tg::cuda::wgmma
