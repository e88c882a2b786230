// The CUDA convolution dispatcher: the ordered table of conv_variants.h and the launchers of
// conv.h that walk it. Rows: the 1x1 kernels (ops/cuda/conv1x1/) and the 3x3 kernels
// (ops/cuda/conv3x3/) and the few-tap forward (conv_few_channels.cu) for the shapes where they
// were measured fastest, then the implicit-GEMM
// engine (ops/cuda/gemm/), then the direct FFMA kernels (conv_direct.cu), which implement
// everything. KernelPolicy (policy.h) can skip the specialised rows, force the direct kernels,
// or force one row by name.
#include <algorithm>
#include <array>

#include "core/error.h"
#include "core/tensor_kernels.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv1x1/conv1x1.h"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv_direct.h"
#include "ops/cuda/conv_few_channels.h"
#include "ops/cuda/conv_variants.h"
#include "ops/cuda/gemm/engine.h"
#include "ops/cuda/policy.h"

namespace tg::cuda {
namespace {

// The crossovers below come from dev/conv_routing_probe.cu (H200, TF32 and FP32; channel pairs
// 32..512 in and out, images 8x8 .. 128x128 at about 64K output pixels; each row's median time;
// the table and ratios are in bench/journal/notes_engine_sm90.md). Where the engine would not run
// the pass on its TMA kernel (pre-Hopper GPUs, the policy's arch 80, too few channels) the
// specialised kernels keep it: the rules were measured against that kernel only.

// ---- 1x1: the pointwise kernels against the engine ----
// The 1x1 kernels keep a block of weights resident and re-read their output once per 128
// reduction channels: past 512 channels the engine's tiles are faster (H200, 1024 -> 256
// channels at 14x14: FP32 forward 0.38 ms against 0.17 on the engine, fwd+bwd 0.88 against 0.63).
constexpr int64_t kPointwiseMaxChannels = 512;
bool pointwise_claims(const ConvShape& s, DType dtype) {
  return conv1x1_applies(s, dtype) && s.C <= kPointwiseMaxChannels && s.K <= kPointwiseMaxChannels;
}
// Forward and grad-input: with 64 or fewer channels on a side the 1x1 kernels win (1.1-2.6x the
// engine's speed: most of the engine's 128-wide tiles would be empty). From 96 on both sides the
// engine's TMA kernel wins channels-last (TF32 0.13-0.68 of the 1x1 kernels' time, FP32 0.34-0.98);
// channels-first its input is transposed first, and it wins at TF32 from 192 x 192 (C K >= 36864:
// 0.26-0.87; 96 x 96 and 128 x 128 lose, 1.3-1.4). At FP32 channels-first it wins where the
// pass reduces over more than 128 channels (the 1x1 forward's launch per 128 of them) and writes
// 96+ (256 x 256 0.82, 512 x 512 0.51; level, 0.99-1.04, at 192 x 192 and 384 -> 96 at 64K
// pixels, where the zoo's 16K-pixel 384 -> 96 forward takes 0.81 of the 1x1 kernel's time) and
// loses otherwise (96 -> 384 forward 1.12, 384 -> 96 grad-input 1.09). Grad-weight stays on the
// 1x1 kernels (1.0-2.8x faster everywhere in the grid but 8x8 images, below). Channels-last at TF32
// the engine also wins with 64 channels on a side where the pass reduces over 256+ (256 -> 64
// forward and 64 -> 256 grad-input: 0.57-0.61 of the 1x1 kernels' time at every image size;
// the other two passes tie or nearly, 0.87-1.0, and stay).
constexpr int64_t kEngineMinChannels1x1 = 96, kEngineMinProductNchwTf32 = 36864, kPointwiseMaxReductionNchwFp32 = 128;
// On images of 64 pixels or fewer (8x8) channels-first, the 1x1 kernels' tiles are mostly empty:
// the engine wins from 96 channels on both sides at TF32 and FP32 alike (96 x 96 0.85 and 0.96 of
// their time, 128 x 128 0.90 and 0.96, 96 -> 384 FP32 forward 0.65), and takes the grad-weight
// from C K >= 36864 (192 x 192 0.60 / 0.47 at TF32 / FP32, 512 x 512 0.43 / 0.49; 128 x 128 and
// 64 -> 256 lose, 1.5-1.7).
constexpr int64_t kEngineMinChannels1x1NhwcTf32 = 64, kEngineMinReduction1x1NhwcTf32 = 256;
constexpr int64_t kTinyImagePixels1x1 = 64, kEngineMinProductTinyGradWeight1x1 = 36864;
bool tiny_channels_first_images(const ConvShape& s) {
  return !s.channels_last() && s.out[0] * s.out[1] * s.out[2] <= kTinyImagePixels1x1;
}
bool engine_beats_pointwise(const ConvShape& s, ConvPass pass, Precision precision) {
  const int64_t narrow = std::min(s.C, s.K);
  const int64_t reduced = pass == ConvPass::Forward ? s.C : s.K, written = pass == ConvPass::Forward ? s.K : s.C;
  if (pass == ConvPass::GradWeight)
    return tiny_channels_first_images(s) && s.C * s.K >= kEngineMinProductTinyGradWeight1x1;
  if (tiny_channels_first_images(s) && narrow >= kEngineMinChannels1x1) return true;
  if (s.channels_last()) {
    if (precision == Precision::TF32 && narrow >= kEngineMinChannels1x1NhwcTf32 &&
        reduced >= kEngineMinReduction1x1NhwcTf32)
      return true;
    return narrow >= kEngineMinChannels1x1;
  }
  if (precision == Precision::FP32) return reduced > kPointwiseMaxReductionNchwFp32 && written >= kEngineMinChannels1x1;
  return narrow >= kEngineMinChannels1x1 && s.C * s.K >= kEngineMinProductNchwTf32;
}

// ---- 3x3 stride 1 NCHW: the 3x3 kernels against the engine ----
// The 3x3 kernels tile the image; on small images most of each tile is wasted. Forward and
// grad-input, against the engine's TMA kernel, by the channels the pass writes (K forward, C
// grad-input):
// - TF32: the engine wins every image up to 64x64 (0.35-0.81 of the 3x3 kernels' time) and at
//   128x128 where the pass writes 96+ channels (0.69-0.96); the 3x3 kernels win at 128x128 with
//   64 or fewer (1.17-1.53). Larger images stay on the 3x3 kernels (beyond the grid; workload A's
//   512x1024 is their home).
// - FP32: the engine wins up to 32x32 (0.10-0.77) and at 64x64 with 96+ channels (0.75); the 3x3
//   kernels at 64x64 with 64 or fewer (1.44) and from 128x128 (1.4-2.6).
// The crossovers between grid points are taken at the geometric middle. Without the TMA kernel:
// at TF32 the engine's mma.sync kernel under 512 output pixels (H200 forward, 384 channels at
// 16x16: 0.34 ms against 0.44); FP32 stays.
constexpr int64_t kConv3x3FewChannels = 64;
constexpr int64_t kConv3x3MinPixelsTf32 = 512;  // without the TMA kernel
constexpr int64_t kConv3x3MinPixelsTf32Tma = 128 * 128 + 1;  // 128x128 itself: the engine
constexpr int64_t kConv3x3MinPixelsTf32TmaFew = 8192;
constexpr int64_t kConv3x3MinPixelsFp32Tma = 8192, kConv3x3MinPixelsFp32TmaFew = 2048;
// Passes that reduce over fewer than 16 channels were measured only without the TMA kernel,
// whose channel-quad mode (conv_fprop_sm90_tma.cu) now takes some of them: they keep the rules
// of "without the TMA kernel" (the 3x3 kernels from 512 pixels at TF32, always at FP32).
// `engine_tma()` is asked only for the images whose routing depends on it.
constexpr int64_t kConv3x3MeasuredMinChannels = 16;
template <class EngineTma>
bool conv3x3_claims_data_pass(const ConvProblem& p, EngineTma&& engine_tma) {
  if (p.dtype != DType::f32 || !conv3x3_applies(p.shape, p.precision)) return false;
  const int64_t pixels = p.shape.out[1] * p.shape.out[2];
  const int64_t written = p.pass == ConvPass::Forward ? p.shape.K : p.shape.C;
  const int64_t reduced = p.pass == ConvPass::Forward ? p.shape.C : p.shape.K;
  if (reduced < kConv3x3MeasuredMinChannels) return p.precision == Precision::FP32 || pixels >= kConv3x3MinPixelsTf32;
  const bool few = written <= kConv3x3FewChannels;
  if (p.precision == Precision::FP32) {
    if (pixels >= (few ? kConv3x3MinPixelsFp32TmaFew : kConv3x3MinPixelsFp32Tma)) return true;
    return !engine_tma();
  }
  if (pixels >= (few ? kConv3x3MinPixelsTf32TmaFew : kConv3x3MinPixelsTf32Tma)) return true;
  return pixels >= kConv3x3MinPixelsTf32 && !engine_tma();
}

// Grad-weight: the 3x3 kernels win from 32x32 on; on smaller images the engine's TMA product
// (over written-out columns) wins where C K is large: TF32 at 8x8 from C K >= 9216 (96 x 96:
// 0.75; 64 x 64: 1.21) and at 16x16 from 36864 (96 -> 384: 0.75; 64 -> 256: 1.07); FP32 at 8x8
// from 4096 (64 x 64: 0.86) and at 16x16 from 9216 (96 x 96: 0.89; 64 x 64: 1.50). But the
// engine's columns (C x 9 rows over every pixel) outweigh its products where K is small
// against C: 256 -> 64 at 8x8 1.66x the 3x3 kernels' time, 384 -> 96 at 16x16 1.95x (TF32, H200):
// the engine needs 2 K >= C.
// Over shifted rows of the padded input (no columns: conv_wgrad_shifted_sm90.cu) the engine wins
// more (dev/wgrad_shifted_probe.cu, H200): FP32 from C K >= 16384 on any image size (128 -> 128
// at 32x32 and 64x64: 0.39 / 0.37 ms against 0.47; 96 -> 96 at 64x64 stays: 0.29 against 0.24),
// TF32 on 16x16 images from C K >= 16384 where the batch has at most 16384 output pixels (the
// ResNet-style 128 -> 128 at batch 64: 0.084 against 0.112; at batch 256 the 3x3 kernels win,
// 0.248 against 0.271).
constexpr int64_t kGradWeightTinyPixels = 128, kGradWeightSmallPixels = 512;
constexpr int64_t kShiftedMinProduct = 16384, kShiftedTf32MaxBatchPixels = 16384;
template <class EngineTma, class EngineShifted>
bool conv3x3_claims_grad_weight(const ConvProblem& p, EngineTma&& engine_tma, EngineShifted&& engine_shifted) {
  if (p.dtype != DType::f32 || !conv3x3_applies(p.shape, p.precision)) return false;
  const int64_t pixels = p.shape.out[1] * p.shape.out[2], product = p.shape.C * p.shape.K;
  const bool fp32 = p.precision == Precision::FP32;
  const bool wide_enough = 2 * p.shape.K >= p.shape.C;
  const bool engine_wins = wide_enough &&
                           ((pixels < kGradWeightTinyPixels && product >= (fp32 ? 4096 : 9216)) ||
                            (pixels < kGradWeightSmallPixels && product >= (fp32 ? 9216 : 36864)));
  const bool shifted_wins = wide_enough && product >= kShiftedMinProduct &&
                            (fp32 || (pixels < kGradWeightSmallPixels &&
                                      p.shape.N * pixels <= kShiftedTf32MaxBatchPixels));
  if (engine_wins && engine_tma()) return false;
  return !(shifted_wins && engine_shifted());
}

// ---- tiny problems: the direct FFMA kernels ----
// A pass of a few MFLOPs (a small model's layers: the cnn example's at batch 8 to 32) is all
// launch, fill and epilogue for the tensor-core rows; the direct kernels' one pass of FMAs
// finishes first. dev/tiny_conv_probe.cu (H200, ms, the direct kernels against the row taken
// before): grad-input of 16 -> 32 3x3 s2 at 16x16, batch 8: 0.017 against the engine's 0.051
// (TF32) / 0.065 (FP32), batch 32: 0.028 against 0.054; 1 -> 16 at 16x16: 0.013 against
// 0.017-0.030; 3 -> 16 at 32x32, batch 32: 0.019 against 0.031-0.039; 64 -> 64 at 8x8, batch 16
// (75 MFLOP): FP32 0.028 against 0.047, but TF32 0.028 against the 3x3 kernels' 0.024. Strided
// forwards: 0.017-0.018 against the engine's 0.019-0.025 (stride-1 ones have the 3x3 kernels:
// 32 -> 32 at 8x8 0.017 against 0.022). Grad-weight only under a MFLOP (1 -> 16 at 16x16, batch
// 8: 0.011 against 0.019; at batch 32, 2.4 MFLOP, the 3x3 kernels win: 0.021 against 0.029): each
// thread reduces over every pixel. Measured on kernels wider than 1x1 only; 1x1 stays put.
constexpr double kTinyForwardFlops = 1 << 25, kTinyGradInputFlopsTf32 = 1 << 25;
constexpr double kTinyGradInputFlopsFp32 = 1 << 26, kTinyGradWeightFlops = 1 << 20;
bool direct_wins_tiny(const ConvProblem& p) {
  const ConvShape& s = p.shape;
  if (p.dtype != DType::f32 || s.kernel_volume() == 1) return false;
  const double flops = 2.0 * double(s.N) * double(s.out_volume()) * double(s.K) * double(s.C) *
                       double(s.kernel_volume());
  switch (p.pass) {
    case ConvPass::Forward:
      return (s.stride[0] > 1 || s.stride[1] > 1 || s.stride[2] > 1) && flops <= kTinyForwardFlops;
    case ConvPass::GradInput:
      return flops <= (p.precision == Precision::FP32 ? kTinyGradInputFlopsFp32 : kTinyGradInputFlopsTf32);
    case ConvPass::GradWeight: return flops <= kTinyGradWeightFlops;
  }
  return false;
}

// ---- the rows ----

bool pointwise_can_implement(const ConvProblem& p, const ConvOperands&) { return conv1x1_applies(p.shape, p.dtype); }
// On Hopper the channels-first forward and grad-input run on the 1x1 TMA kernels at any channel
// count (past 64 reduction channels with the weight streamed beside the input:
// conv1x1/fprop_streamed_sm90.cu), reading the input where it lies, where the engine transposes
// it first. dev/pointwise_nchw_probe.cu (H200, 64 .. 2048 channels, 14x14 .. 64x64 images at
// ~64K pixels): 0.3-0.6 of the engine's time at TF32 (384 -> 96 at 32x32 0.017 ms against 0.042;
// 1024 -> 256 at 14x14 0.024 against 0.054) and 0.4-0.6 at FP32; closest at 512 -> 2048 on 14x14
// images (TF32 forward 0.77 against 0.72, the one row it loses, by 7%; its tiles cover 196 pixels
// with 256). Images of 64 pixels or fewer keep the rule above: the 1x1 tiles never straddle two
// images, so most of each 128-pixel tile would be empty (7x7: 2-18x the engine's time).
bool pointwise_streams_channels_first(const ConvProblem& p, const ConvOperands& o) {
  const ConvShape& s = p.shape;
  if (p.pass == ConvPass::GradWeight || s.channels_last() || tiny_channels_first_images(s)) return false;
  const bool grad_input = p.pass == ConvPass::GradInput;
  return conv1x1_runs_on_tma(o.out, grad_input ? o.dy : o.x, s, grad_input);
}

bool pointwise_preferred(const ConvProblem& p, const ConvOperands& o) {
  if (pointwise_streams_channels_first(p, o)) return true;
  if (!pointwise_claims(p.shape, p.dtype)) return false;
  if (!engine_beats_pointwise(p.shape, p.pass, p.precision)) return true;
  const EnginePolicy& engine = kernel_policy().engine;
  switch (p.pass) {
    case ConvPass::Forward: return !engine_conv_forward_uses_tma(p.shape, o.x, p.precision, engine);
    case ConvPass::GradInput: return !engine_conv_grad_input_uses_tma(p.shape, o.dy, p.precision, engine);
    case ConvPass::GradWeight: return !engine_conv_grad_weight_uses_tma(p.shape, o.out, p.precision, engine);
  }
  return true;
}
void pointwise_run(const ConvProblem& p, const ConvOperands& o) {
  switch (p.pass) {
    case ConvPass::Forward: return conv1x1_forward(o.out, o.x, o.w, o.b, p.shape, p.precision);
    case ConvPass::GradInput: return conv1x1_grad_input(o.out, o.dy, o.w, p.shape, p.precision);
    case ConvPass::GradWeight: return conv1x1_grad_weight(o.out, o.dy, o.x, p.shape, p.precision);
  }
}

// FP32 grad-input of a first layer (8 or fewer input channels): the engine's columns pass beats
// the 3x3 kernels, whose tiles of dx channels are mostly empty. dev/first_layer_probe.cu (H200,
// ms, engine / 3x3 kernels): 3 -> 64 at 224x224 0.574 / 0.673, at 96x96 0.122 / 0.148, 3 -> 32
// at 64x64 0.156 / 0.213, 4 -> 128 0.095 / 0.188, 8 -> 64 0.079 / 0.102; level at 3 -> 64 at
// 128x128 (0.203 / 0.199); lost at 3 -> 32 on 224x224 images (0.440 / 0.371): with 32 or fewer
// output channels the 3x3 kernels keep images past 64x64. At TF32 the 3x3 kernels win or tie
// but at 4 -> 128 (0.088 / 0.114) and stay.
constexpr int64_t kFirstLayerMaxChannels = 8, kFirstLayerWideK = 64, kFirstLayerSmallImage = 64 * 64;
bool first_layer_grad_input_to_engine(const ConvProblem& p, const ConvOperands& o) {
  const ConvShape& s = p.shape;
  return p.pass == ConvPass::GradInput && p.precision == Precision::FP32 && s.C <= kFirstLayerMaxChannels &&
         (s.K >= kFirstLayerWideK || s.out_volume() <= kFirstLayerSmallImage) && o.out.defined() &&
         device_runs_wgmma(o.out.device().index);
}

bool conv3x3_can_implement(const ConvProblem& p, const ConvOperands&) {
  return p.dtype == DType::f32 && conv3x3_applies(p.shape, p.precision);
}
bool conv3x3_preferred(const ConvProblem& p, const ConvOperands& o) {
  if (direct_wins_tiny(p) || first_layer_grad_input_to_engine(p, o)) return false;
  const EnginePolicy& engine = kernel_policy().engine;
  switch (p.pass) {
    case ConvPass::Forward:
      return conv3x3_claims_data_pass(p, [&] { return engine_conv_forward_uses_tma(p.shape, o.x, p.precision, engine); });
    case ConvPass::GradInput:
      return conv3x3_claims_data_pass(p,
                                      [&] { return engine_conv_grad_input_uses_tma(p.shape, o.dy, p.precision, engine); });
    case ConvPass::GradWeight:
      return conv3x3_claims_grad_weight(
          p, [&] { return engine_conv_grad_weight_uses_tma(p.shape, o.out, p.precision, engine); },
          [&] { return engine_conv_grad_weight_uses_shifted_rows(p.shape, o.out, p.precision, false, engine); });
  }
  return false;
}
void conv3x3_run(const ConvProblem& p, const ConvOperands& o) {
  switch (p.pass) {
    case ConvPass::Forward: return conv3x3_forward(o.out, o.x, o.w, o.b, p.shape, p.precision);
    case ConvPass::GradInput: return conv3x3_grad_input(o.out, o.dy, o.w, p.shape, p.precision);
    case ConvPass::GradWeight: return conv3x3_grad_weight(o.out, o.dy, o.x, p.shape, p.precision);
  }
}

// ---- few taps: the FMA forward against the tensor-core rows ----
// A first layer (1-4 input channels, a kernel wider than 1x1) reduces each output over C kvol
// <= kFewMaxTaps values: the tensor-core tiles spend more on filling and writing than on their
// short k-loop. dev/first_layer_probe.cu (H200, TF32 / FP32 alike unless given): the FMA kernel
// takes 0.34-0.93 of the best tensor-core row's time on stems and volumes (7x7 s2 3 -> 64 at
// 224x224: 0.180 ms against the engine's 0.195 TF32 and 0.258 FP32; 3x3x3 1 -> 32 at 64^3: 0.063
// against 0.193; 3x3 3 -> 32 at 64x64: 0.036 against the 3x3 kernels' 0.084; channels-last 3x3
// 3 -> 64: 0.028 against 0.043), level at 4 -> 128 (0.044-0.046). Its pace is set by the shared
// memory reads of the weights (one per 4 FMAs), so on large images the 3x3 kernels, bound by
// the output's bytes, win: 3 -> 64 at 224x224 0.083 ms TF32 / 0.158 FP32 against 0.191. Those
// stay with them from 128x128 pixels (between the 64x64 and 224x224 points measured). With 8+
// input channels the tensor-core rows win (3x3 8 -> 64 at 64x64: 0.029 against 0.051).
constexpr int64_t kFewMaxInputChannels = 4, kFewMaxPixelsBeside3x3 = 128 * 128;
bool few_channels_can_implement(const ConvProblem& p, const ConvOperands&) {
  return p.dtype == DType::f32 && p.pass == ConvPass::Forward && few_channels_forward_applies(p.shape);
}
bool few_channels_preferred(const ConvProblem& p, const ConvOperands& o) {
  if (!few_channels_can_implement(p, o) || p.shape.C > kFewMaxInputChannels || p.shape.kernel_volume() == 1)
    return false;
  return p.shape.out_volume() < kFewMaxPixelsBeside3x3 || !conv3x3_applies(p.shape, p.precision);
}
void few_channels_run(const ConvProblem& p, const ConvOperands& o) {
  few_channels_conv_forward(o.out, o.x, o.w, o.b, p.shape);
}

bool engine_can_implement(const ConvProblem& p, const ConvOperands&) {
  return engine_conv_can_implement(p.shape, p.dtype);
}
// Everything it implements but the tiny problems (unless the policy asks for the engine path).
bool engine_preferred(const ConvProblem& p, const ConvOperands& o) {
  return engine_can_implement(p, o) && (kernel_policy().conv == KernelPath::Engine || !direct_wins_tiny(p));
}
void engine_run(const ConvProblem& p, const ConvOperands& o) {
  const EnginePolicy& engine = kernel_policy().engine;
  switch (p.pass) {
    case ConvPass::Forward: return engine_conv_forward(o.out, o.x, o.w, o.b, p.shape, p.precision, engine);
    case ConvPass::GradInput: return engine_conv_grad_input(o.out, o.dy, o.w, p.shape, p.precision, engine);
    case ConvPass::GradWeight: return engine_conv_grad_weight(o.out, o.dy, o.x, p.shape, p.precision, engine);
  }
}

bool always(const ConvProblem&, const ConvOperands&) { return true; }
void direct_run(const ConvProblem& p, const ConvOperands& o) {
  switch (p.pass) {
    case ConvPass::Forward: return direct_conv_forward(o.out, o.x, o.w, o.b, p.shape);
    case ConvPass::GradInput: return direct_conv_grad_input(o.out, o.dy, o.w, p.shape);
    case ConvPass::GradWeight: return direct_conv_grad_weight(o.out, o.dy, o.x, p.shape);
  }
}

constexpr std::array<ConvVariant, 5> kVariants{{
    {"pointwise", "sm_80+ (TMA forward on sm_90a)", true, pointwise_can_implement, pointwise_preferred, pointwise_run},
    {"few_channels", "every GPU", true, few_channels_can_implement, few_channels_preferred, few_channels_run},
    {"conv3x3", "sm_80+ (wgmma on sm_90a)", true, conv3x3_can_implement, conv3x3_preferred, conv3x3_run},
    {"engine", "sm_80+ (wgmma and TMA on sm_90a)", false, engine_can_implement, engine_preferred, engine_run},
    {"direct", "every GPU", false, always, always, direct_run},
}};

const char* pass_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::Forward: return "conv_forward";
    case ConvPass::GradInput: return "conv_grad_input";
    case ConvPass::GradWeight: return "conv_grad_weight";
  }
  return "conv";
}

