// The engine's public entry points (engine.h): problem checks, weight packing, and the
// per-role launches; planning (tiles, splits, the split reduction) is in planning.cu.
// Design note: docs/kernels/gemm.md.
#include "ops/cuda/gemm/engine.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/cuda_context.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/gemm/planning.h"

namespace tg::cuda {
namespace {

using engine::ConvGeometry;
using engine::DimPhase;
using engine::MainloopArgs;
using engine::OutputMap;
using engine::PhaseGeometry;
using engine::PhaseTaps;
using engine::Plan;
using engine::for_each_phase;
using engine::fits;
using engine::geometry;
using engine::kCoordinateLimit;
using engine::kThreads;
using engine::make_plan;
using engine::output_map;
using engine::phase_geometry;
using engine::phase_taps;


// packed[k][t * C + c] = w[k][c][t]: the forward's B, reduction in the order its gather uses.
__global__ void pack_forward_weights_kernel(float* __restrict__ packed, const float* __restrict__ w, int64_t K,
                                            int64_t C, int64_t kvol) {
  const int64_t total = K * C * kvol;
  TG_GRID_STRIDE(e, total) {
    const int64_t t = e % kvol, c = (e / kvol) % C, k = e / (kvol * C);
    packed[(k * kvol + t) * C + c] = w[e];
  }
}

Tensor pack_forward_weights(const Tensor& w, const ConvShape& s) {
  const int64_t kvol = s.kernel_volume();
  if (kvol == 1 || s.C == 1) return w;  // already (K, kvol*C) in that order
  Tensor packed = Tensor::empty({w.numel()}, {.dtype = DType::f32, .device = w.device()});
  const int dev = w.device().index;
  pack_forward_weights_kernel<<<grid_for(w.numel(), kThreads), kThreads, 0, stream(dev)>>>(
      packed.data<float>(), w.data<float>(), s.K, s.C, kvol);
  TG_LAUNCH_CHECK();
  return packed;
}


// packed[c][idx * K + k] = w[k][c][tap(idx)]: one phase's weights as its GEMM's B.
__global__ void pack_phase_weights_kernel(float* __restrict__ packed, const float* __restrict__ w, int64_t K,
                                          int64_t C, PhaseTaps pt) {
  const int64_t tap_volume = int64_t(pt.taps[0]) * pt.taps[1] * pt.taps[2];
  const int64_t kvol = int64_t(pt.kernel[0]) * pt.kernel[1] * pt.kernel[2];
  const int64_t total = C * tap_volume * K;
  TG_GRID_STRIDE(e, total) {
    const int64_t k = e % K, idx = (e / K) % tap_volume, c = e / (K * tap_volume);
    packed[e] = w[(k * C + c) * kvol + pt.kernel_tap</*kReversed=*/false>(idx)];
  }
}

// The TMA matmul kernel takes a TF32 product on Hopper where the reduction is long or there
// are tiles for two blocks per SM (the policy's arch 80 / 90 aside); `blocks_per_sm` is how many
// of its 128-wide blocks would share an SM.
constexpr int64_t kTmaMinReduction = 2048;
// The precisions whose products the TMA kernel runs (matrix and convolution producers alike):
// TF32, and FP32 (split TF32) unless policy.fp32_tma says never.
bool tma_precision(Precision precision, const EnginePolicy& policy) {
  return precision == Precision::TF32 || (precision == Precision::FP32 && policy.fp32_tma >= 0);
}

struct TmaMatmulChoice {
  bool pays;
  int blocks_per_sm;
};
TmaMatmulChoice tma_matmul_choice(const GemmProblem& p, int dev, const EnginePolicy& policy) {
  const int64_t tiles = ((p.M + 127) / 128) * ((p.N + 127) / 128);
  const int blocks = engine::tma_blocks_per_sm(128, tiles, sm_count(dev), policy);
  return {p.K >= kTmaMinReduction || blocks == 2, blocks};
}

// The TMA convolution passes run at TF32, and at FP32 (split TF32) unless policy.fp32_tma says
// never, unless the policy asks for the mma.sync kernels (arch 80) or a tile the TMA kernel
// lacks (64, 16).
bool tma_conv_allowed(Precision precision, const EnginePolicy& policy) {
  const bool tile = policy.tile == 0 || policy.tile == 128 || policy.tile == 256;
  return tma_precision(precision, policy) && policy.arch != 80 && tile;
}

// Whether engine_gemm transposes the operands stored with the reduction strided, so that the
// TMA kernel serves the product: TF32 on Hopper, a reduction of whole 16-byte rows, a product
// the TMA kernel would take, and at least 64 FLOPs per byte the transposes move (each reads
// and writes its matrix once; Linear's backward at 4096^3: ~0.1 ms of transposes against
// ~0.7 ms of product). Policy arch 90 asks for them wherever they are possible.
bool transposes_pay(const GemmProblem& p, bool a_k, bool b_k, Precision precision, const EnginePolicy& policy,
                    int dev) {
  if (!tma_precision(precision, policy) || (a_k && b_k) || policy.arch == 80 || !device_runs_wgmma(dev)) return false;
  if (p.K < 4 || p.K % 4 != 0 || (p.K + 31) / 32 > 65535) return false;
  if (policy.arch == 90) return true;
  const double moved = 8.0 * double((a_k ? 0 : p.M * p.K) + (b_k ? 0 : p.N * p.K));
  // FP32 too needs the TF32 rule's size (a long reduction or tiles for two blocks per SM): a
  // product too small for 128x128 tiles would pay the transposes and run elsewhere.
  return tma_matmul_choice(p, dev, policy).pays && 2.0 * double(p.M) * double(p.N) * double(p.K) >= 64.0 * moved;
}

}  // namespace

bool engine_conv_can_implement(const ConvShape& s, DType dtype) {
  if (dtype != DType::f32) return false;
  const int64_t kvol = s.kernel_volume();
  if (!(fits(s.N * s.out_volume()) && fits(s.N * s.in_volume()) && fits(s.C * kvol) && fits(s.K * kvol))) return false;
  for (int d = 0; d < 3; ++d) {
    if (s.in[d] + 2 * s.pad[d] >= kCoordinateLimit) return false;
    if (s.dilation[d] * (s.kernel[d] - 1) >= kCoordinateLimit) return false;
    if (s.stride[d] >= kCoordinateLimit) return false;
  }
  return s.N >= 1 && s.C >= 1 && s.K >= 1;
}

bool engine_gemm_can_implement(const GemmProblem& p, DType dtype) {
  return dtype == DType::f32 && fits(p.M) && fits(p.N) && fits(p.K) && p.M >= 1 && p.N >= 1;
}

bool engine_conv_forward_uses_tma(const ConvShape& s, const Tensor& x, Precision precision,
                                  const EnginePolicy& policy) {
  return tma_conv_allowed(precision, policy) && x.dtype() == DType::f32 && x.device().is_cuda() &&
         engine_conv_can_implement(s, DType::f32) &&
         engine::conv_fprop_tma_applies(s, x.data<float>(), x.device().index, policy, precision);
}

bool engine_conv_grad_input_uses_tma(const ConvShape& s, const Tensor& dy, Precision precision,
                                     const EnginePolicy& policy) {
  if (engine::columns_pay(s) || !engine_conv_can_implement(s, DType::f32)) return false;
  ConvShape forward;
  if (engine::grad_input_as_forward(s, forward)) return engine_conv_forward_uses_tma(forward, dy, precision, policy);
  return tma_conv_allowed(precision, policy) && dy.dtype() == DType::f32 && dy.device().is_cuda() &&
         engine::conv_dgrad_phases_tma_applies(s, dy.data<float>(), dy.device().index);
}

// The columns' output-channel thresholds were measured against the cp.async kernels at TF32;
// FP32 keeps them (its three products per step weigh the columns' copy less).
bool engine_conv_grad_weight_uses_tma(const ConvShape& s, const Tensor& dw, Precision precision,
                                      const EnginePolicy& policy) {
  return tma_conv_allowed(precision, policy) && dw.dtype() == DType::f32 && dw.device().is_cuda() &&
         engine_conv_can_implement(s, DType::f32) && engine::conv_wgrad_tma_applies(s, dw.device().index, policy);
}

bool engine_conv_grad_weight_uses_shifted_rows(const ConvShape& s, const Tensor& dw, Precision precision,
                                               bool bf16_operands, const EnginePolicy& policy) {
  const bool tma = bf16_operands ? engine_conv_grad_weight_bf16_uses_tma(s, dw, policy)
                                 : engine_conv_grad_weight_uses_tma(s, dw, precision, policy);
  return tma && engine::conv_wgrad_shifted_applies(s, dw.device().index, policy, bf16_operands);
}

void engine_conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                         Precision precision, const EnginePolicy& policy) {
  TG_CHECK(engine_conv_can_implement(s, y.dtype()), "engine_conv_forward: problem x ", s.x_shape(), ", w ",
           s.w_shape(), " (", dtype_name(y.dtype()), ") is outside the engine's limits");
  const int dev = y.device().index;
  set_device(dev);
  if (engine_conv_forward_uses_tma(s, x, precision, policy))
    return engine::conv_fprop_tma(y, x, w, b, s, precision, policy);
  const ConvGeometry g = geometry(s);
  const int64_t M = s.N * s.out_volume(), N = s.K, red = s.C * s.kernel_volume();
  const Tensor packed = pack_forward_weights(w, s);
  MainloopArgs args{};
  args.M = int32_t(M);
  args.N = int32_t(N);
  args.red = int32_t(red);
  args.out = output_map(y.data<float>(), b.defined() ? b.data<float>() : nullptr, M, N);
  if (!s.channels_last()) {
    args.out.mode = OutputMap::kChannelsFirst;
    args.out.div = FastDivmod(uint32_t(s.out_volume()));
  }
  const Plan plan = make_plan(M, N, red, dev, policy, /*narrow_ok=*/true, precision, /*gather=*/true);
  engine::run_plan(plan, args, y.device(), [&](const MainloopArgs& a, cudaStream_t st) {
    engine::launch_conv_fprop(g, s.channels_last(), x.data<float>(), packed.data<float>(), plan, a,
                              precision == Precision::FP32, st);
  });
}

