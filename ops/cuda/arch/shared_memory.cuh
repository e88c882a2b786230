// Shared memory: the dynamic buffer, and plain (generic-proxy) loads and stores as single PTX
// instructions, by pointer or by shared-window address (shared_address in cp_async.cuh): vector
// accesses stay whole, and address arithmetic stays 32-bit. Vectors must be aligned to their
// size. Device code only; each translation unit gets its own copy.
#pragma once
#include <cstdint>

#include "cp_async.cuh"  // shared_address

namespace tg::cuda {
namespace {

// The block's dynamic shared memory, declared kAlign-byte aligned (wgmma operands and TMA boxes
// want 128).
template <int kAlign>
__device__ __forceinline__ float* dynamic_smem() {
  extern __shared__ __align__(kAlign) float smem_buffer[];
  return smem_buffer;
}

__device__ __forceinline__ uint32_t ld_shared(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float2 ld_shared_v2(const float* src) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(shared_address(src)) : "memory");
  return v;
}

__device__ __forceinline__ void st_shared(uint32_t addr, float a) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(a) : "memory");
}
__device__ __forceinline__ void st_shared_v2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void st_shared_v2(float* dst, float a, float b) { st_shared_v2(shared_address(dst), a, b); }
__device__ __forceinline__ void st_shared_v4(float* dst, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(shared_address(dst)), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

}  // namespace
}  // namespace tg::cuda