void run_pass(const ConvProblem& problem, const ConvOperands& operands) {
  if (operands.out.numel() == 0) return;
  choose_conv_variant(problem, operands).run(problem, operands);
}

}  // namespace

std::span<const ConvVariant> conv_variants() { return kVariants; }

ConvProblem conv_problem(const ConvShape& s, DType dtype, ConvPass pass, Precision precision) {
  return ConvProblem{.shape = s, .dtype = dtype, .precision = precision, .pass = pass};
}

const ConvVariant& choose_conv_variant(const ConvProblem& problem, const ConvOperands& operands) {
  const KernelPolicy& policy = kernel_policy();
  return choose_variant(conv_variants(), policy.conv_variant, policy.conv, problem, operands, pass_name(problem.pass),
                        "convolution", [&] {
                          return detail::concat("x ", problem.shape.x_shape(), ", w ", problem.shape.w_shape(), ", ",
                                                dtype_name(problem.dtype));
                        });
}

void conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                  Precision precision) {
  run_pass(conv_problem(s, y.dtype(), ConvPass::Forward, precision), {.out = y, .x = x, .w = w, .b = b});
}

namespace {

// The bf16 passes take bf16 tensors only (out and every operand named, or undefined ones).
void check_bf16(const char* op, const Tensor& out, std::initializer_list<const Tensor*> operands) {
  bool ok = out.dtype() == DType::bf16;
  std::string got;
  for (const Tensor* t : operands) {
    ok = ok && (!t->defined() || t->dtype() == DType::bf16);
    if (t->defined()) got += (got.empty() ? "" : ", ") + describe(*t);
  }
  TG_CHECK_AS(DTypeError, ok, op, ": wants bf16 tensors; got ", got, " -> ", describe(out));
}

}  // namespace