void engine_conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                            Precision precision, const EnginePolicy& policy) {
  TG_CHECK(engine_conv_can_implement(s, dx.dtype()), "engine_conv_grad_input: problem x ", s.x_shape(), ", w ",
           s.w_shape(), " (", dtype_name(dx.dtype()), ") is outside the engine's limits");
  const int dev = dx.device().index;
  set_device(dev);
  if (engine::columns_pay(s)) return engine::grad_input_by_columns(dx, dy, w, s, precision, policy);
  // On the TMA kernel: stride 1 as one forward of dy (weights transposed and flipped), strided
  // phase by phase, each phase a stride-1 forward over dy.
  if (engine_conv_grad_input_uses_tma(s, dy, precision, policy)) {
    ConvShape forward;
    if (engine::grad_input_as_forward(s, forward))
      return engine::conv_fprop_tma(dx, dy, w, Tensor(), forward, precision, policy, /*flipped=*/true);
    return engine::conv_dgrad_phases_tma(dx, dy, w, s, precision, policy);
  }
  cudaStream_t st = stream(dev);
  const ConvGeometry g = geometry(s);
  const bool unit_stride = s.stride[0] == 1 && s.stride[1] == 1 && s.stride[2] == 1;
  // Every tap belongs to exactly one phase per dim: the phases' packed weights fill w's size.
  const Tensor packed = Tensor::empty({w.numel()}, {.dtype = DType::f32, .device = w.device()});
  int64_t packed_offset = 0;
  for_each_phase(s, [&](const DimPhase (&dims)[3]) {
    const PhaseGeometry ph = phase_geometry(dims);
    const int64_t rows = s.N * int64_t(ph.count[0]) * ph.count[1] * ph.count[2];
    if (rows == 0) return;
    const int64_t red = int64_t(ph.tap_volume) * s.K;  // 0: these pixels get no gradient
    float* phase_w = packed.data<float>() + packed_offset;
    if (red > 0) {
      pack_phase_weights_kernel<<<grid_for(s.C * red, kThreads), kThreads, 0, st>>>(phase_w, w.data<float>(), s.K,
                                                                                     s.C, phase_taps(s, dims));
      TG_LAUNCH_CHECK();
      packed_offset += s.C * red;
    }
    MainloopArgs args{};
    args.M = int32_t(rows);
    args.N = int32_t(s.C);
    args.red = int32_t(red);
    if (!unit_stride) {
      args.out = engine::phase_output_map(dx, s, ph);  // kPhase
    } else {
      args.out = output_map(dx.data<float>(), nullptr, rows, s.C);
      if (!s.channels_last()) {
        args.out.mode = OutputMap::kChannelsFirst;
        args.out.div = FastDivmod(uint32_t(s.in_volume()));
      }
    }
    const Plan plan = make_plan(rows, s.C, red, dev, policy, /*narrow_ok=*/true, precision, /*gather=*/true);
    engine::run_plan(plan, args, dx.device(), [&](const MainloopArgs& a, cudaStream_t stm) {
      engine::launch_conv_dgrad(g, ph, s.channels_last(), dy.data<float>(), phase_w, plan, a,
                                precision == Precision::FP32, stm);
    });
  });
}

