// BF16 warpgroup products on Hopper (sm_90a): D (64 x N, f32 registers) += A (64 x 16) B (N x 16)^T
// with both operands bf16 in shared memory, K-major, read through the same descriptors as the
// TF32 ones (wgmma.cuh: a 128-byte swizzled row holds 64 bf16 of k, a k16 step is 32 bytes, as
// a TF32 k8 step). The D fragment is the TF32 one: d[4 j + 2 h + e] = D[16 w + g + 8 h][8 j + 2 t + e]
// for warp w of the warpgroup, g = lane / 4, t = lane % 4. Products of bf16 values are exact in
// f32; the tensor cores accumulate them in f32.
#pragma once
#include <cstdint>

#include "wgmma.cuh"  // the descriptors, and the operand lists of TG_WGMMA_SS

namespace tg::cuda::wgmma {

// D = A B^T + (accumulate ? D : 0); A, B K-major (no transpose).
template <int N>
__device__ void mma_ss_bf16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate);

template <>
__device__ __forceinline__ void mma_ss_bf16<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_SS("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", "%34", TG_WGMMA_REGS_32, "%32, %33",
              "1, 1, 0, 0", TG_WGMMA_ACC_32);
#endif
}

template <>
__device__ __forceinline__ void mma_ss_bf16<128>(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_SS("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "%66", TG_WGMMA_REGS_64, "%64, %65",
              "1, 1, 0, 0", TG_WGMMA_ACC_64);
#endif
}

template <>
__device__ __forceinline__ void mma_ss_bf16<256>(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  TG_WGMMA_SS("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "%130", TG_WGMMA_REGS_128, "%128, %129",
              "1, 1, 0, 0", TG_WGMMA_ACC_128);
#endif
}

}  // namespace tg::cuda::wgmma