bool conv_bf16_can_implement(const ConvShape& s) { return engine_conv_can_implement(s, DType::f32); }

void conv_forward_bf16(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s) {
  check_bf16("conv_forward_bf16", y, {&x, &w, &b});
  Tensor bias;
  if (b.defined()) {
    bias = Tensor::empty(b.shape(), {.dtype = DType::f32, .device = b.device()});
    cast(bias, b);  // exact
  }
  engine_conv_forward_bf16(y, x, w, bias, s, kernel_policy().engine);
}

void conv_grad_input_bf16(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s) {
  check_bf16("conv_grad_input_bf16", dx, {&dy, &w});
  engine_conv_grad_input_bf16(dx, dy, w, s, kernel_policy().engine);
}

// The engine's bf16 grad-weight writes the input's columns (C kvol rows over every output
// pixel) before its product. The 3x3 kernels read x in place: where the f32 table sends the TF32
// grad-weight to them, their pass on f32 copies of dy and x costs less than the bf16 columns
// (dev/bf16_model_passes_probe.cu, H200, the ResNet-style model at batch 64: 64 channels at
// 64x64 0.23 ms against 0.65, 128 at 32x32 0.19 against 0.34); where the table keeps the engine
// (256 channels at 16x16, 512 at 8x8, strides 2, 1x1) the bf16 columns win (0.20 against 0.26,
// 0.15 against 0.19, 0.06-0.20 against 0.07-0.27), and so do they where the columns are narrow
// (C kvol <= 64: the RGB stem 3 -> 64 at 64x64, 0.11 against 0.13). The products are the same:
// bf16 values are exact in TF32. A policy that forces a row by name forces it here too.
constexpr int64_t kNarrowBf16Columns = 64;
namespace {
bool grad_weight_on_f32_copies(const ConvShape& s, const Tensor& dw32) {
  static_assert(kVariants[2].name == "conv3x3");
  const ConvVariant& conv3x3 = kVariants[2];
  if (const std::string_view forced = kernel_policy().conv_variant; !forced.empty()) return forced == conv3x3.name;
  if (s.C * s.kernel_volume() <= kNarrowBf16Columns) return false;
  const ConvProblem tf32 = conv_problem(s, DType::f32, ConvPass::GradWeight, Precision::TF32);
  return &choose_conv_variant(tf32, {.out = dw32}) == &conv3x3;
}
}  // namespace

