// The TMA kernel's producer (tma_mainloop_sm90.cuh) for two row-major matrices with the
// reduction contiguous, c = a b^T: k-tile kt is box (k kt * kTileK, rows m0..) of a and
// (k kt * kTileK, rows n0..) of b, f32 (32 k per tile) or bf16 (64 k). Used by
// matmul_sm90_tma.cu (f32) and matmul_bf16_sm90_tma.cu (bf16); each instantiates the kernel
// for its own element type. Outside any anonymous namespace: unused internal members would
// warn in the device passes without sm_90a code.
#pragma once
#include "tma_mainloop_sm90.cuh"

namespace tg::cuda::engine {

template <bool kBf16Elements>
struct MatrixBoxes {
  static constexpr bool kBf16 = kBf16Elements;  // bf16 boxes and BF16 products
  CUtensorMap a, b;
  struct Cursor {
    int32_t m0;
  };

  __device__ __forceinline__ void prefetch() const {
    tma::prefetch_map(&a);
    tma::prefetch_map(&b);
  }
  __device__ __forceinline__ Cursor start(int32_t, int32_t m0) const { return {m0}; }
  __device__ __forceinline__ void advance(Cursor&) const {}
  __device__ __forceinline__ void load(unsigned char* a_dst, unsigned char* b_dst, uint64_t* bar, const Cursor& at,
                                       int32_t kt, int32_t n0) const {
    tma::load_box(a_dst, &a, bar, kt * kTileK<kBf16Elements>, at.m0);
    tma::load_box(b_dst, &b, bar, kt * kTileK<kBf16Elements>, n0);
  }
};

}  // namespace tg::cuda::engine