void engine_conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                             Precision precision, const EnginePolicy& policy) {
  TG_CHECK(engine_conv_can_implement(s, dw.dtype()), "engine_conv_grad_weight: problem x ", s.x_shape(), ", w ",
           s.w_shape(), " (", dtype_name(dw.dtype()), ") is outside the engine's limits");
  const int dev = dw.device().index;
  set_device(dev);
  if (engine_conv_grad_weight_uses_tma(s, dw, precision, policy))
    return engine::conv_wgrad_tma(dw, dy, x, s, precision, policy);
  const ConvGeometry g = geometry(s);
  const int64_t M = s.K, N = s.C * s.kernel_volume(), red = s.N * s.out_volume();
  MainloopArgs args{};
  args.M = int32_t(M);
  args.N = int32_t(N);
  args.red = int32_t(red);
  args.out = output_map(dw.data<float>(), nullptr, M, N);
  if (s.channels_last() && s.kernel_volume() > 1) {
    args.out.mode = OutputMap::kWeightsChannelsLast;
    args.out.div = FastDivmod(uint32_t(s.C));
    args.out.kvol = int32_t(s.kernel_volume());
  }
  const Plan plan = make_plan(M, N, red, dev, policy, /*narrow_ok=*/false, precision, /*gather=*/true);
  engine::run_plan(plan, args, dw.device(), [&](const MainloopArgs& a, cudaStream_t st) {
    engine::launch_conv_wgrad(g, s.channels_last(), dy.data<float>(), x.data<float>(), plan, a,
                              precision == Precision::FP32, st);
  });
}

