// The engine's host-side planning, shared by its translation units (engine.cu: the public
// entry points and weight packing; planning.cu: tiles, splits, the split reduction, geometry;
// dgrad_columns.cu: grad-input for few input channels). Not installed: internal to ops/cuda/gemm.
// Design note: docs/kernels/gemm.md.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <limits>

#include "../../../core/precision.h"
#include "../../../core/tensor.h"
#include "../../../core/tensor_kernels.h"
#include "../../conv.h"
#include "../arch/tensor_map.h"
#include "dgrad_phases.h"
#include "engine.h"
#include "kernels.h"

namespace tg::cuda::engine {

constexpr int64_t kIndexLimit = std::numeric_limits<int32_t>::max();
// Coordinates (input size plus padding, dilated kernel extent) stay far from int32 overflow.
constexpr int64_t kCoordinateLimit = int64_t{1} << 29;
constexpr int kThreads = 256;  // the engine's elementwise helper kernels

inline bool fits(int64_t v) { return v >= 0 && v <= kIndexLimit; }
// A bf16 tensor's elements as their bit patterns (Tensor::data has no C++ type for bf16).
inline const uint16_t* bf16_bits(const Tensor& t) { return static_cast<const uint16_t*>(t.raw_data()); }

// Tiles, kernel (wgmma or mma.sync) and reduction split for one product C[M][N] over red.
// narrow_ok: B's k is contiguous (the narrow tile's loader needs it).
// gather: a convolution (an operand is gathered), not a plain matrix product.
Plan make_plan(int64_t M, int64_t N, int64_t red, int dev, const EnginePolicy& policy, bool narrow_ok,
               Precision precision, bool gather);

// The TMA kernel's plan (tma_mainloop_sm90.cuh): 128 x cols tiles, and the reduction split that
// a wave model says finishes first (policy.splits forces it). bf16: bf16 operands (64 k per
// k-tile, twice the TF32 product rate; precision ignored).
Plan make_tma_plan(int64_t M, int64_t N, int64_t red, int cols, int dev, const EnginePolicy& policy,
                   Precision precision = Precision::TF32, bool bf16 = false);
// Whether a TMA product planned on 128-wide tiles (plan128) runs faster on 128 x 256 ones, which
// move a quarter fewer bytes per product: on long reductions (2048+) where it costs no waves
// (blocks of twice the work, counted in waves of one block per SM, no more than the 128-wide
// tiles'), unsplit, and not where the policy asks for two blocks per SM.
bool wide_tma_tile_pays(const Plan& plan128, int64_t N, int64_t red, const EnginePolicy& policy, int dev);
// Blocks per SM of the TMA kernel for `tiles` tiles `cols` wide: two (half the stages each)
// where there are tiles for two per SM, so that one's fill and epilogue hide behind the other.
int tma_blocks_per_sm(int cols, int64_t tiles, int sms, const EnginePolicy& policy);

// out[b][col][row] = in[b][row][col] for `batches` row-major (rows x cols) matrices; rows
// from `rows` to `padded_rows` are zeros (the TMA's 16-byte row rule). On `stream`.
void transpose_into(float* out, const float* in, int64_t batches, int64_t rows, int64_t cols, int64_t padded_rows,
                    cudaStream_t stream);
// The same over bf16 bit patterns (zeros: +0).
void transpose_into(uint16_t* out, const uint16_t* in, int64_t batches, int64_t rows, int64_t cols,
                    int64_t padded_rows, cudaStream_t stream);

// Runs pass(out32) on `out` itself where it is f32, else on an f32 scratch rounded into it once
// (to nearest even): for the f32 kernels, which write f32 only, under a bf16 pass.
template <class Pass>
void into_f32(const Tensor& out, Pass&& pass) {
  if (out.dtype() == DType::f32) return pass(out);
  Tensor out32 = Tensor::empty(out.shape(), {.dtype = DType::f32, .device = out.device()});
  pass(out32);
  cast(out, out32);
}

// Runs one planned launch: straight into args.out, or into partial sums (a workspace) that one
// fixed-order pass reduces into args.out.
using LaunchFn = std::function<void(const MainloopArgs&, cudaStream_t)>;
void run_plan(const Plan& plan, MainloopArgs args, const Device& device, const LaunchFn& launch);

// The gathers' 32-bit geometry (with its divisors) of a convolution.
ConvGeometry geometry(const ConvShape& s);
// The TMA unit's im2col geometry of s's input with `channels` channels (C, or C padded in a
// channels-last scratch): rank 4 for 2-D problems and one-plane 3-D ones, else rank 5.
Im2colGeometry im2col_geometry(const ConvShape& s, int64_t channels);
// A row-major (M, N) output with an optional per-column bias.
OutputMap output_map(float* data, const float* bias, int64_t M, int64_t N);
// The same into `out`, f32 or bf16 (each sum rounded once).
OutputMap output_map(const Tensor& out, const float* bias, int64_t M, int64_t N);
// A convolution forward's product (output pixels x K over `red`) into y (s's layout, f32 or
// bf16; bias optional).
MainloopArgs conv_forward_args(const Tensor& y, const float* bias, const ConvShape& s, int64_t red);
// One stride phase of the grad-input (dgrad_phases.h) as the kernels see it: its pixels, taps
// and their divisors; and its output, rows (img, j) of the phase's pixels scattered into dx
// (s's layout), columns dx's channels.
PhaseGeometry phase_geometry(const DimPhase (&dims)[3]);
OutputMap phase_output_map(const Tensor& dx, const ConvShape& s, const PhaseGeometry& ph);

// TF32 or FP32 (split TF32) forward on Hopper through the TMA unit's im2col mode
// (conv_fprop_sm90_tma.cu): whether it serves this problem (16+ input channels, or fewer where
// its channel-quad mode pays; geometry within the tensor map's ranges, channels-last
// inputs with C % 4 == 0 and 16-byte alignment), and the pass.
// `flipped`: s is a grad-input posed as a forward (grad_input_as_forward), x is dy, y is dx
// and w the forward's weights, read transposed and flipped.
bool conv_fprop_tma_applies(const ConvShape& s, const float* x, int dev, const EnginePolicy& policy,
                            Precision precision);
void conv_fprop_tma(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                    Precision precision, const EnginePolicy& policy, bool flipped = false);
// Grad-weight on Hopper as a TMA product (TF32, or FP32 as split TF32) over written-out dy and
// input columns (conv_wgrad_sm90_tma.cu): whether it serves this problem (64+ output channels,
// or 32+ when C * kvol <= 64; columns within 1 GiB), and the pass.
bool conv_wgrad_tma_applies(const ConvShape& s, int dev, const EnginePolicy& policy);
void conv_wgrad_tma(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s, Precision precision,
                    const EnginePolicy& policy);
// The same over bf16 dy and x (bf16 rows and columns, BF16 products; dw f32).
// Both run the shifted-rows product below where it applies.
bool conv_wgrad_bf16_tma_applies(const ConvShape& s, int dev, const EnginePolicy& policy);
void conv_wgrad_bf16_tma(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                         const EnginePolicy& policy);

// Stride-1 grad-weight over shifted rows of the padded input (conv_wgrad_shifted_sm90.cu):
// whether it serves this problem (16+ input channels, copies within 1 Gi elements, and unless
// policy.wgrad_shifted is 1 a padded grid that wastes little), and the pass (TF32 or FP32 for
// f32 dy and x, BF16 products for bf16 ones; dw f32).
bool conv_wgrad_shifted_applies(const ConvShape& s, int dev, const EnginePolicy& policy, bool bf16);
void conv_wgrad_shifted(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s, Precision precision,
                        const EnginePolicy& policy);

// The grad-input of s as the forward problem that computes it (stride 1, padding at most the
// dilated kernel's reach in every dim); false where there is none.
bool grad_input_as_forward(const ConvShape& s, ConvShape& forward);

// Strided grad-input on Hopper's TMA kernel, TF32 or FP32 (split TF32), one stride-1 forward
// over dy per stride phase (conv_dgrad_sm90_tma.cu): whether it serves this problem (a stride
// above 1, 16+ dy channels, channels-last dy with K % 4 == 0 and 16-byte alignment, every
// phase's geometry within the im2col map's ranges), and the pass.
bool conv_dgrad_phases_tma_applies(const ConvShape& s, const float* dy, int dev);
void conv_dgrad_phases_tma(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                           Precision precision, const EnginePolicy& policy);
// The same over bf16 dy and w (64-channel slices, BF16 products; NHWC dy with K % 8 == 0); dx f32.
bool conv_dgrad_phases_bf16_tma_applies(const ConvShape& s, const Tensor& dy);
void conv_dgrad_phases_bf16_tma(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                                const EnginePolicy& policy);

// Grad-input for few input channels (dgrad_columns.cu): whether it applies, and the pass.
bool columns_pay(const ConvShape& s);
void grad_input_by_columns(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                           Precision precision, const EnginePolicy& policy);

}  // namespace tg::cuda::engine
