// The implicit-GEMM engine: one tensor-core kernel family (mma.sync TF32 on sm_80 and later,
// wgmma for TF32 128x128 tiles on Hopper)
// for every f32 convolution pass (2-D and 3-D, any kernel, stride, padding, dilation, NCHW
// and NHWC; forward, input gradient, weight gradient) and every matrix product. The conv
// and linear dispatchers call it for what no specialised kernel claims.
// Precision::FP32 runs three TF32 products per step (split operands: FP32 accuracy);
// Precision::TF32 runs one. The weight gradient and split reductions are deterministic.
// Design note: docs/kernels/gemm.md.
#pragma once
#include "../../../core/precision.h"
#include "../../../core/tensor.h"
#include "../../conv.h"
#include "../../linear.h"

namespace tg::cuda {

// Overrides of the engine's own choices, for tests and the benchmark.
struct EnginePolicy {
  int tile = 0;    // 0: by problem size; 128: 128x128; 64: 64x64; 16: 128x16 where B's k is contiguous;
                   // 256: 128x256 where the TMA matmul kernel runs (else 128x128)
  int splits = 0;  // 0: by problem size; n >= 1: split the reduction n ways (fewer if it is short)
  int arch = 0;    // 0: the engine's choice; 80: mma.sync kernels only; 90: wgmma wherever it applies
  int blocks_per_sm = 0;  // the TMA kernels' 128-wide tiles: 0 by problem size; 1 or 2
  int wgrad_columns = 0;  // grad-weight over written-out columns (Hopper): 0 by output
                          // channels; 1 wherever the columns fit; -1 never
  int wgrad_shifted = 0;  // stride-1 grad-weight over shifted rows instead of columns (Hopper,
                          // conv_wgrad_shifted_sm90.cu): 0 where it pays (its rule);
                          // 1 wherever it applies; -1 never
  int fp32_tma = 0;       // FP32 products on the TMA kernel (split TF32, docs/kernels/gemm_tma.md):
                          // 0 wherever the TF32 ones would run there; -1 never
  int tma_quads = 0;      // the TMA convolution kernels' k-tiles as (tap, 4-channel quad) pairs:
                          // 0 where it pays (few channels, conv_fprop_sm90_tma.cu); 1 wherever
                          // fewer than 32; -1 never (then fewer than 16 channels: no TMA kernel)
  int tma_store = 0;      // the TMA kernels' epilogue: 0 TMA stores of the tile where the output
                          // allows (plain, channels-first, split partial sums: tile_store_for);
                          // -1 one store per element through the output map everywhere
};

// Whether the engine serves this problem: f32 data and every row, column and reduction
// count below 2^31 (its indices are 32-bit; offsets are 64-bit).
bool engine_conv_can_implement(const ConvShape& s, DType dtype);
bool engine_gemm_can_implement(const GemmProblem& p, DType dtype);

// Whether engine_conv_forward runs the TMA-fed Hopper kernel for this problem: TF32, or FP32
// unless policy.fp32_tma is -1, on an sm_90a device; a geometry within the TMA unit's im2col
// ranges, channels-last inputs with C % 4 == 0 (NCHW inputs are transposed first), and a policy
// that allows it (not arch 80, tile 0, 128 or 256); 16+ input channels, or fewer where the
// channel-quad mode pays (or policy.tma_quads is 1).
bool engine_conv_forward_uses_tma(const ConvShape& s, const Tensor& x, Precision precision,
                                  const EnginePolicy& policy = {});
// The same for engine_conv_grad_input, which runs stride-1 problems (padding at most the
// dilated kernel's reach) as a forward of dy with the weights transposed and flipped, and
// strided ones phase by phase, each phase a stride-1 forward over dy (16+ dy channels; NHWC dy
// with K % 4 == 0; every phase's geometry within the im2col ranges). Where the columns pass
// pays (up to 8 input channels: dgrad_columns.cu) it runs instead and this says false, though
// its columns product is an engine_gemm that may take the TMA matmul.
bool engine_conv_grad_input_uses_tma(const ConvShape& s, const Tensor& dy, Precision precision,
                                     const EnginePolicy& policy = {});
// The same for engine_conv_grad_weight, which runs a TMA matrix product over dy and the input
// with the pixels contiguous: over shifted rows of the padded input where that applies (below),
// else over written-out columns (64+ output channels, or 32+ when C * kvol <= 64; columns
// within 1 GiB).
bool engine_conv_grad_weight_uses_tma(const ConvShape& s, const Tensor& dw, Precision precision,
                                      const EnginePolicy& policy = {});
// Whether that TMA grad-weight (of f32 operands, or of bf16 ones: engine_conv_grad_weight_bf16)
// reads shifted rows of the padded input instead of written-out columns: stride 1, 16+ input
// channels, and (policy 0) 32+ output channels and a padded grid that wastes little (at most
// 1.2x the output pixels; 1.45x with 25+ taps, 1.3x up to 256 input channels).
bool engine_conv_grad_weight_uses_shifted_rows(const ConvShape& s, const Tensor& dw, Precision precision,
                                               bool bf16_operands, const EnginePolicy& policy = {});

// Same contracts as tg::cuda::conv_forward / conv_grad_input / conv_grad_weight / gemm:
// outputs fully overwritten, ordered on the device's framework stream.
void engine_conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                         Precision precision, const EnginePolicy& policy = {});
void engine_conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                            Precision precision, const EnginePolicy& policy = {});
void engine_conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                             Precision precision, const EnginePolicy& policy = {});
void engine_gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p,
                 Precision precision, const EnginePolicy& policy = {});