void engine_gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p,
                 Precision precision, const EnginePolicy& policy) {
  TG_CHECK(engine_gemm_can_implement(p, c.dtype()), "engine_gemm: ", p.M, " x ", p.N, " x ", p.K, " (",
           dtype_name(c.dtype()), ") is outside the engine's limits");
  const int dev = c.device().index;
  set_device(dev);
  MainloopArgs args{};
  args.M = int32_t(p.M);
  args.N = int32_t(p.N);
  args.red = int32_t(p.K);
  args.out = output_map(c.data<float>(), bias.defined() ? bias.data<float>() : nullptr, p.M, p.N);
  // a is (M, K) or, transposed, (K, M); b is (K, N) or, transposed, (N, K).
  bool a_k = !p.transA, b_k = p.transB;
  const float* a_data = a.data<float>();
  const float* b_data = b.data<float>();
  // The TMA kernel reads the reduction contiguous: an operand stored the other way (Linear's
  // backward) is transposed into scratch where that costs little against the product.
  Tensor a_scratch, b_scratch;
  if (transposes_pay(p, a_k, b_k, precision, policy, dev)) {
    cudaStream_t st = stream(dev);
    if (!a_k) {
      a_scratch = Tensor::empty({p.M * p.K}, {.dtype = DType::f32, .device = c.device()});
      engine::transpose_into(a_scratch.data<float>(), a_data, 1, p.K, p.M, p.K, st);
      a_data = a_scratch.data<float>();
      a_k = true;
    }
    if (!b_k) {
      b_scratch = Tensor::empty({p.N * p.K}, {.dtype = DType::f32, .device = c.device()});
      engine::transpose_into(b_scratch.data<float>(), b_data, 1, p.K, p.N, p.K, st);
      b_data = b_scratch.data<float>();
      b_k = true;
    }
  }
  const int64_t lda = a_k ? p.K : p.M, ldb = b_k ? p.K : p.N;
  Plan plan = make_plan(p.M, p.N, p.K, dev, policy, /*narrow_ok=*/b_k, precision, /*gather=*/false);
  // TF32 with both operands k-contiguous (Linear's forward) on 128x128 tiles, on Hopper: the TMA
  // kernel where the reduction is long (2048+) or there are tiles for two blocks per SM. On
  // short reductions a block's main loop is short and its epilogue, which nothing overlaps in a
  // one-block-per-SM kernel, costs more than the two-blocks-per-SM mma.sync kernel loses on
  // loading (docs/kernels/gemm.md); two TMA blocks per SM overlap it. arch 90 forces the TMA
  // kernel wherever it applies, arch 80 never.
  // FP32 (split TF32) runs there wherever it applies: three products per step leave the
  // epilogue a third of the weight it has at TF32; 128-wide tiles, one block per SM.
  const TmaMatmulChoice choice = tma_matmul_choice(p, dev, policy);
  const bool split = precision == Precision::FP32;
  const bool tma = tma_precision(precision, policy) && a_k && b_k && plan.shape == engine::TileShape::Big &&
                   (policy.arch == 90 || (policy.arch == 0 && (split || choice.pays))) &&
                   engine::matmul_tma_applies(a_data, b_data, p.K, dev);
  if (tma) {
    plan.tma_blocks_per_sm = split ? 1 : choice.blocks_per_sm;
    plan.tma_split = split;
  }
  // Its 128 x 256 tile moves a quarter fewer bytes per product; take it on long reductions where
  // it costs no waves: blocks of twice the work, counted in waves of one block per SM, no more
  // than the 128-wide tiles' (unsplit reductions only).
  if (tma && !split && p.N > 128) {
    if (policy.tile == 256 || (policy.tile == 0 && engine::wide_tma_tile_pays(plan, p.N, p.K, policy, dev))) {
      plan.tma_cols = 256;
      plan.tma_blocks_per_sm = 1;
      plan.tiles_n = int32_t((p.N + 255) / 256);
    }
  }
  engine::run_plan(plan, args, c.device(), [&](const MainloopArgs& ma, cudaStream_t st) {
    if (tma) {
      engine::launch_matmul_tma(a_data, b_data, plan, ma, st);
      return;
    }
    engine::launch_matmul(a_data, a_k, lda, b_data, b_k, ldb, plan, ma,
                          precision == Precision::FP32, st);
  });
}

}  // namespace tg::cuda
