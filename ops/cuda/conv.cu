// The CUDA convolution dispatcher: the ordered table of conv_variants.h and the launchers of
// conv.h that walk it. Rows: the 1x1 kernels (ops/cuda/conv1x1/) and the 3x3 kernels
// (ops/cuda/conv3x3/) for the shapes where they were measured fastest, then the implicit-GEMM
// engine (ops/cuda/gemm/), then the direct FFMA kernels (conv_direct.cu), which implement
// everything. KernelPolicy (policy.h) can skip the specialised rows, force the direct kernels,
// or force one row by name.
#include <array>

#include "core/error.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv1x1/conv1x1.h"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv_direct.h"
#include "ops/cuda/conv_variants.h"
#include "ops/cuda/policy.h"

namespace tg::cuda {
namespace {

// The 1x1 kernels keep a block of weights resident and re-read their output once per 128
// reduction channels: past 512 channels the engine's tiles are faster (H200, 1024 -> 256
// channels at 14x14: FP32 forward 0.38 ms against 0.17 on the engine, fwd+bwd 0.88 against 0.63).
constexpr int64_t kPointwiseMaxChannels = 512;
bool pointwise_claims(const ConvShape& s, DType dtype) {
  return conv1x1_applies(s, dtype) && s.C <= kPointwiseMaxChannels && s.K <= kPointwiseMaxChannels;
}
// Past 64 input channels the forward runs one launch per 128 of them and per 64 output
// channels (re-reading its output per reduction group, its input per channel block); past 128
// input channels the engine's product is faster (H100, 384 -> 96 channels at 32x32: NCHW TF32 0.074 -> 0.068 ms, FP32 0.083 -> 0.066;
// NHWC TF32 0.087 -> 0.043, FP32 0.095 -> 0.049), at 96 it is not (96 -> 384: 0.058 against
// 0.063). The fused backward reads dy once and stays.
constexpr int64_t kPointwiseForwardMaxChannels = 128;
bool pointwise_claims_forward(const ConvShape& s, DType dtype) {
  return pointwise_claims(s, dtype) && (s.C <= kPointwiseForwardMaxChannels || !engine_conv_can_implement(s, dtype));
}
// The 3x3 kernels tile the image; on small images most of each tile is wasted and the engine's
// (pixels x channels) tiles are faster at TF32: its mma.sync kernel under 512 output pixels
// (H200 forward, 384 channels at 16x16: 0.34 ms against 0.44), its TMA kernel (Hopper, 16+
// channels) under 4096 (192 channels at 32x32: 0.14 against 0.24; at 64x64 with 96 channels
// the 3x3 kernels win, 0.19 against 0.22). Grad-input runs the same kernels on the same image
// size (`engine_tma`: the engine would run this pass on its TMA kernel). FP32 mode measured
// level on small images and stays.
constexpr int64_t kConv3x3MinPixelsTf32 = 512, kConv3x3MinPixelsTf32Tma = 4096;
// `engine_tma()` is asked only for the images whose routing depends on it.
template <class EngineTma>
bool conv3x3_claims_data_pass(const ConvProblem& p, EngineTma&& engine_tma) {
  if (p.dtype != DType::f32 || !conv3x3_applies(p.shape, p.precision)) return false;
  const int64_t pixels = p.shape.out[1] * p.shape.out[2];
  if (p.precision != Precision::TF32 || pixels >= kConv3x3MinPixelsTf32Tma) return true;
  return pixels >= kConv3x3MinPixelsTf32 && !engine_tma();
}

// Grad-weight stays on the 3x3 kernels except on images under 512 output pixels with 160+
// output channels, where the engine runs it on its TMA product (TF32, Hopper): H200, forward +
// backward, 384 channels at 16x16 0.53 -> 0.49 ms, 512 at 8x8 0.57 -> 0.40; at 32x32 the 3x3
// kernel wins (192 channels: 0.43 against 0.64). Fewer channels were not measured against the
// 3x3 kernels and stay there.
constexpr int64_t kConv3x3GradWeightMinPixelsTma = 512, kConv3x3GradWeightMinChannelsTma = 160;
template <class EngineTma>
bool conv3x3_claims_grad_weight(const ConvProblem& p, EngineTma&& engine_tma) {
  if (p.dtype != DType::f32 || !conv3x3_applies(p.shape, p.precision)) return false;
  return p.precision != Precision::TF32 || p.shape.out[1] * p.shape.out[2] >= kConv3x3GradWeightMinPixelsTma ||
         p.shape.K < kConv3x3GradWeightMinChannelsTma || !engine_tma();
}


// ---- the rows ----

bool pointwise_can_implement(const ConvProblem& p, const ConvOperands&) { return conv1x1_applies(p.shape, p.dtype); }
bool pointwise_preferred(const ConvProblem& p, const ConvOperands&) {
  return p.pass == ConvPass::Forward ? pointwise_claims_forward(p.shape, p.dtype) : pointwise_claims(p.shape, p.dtype);
}
void pointwise_run(const ConvProblem& p, const ConvOperands& o) {
  switch (p.pass) {
    case ConvPass::Forward: return conv1x1_forward(o.out, o.x, o.w, o.b, p.shape, p.precision);
    case ConvPass::GradInput: return conv1x1_grad_input(o.out, o.dy, o.w, p.shape, p.precision);
    case ConvPass::GradWeight: return conv1x1_grad_weight(o.out, o.dy, o.x, p.shape, p.precision);
  }
}

bool conv3x3_can_implement(const ConvProblem& p, const ConvOperands&) {
  return p.dtype == DType::f32 && conv3x3_applies(p.shape, p.precision);
}
bool conv3x3_preferred(const ConvProblem& p, const ConvOperands& o) {
  const EnginePolicy& engine = kernel_policy().engine;
  switch (p.pass) {
    case ConvPass::Forward:
      return conv3x3_claims_data_pass(p, [&] { return engine_conv_forward_uses_tma(p.shape, o.x, p.precision, engine); });
    case ConvPass::GradInput:
      return conv3x3_claims_data_pass(p,
                                      [&] { return engine_conv_grad_input_uses_tma(p.shape, o.dy, p.precision, engine); });
    case ConvPass::GradWeight:
      return conv3x3_claims_grad_weight(
          p, [&] { return engine_conv_grad_weight_uses_tma(p.shape, o.out, p.precision, engine); });
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

bool engine_can_implement(const ConvProblem& p, const ConvOperands&) {
  return engine_conv_can_implement(p.shape, p.dtype);
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

constexpr std::array<ConvVariant, 4> kVariants{{
    {"pointwise", "sm_80+ (TMA forward on sm_90a)", true, pointwise_can_implement, pointwise_preferred, pointwise_run},
    {"conv3x3", "sm_80+ (wgmma on sm_90a)", true, conv3x3_can_implement, conv3x3_preferred, conv3x3_run},
    {"engine", "sm_80+ (wgmma and TMA on sm_90a)", false, engine_can_implement, engine_can_implement, engine_run},
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
  const ConvVariant& pointwise = kVariants[0];
  if (dx.numel() > 0 && dw.numel() > 0 && &choose_conv_variant(gi, gi_ops) == &pointwise &&
      &choose_conv_variant(gw, gw_ops) == &pointwise)
    return conv1x1_backward(dx, dw, dy, x, w, s, gi.precision);
  run_pass(gi, gi_ops);
  run_pass(gw, gw_ops);
}

}  // namespace tg::cuda