// BF16 convolution forward (conv_bf16_sm90_tma.cu): y (s's output, f32 or bf16) = conv(x, w) + b
// with x and w bf16, b f32 or undefined: products exact in f32, accumulated in f32, a bf16 y
// rounded once (in the kernel's epilogue, or from an f32 scratch elsewhere). On Hopper's
// TMA kernel where 16+ input channels, NHWC rows of whole 16 bytes (C % 8 == 0) and the im2col
// map's ranges allow (_uses_tma); elsewhere the f32 dispatcher at TF32 on f32 copies.
bool engine_conv_forward_bf16_uses_tma(const ConvShape& s, const Tensor& x, const EnginePolicy& policy = {});
void engine_conv_forward_bf16(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                              const EnginePolicy& policy = {});
// Its grad-input: dx (f32 or bf16, rounded once) from dy and w bf16. Stride-1 problems (padding at most the dilated
// kernel's reach) run as the BF16 forward of dy with the weights transposed and flipped where
// that forward takes the TMA kernel (16+ dy channels); strided ones phase by phase as the f32
// grad-input (16+ dy channels, NHWC dy with K % 8 == 0); the rest on the f32 dispatcher at TF32.
bool engine_conv_grad_input_bf16_uses_tma(const ConvShape& s, const Tensor& dy, const EnginePolicy& policy = {});
void engine_conv_grad_input_bf16(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                                 const EnginePolicy& policy = {});
// Its grad-weight: dw (f32) from dy and x bf16, the columns product of engine_conv_grad_weight
// over bf16 dy rows and input columns (the same output-channel and size rules); elsewhere the
// f32 dispatcher at TF32 on f32 copies.
bool engine_conv_grad_weight_bf16_uses_tma(const ConvShape& s, const Tensor& dw, const EnginePolicy& policy = {});
void engine_conv_grad_weight_bf16(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                                  const EnginePolicy& policy = {});

// BF16 products (matmul_bf16_sm90_tma.cu): c (M x N, f32 or bf16) = op(a) op(b) (+ bias, f32, per
// column) with a and b bf16, row-major, transposes as p says (as engine_gemm): products exact in
// f32, accumulated in f32, a bf16 c rounded once. On Hopper's TMA kernel, which reads the reduction contiguous: operands
// stored the other way are transposed into a scratch first; one read in place needs K % 8 == 0
// (16-byte rows) and 16-byte alignment; the policy must allow it (not arch 80, not tile 16).
// _uses_tma says whether; elsewhere the TF32 engine on f32 copies of a and b, the same products.
bool engine_gemm_bf16_uses_tma(const Tensor& a, const Tensor& b, const GemmProblem& p, const EnginePolicy& policy = {});
void engine_gemm_bf16(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p,
                      const EnginePolicy& policy = {});

namespace engine {
// An f32 copy of t (bf16 widens exactly) made as a kernel's scratch: unlike Tensor::to, not
// recorded on an active tape. The bf16 passes run the f32 kernels on such copies where those win.
Tensor widened(const Tensor& t);
}  // namespace engine

}  // namespace tg::cuda
