// TF32 operands for the tensor cores (mma.sync and wgmma): rounding f32 to TF32 (the bits of an
// FP32-accurate split, a plain operand, or cvt.rna) and the ldmatrix load that hands f32
// fragments to the lanes. Device code only; each translation unit gets its own copy.
#pragma once
#include <cstdint>

namespace tg::cuda {
namespace {

// tf32 bits of x rounded to nearest (ties away): what cvt.rna.tf32.f32 gives for finite x,
// without its infinity guard. FP32 mode needs these exact hi bits (lo = x - hi).
__device__ __forceinline__ uint32_t tf32_bits(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }
// x as a plain-TF32 mma operand: the tensor cores read only the top 19 bits of a .tf32 operand,
// so adding half a TF32 ulp is the whole rounding (what ptxas emits for cvt.rna feeding an mma).
__device__ __forceinline__ uint32_t tf32_operand(float x) { return __float_as_uint(x) + 0x1000u; }
// Round to the nearest TF32 (10-bit mantissa), ties away from zero; low 13 bits become 0
// (cvt.rna itself: infinities stay infinite).
__device__ __forceinline__ uint32_t tf32_round(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// Four 8 x (4 x 32-bit) matrices from shared memory: lane 8j + r gives the 16-byte row r of
// matrix j; register j of lane 4r + c receives word c of row r of matrix j (PTX ISA, ldmatrix
// .m8n8 .b16: each 32-bit word is a pair of b16 elements, so f32 data passes through unchanged).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace
}  // namespace tg::cuda