bool conv_grad_weight_bf16_on_f32_copies(const ConvShape& s, const Device& device) {
  return grad_weight_on_f32_copies(s, Tensor::empty(s.w_shape(), {.dtype = DType::f32, .device = device}));
}

// The grad-weight's kernels write f32 (a weight-sized scratch), rounded once into dw.
void conv_grad_weight_bf16(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s) {
  check_bf16("conv_grad_weight_bf16", dw, {&dy, &x});
  Tensor dw32 = Tensor::empty(dw.shape(), {.dtype = DType::f32, .device = dw.device()});
  if (grad_weight_on_f32_copies(s, dw32))
    conv_grad_weight(dw32, engine::widened(dy), engine::widened(x), s, Precision::TF32);
  else
    engine_conv_grad_weight_bf16(dw32, dy, x, s, kernel_policy().engine);
  cast(dw, dw32);
}

void conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s, Precision precision) {
  run_pass(conv_problem(s, dx.dtype(), ConvPass::GradInput, precision), {.out = dx, .w = w, .dy = dy});
}

void conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s, Precision precision) {
  run_pass(conv_problem(s, dw.dtype(), ConvPass::GradWeight, precision), {.out = dw, .x = x, .dy = dy});
}

void conv_grad_input_weight(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                            const ConvShape& s) {
  // The 1x1 kernels read dy once for both gradients: taken wherever the table would send both
  // passes to them.
  const ConvProblem gi = conv_problem(s, dx.dtype(), ConvPass::GradInput);
  const ConvProblem gw = conv_problem(s, dw.dtype(), ConvPass::GradWeight);
  const ConvOperands gi_ops{.out = dx, .w = w, .dy = dy}, gw_ops{.out = dw, .x = x, .dy = dy};
  static_assert(kVariants[0].name == "pointwise");
  const ConvVariant& pointwise = kVariants[0];
  if (dx.numel() > 0 && dw.numel() > 0 && &choose_conv_variant(gi, gi_ops) == &pointwise &&
      &choose_conv_variant(gw, gw_ops) == &pointwise)
    return conv1x1_backward(dx, dw, dy, x, w, s, gi.precision);
  run_pass(gi, gi_ops);
  run_pass(gw, gw_ops);
}

}  // namespace tg::cuda
