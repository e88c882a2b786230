// mma.sync tensor-core operations (sm_80+): the TF32 m16n8k8 and bf16 m16n8k16 products with
// FP32 accumulation, and the bf16 pair packing of the FP32-accurate split products. Device code
// only; each translation unit gets its own copy.
#pragma once
#include <cstdint>

namespace tg::cuda {
namespace {

// D += A B: one m16n8k8 TF32 tensor op, FP32 accumulation. Fragments (PTX ISA; g = lane / 4,
// t = lane % 4): a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 (t, g), b1 (t+4, g);
// d0 (g, 2t), d1 (g, 2t+1), d2 (g+8, 2t), d3 (g+8, 2t+1). The tensor core reads the top 19
// bits of each operand word.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// D = A B (the first k-step of a tile): the C operand is the zero register, so no accumulator
// has to be cleared first.
__device__ __forceinline__ void mma_tf32_zero(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

// D += A B: one m16n8k16 bf16 tensor op, FP32 accumulation. Fragments (PTX ISA): a0 (g, k 2t,
// 2t+1), a1 (g+8, 2t, 2t+1), a2 (g, 2t+8, 2t+9), a3 (g+8, 2t+8, 2t+9); b0 (k 2t, 2t+1; n g),
// b1 (k 2t+8, 2t+9; n g); the lower k in the low half. So register i of an m16n8k8 TF32
// fragment (element k) and register i of a bf16 one (elements 2k, 2k+1) share lane, row and
// column: a TF32 fragment's element can carry a bf16 pair in the same register slot.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two bf16 (round to nearest) in one register, `low` in the low half (the lower k index).
__device__ __forceinline__ uint32_t bf16_pair(float low, float high) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(high), "f"(low));
  return r;
}

}  // namespace
}  // namespace tg::cuda
