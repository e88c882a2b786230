// Shared by the mma.sync kernels of the 3x3 fast path (conv3x3/fprop_sm80.cu, conv3x3/wgrad_sm80.cu) and
// the dispatch in conv3x3/dispatch.cu: pipeline depth, bank-conflict-free strides, the parameters of one
// forward / grad-input pass, and the entry points the dispatch calls.
// Design and precision: docs/kernels/conv3x3.md.
//
// FP32 mode: hi*hi' as one TF32 op plus both cross terms in one bf16 m16n8k16 (see tf32_bits).
// Shared-memory strides are chosen so that every fragment load of a warp hits 32 distinct banks.
#pragma once
#include <cstdint>

#include "../../../core/precision.h"
#include "../../../core/tensor.h"
#include "../../conv.h"

namespace tg::cuda::conv3x3_detail {

// ---- PTX primitives: cp.async, mma_tf32, mma_bf16, bf16_pair, the TF32 roundings and the
// dynamic shared memory in ops/cuda/arch/ (with their fragment layouts); store_if in
// conv3x3/staging.cuh ----

constexpr int kStages = 3;  // cp.async pipeline depth

// Smallest stride >= n (a multiple of 4 floats, for 16-byte copies) such that the 8 x 4 lanes
// of a fragment load, at addresses (lane % 4) * stride + lane / 4, hit 32 distinct banks.
constexpr int stride_for_rows_of_4(int n) {
  while (n % 4 != 0 || (n % 32 != 8 && n % 32 != 24)) ++n;
  return n;
}
// The same for addresses (lane / 4) * stride + lane % 4: stride / 4 must be odd.
constexpr int stride_for_rows_of_8(int n) {
  while (n % 8 != 4) ++n;
  return n;
}

// FP32-accurate products (Precision::FP32): x = hi + lo with hi = tf32(x), |lo| <= 2^-11 |x|;
// x * w ~= hi*hi' (one TF32 mma, exact products) + hi*lo' + lo*hi' (one bf16 m16n8k16 mma
// whose k16 interleaves the pairs: element 2k is hi, 2k+1 is lo on the A side and lo', hi'
// on the B side). bf16 keeps 8 bits of each cross term, itself ~2^-11 of the product, so the
// error is ~2^-20 per product; lo*lo' (~2^-22) is dropped. Two mma instead of 3xTF32's three.
// hi = tf32_bits(x), plain TF32 operands tf32_operand(x) (ops/cuda/arch/tf32.cuh).

// One implicit-GEMM pass: out (N, Kout, Hout, Wout) = conv3x3(in (N, Cin, Hin, Win), prepared w)
// with input row = output row + tap row - pad_h (likewise columns); pads may be negative.
struct GemmParams {
  int64_t N, Cin, Hin, Win;
  int64_t Kout, Hout, Wout;
  int64_t pad_h, pad_w;
  int64_t kout_pad;  // prepared weights: (chunks * 8, 9, kout_pad), zero beyond Cin / Kout
  int64_t chunks;    // ceil(Cin / 8)
  int64_t row_tiles, col_tiles, k_tiles, tiles;
  int vec;  // floats per input copy (4, 2 or 1): rows of `in` allow this alignment
};

// Forward: out = y (N, K, Ho, Wo) from in = x (N, C, H, W).
inline GemmParams forward_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo,
                                 int64_t pad_h, int64_t pad_w) {
  GemmParams p{};
  p.N = N, p.Cin = C, p.Hin = H, p.Win = W;
  p.Kout = K, p.Hout = Ho, p.Wout = Wo;
  p.pad_h = pad_h, p.pad_w = pad_w;
  return p;
}
// Grad-input: out = dx (N, C, H, W) from in = dy (N, K, Ho, Wo), the flipped kernel with the
// channels swapped and padding 2 - pad (a negative padding only crops: it is an offset).
inline GemmParams grad_input_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo,
                                    int64_t pad_h, int64_t pad_w) {
  GemmParams p{};
  p.N = N, p.Cin = K, p.Hin = Ho, p.Win = Wo;
  p.Kout = C, p.Hout = H, p.Wout = W;
  p.pad_h = 2 - pad_h, p.pad_w = 2 - pad_w;
  return p;
}

// out = conv3x3(in, w re-laid out) on the mma.sync kernel of conv3x3/fprop_sm80.cu: the forward pass,
// or (transposed weights) the input gradient, at `precision` (FP32: split products); the tile
// chosen there.
void run_gemm(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, const GemmParams& p,
              bool for_grad_input, Precision precision);
// dw on the mma.sync grad-weight kernel of conv3x3/wgrad_sm80.cu (kSplit: FP32-accurate).
template <bool kSplit>
void run_wgrad(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s);

}  // namespace tg::cuda::conv3x3_detail
