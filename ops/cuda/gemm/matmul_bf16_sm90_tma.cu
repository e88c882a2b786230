// The engine's BF16 matrix product: c (f32 or bf16) = op(a) op(b) + bias with a and b bf16, row-major
// (Linear's forward and backward under Autocast). Operands stored with the reduction strided
// are transposed into a scratch first. On Hopper it is the
// TMA kernel of the TF32 products (tma_mainloop_sm90.cuh) with bf16 boxes: the same 128-byte
// swizzled rows hold 64 k instead of 32, and each k16 step is one m64nNk16 BF16 wgmma at twice
// the TF32 rate. Products of bf16 values are exact in f32 and the tensor cores accumulate in
// f32, so elsewhere the TF32 engine on f32 copies computes the same products (bf16 values are
// exact in TF32). Design note: docs/kernels/gemm_tma.md.
#include "core/cuda_context.h"
#include "core/error.h"
#include "core/tensor_kernels.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/gemm/engine.h"
#include "ops/cuda/gemm/operands.cuh"
#include "ops/cuda/gemm/planning.h"
#include "ops/cuda/gemm/matrix_boxes.cuh"

namespace tg::cuda {
namespace {

void check_operands(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p) {
  TG_CHECK_AS(DTypeError, a.dtype() == DType::bf16 && b.dtype() == DType::bf16 &&
                              (c.dtype() == DType::f32 || c.dtype() == DType::bf16) &&
                              (!bias.defined() || bias.dtype() == DType::f32),
              "engine_gemm_bf16: wants bf16 a and b, an f32 or bf16 output and an f32 bias; got a ",
              dtype_name(a.dtype()), ", b ",
              dtype_name(b.dtype()), ", c ", dtype_name(c.dtype()),
              bias.defined() ? std::string(", bias ") + dtype_name(bias.dtype()) : std::string());
  TG_CHECK(engine_gemm_can_implement(p, DType::f32), "engine_gemm_bf16: ", p.M, " x ", p.N, " x ", p.K,
           " is outside the engine's limits");
  TG_CHECK(a.numel() == p.M * p.K && b.numel() == p.N * p.K && c.numel() == p.M * p.N &&
               (!bias.defined() || bias.numel() == p.N),
           "engine_gemm_bf16: operands of ", a.numel(), ", ", b.numel(), " and ", c.numel(), " elements for ", p.M,
           " x ", p.N, " x ", p.K);
  TG_CHECK(a.device() == c.device() && b.device() == c.device() && (!bias.defined() || bias.device() == c.device()) &&
               c.device().is_cuda(),
           "engine_gemm_bf16: every operand on the output's CUDA device");
}

}  // namespace

void engine::launch_matmul_tma_bf16(const uint16_t* a, const uint16_t* b, const Plan& plan, const MainloopArgs& args,
                                    cudaStream_t stream) {
  engine::MatrixBoxes<true> boxes;
  const TmaBox a_box{.rows = engine::kTmaBM, .cols = 2 * engine::kBK, .swizzle128 = true};
  const TmaBox b_box{.rows = plan.tma_cols, .cols = 2 * engine::kBK, .swizzle128 = true};
  boxes.a = bf16_matrix_map("engine bf16 matmul (A)", a, args.M, args.red, a_box);
  boxes.b = bf16_matrix_map("engine bf16 matmul (B)", b, args.N, args.red, b_box);
  engine::launch_tma_wgmma(boxes, plan, args, stream);
}

// The TMA kernel reads both operands with the reduction contiguous: an operand stored the
// other way ((K, M) a, (K, N) b) is transposed into a scratch whose rows are padded with zeros
// to whole 16 bytes. One stored with the reduction contiguous is read in place, which needs
// K % 8 == 0.
bool engine_gemm_bf16_uses_tma(const Tensor& a, const Tensor& b, const GemmProblem& p, const EnginePolicy& policy) {
  const bool tile = policy.tile == 0 || policy.tile == 128 || policy.tile == 256 || policy.tile == 64;
  const bool a_in_place = !p.transA, b_in_place = p.transB;
  const bool rows_ok = (!a_in_place && !b_in_place) || p.K % 8 == 0;
  const bool transposable = (a_in_place && b_in_place) || (p.K + 31) / 32 <= 65535;  // the transpose's grid
  return tile && policy.arch != 80 && a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && a.device().is_cuda() &&
         p.K > 0 && rows_ok && transposable && (p.K + 7) / 8 * 8 <= engine::kIndexLimit &&
         (!a_in_place || engine::aligned16(engine::bf16_bits(a))) &&
         (!b_in_place || engine::aligned16(engine::bf16_bits(b))) && device_runs_wgmma(a.device().index);
}

void engine_gemm_bf16(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p,
                      const EnginePolicy& policy) {
  check_operands(c, a, b, bias, p);
  const int dev = c.device().index;
  set_device(dev);
  if (!engine_gemm_bf16_uses_tma(a, b, p, policy)) {
    // The same products on the TF32 engine: bf16 values widen exactly and are exact in TF32; a
    // bf16 c gets the f32 result rounded once.
    return engine::into_f32(c, [&](const Tensor& c32) {
      engine_gemm(c32, engine::widened(a), engine::widened(b), bias, p, Precision::TF32, policy);
    });
  }
  // Operands stored with the reduction strided: transposed, rows padded to 16 bytes.
  const bool a_in_place = !p.transA, b_in_place = p.transB;
  const int64_t red = a_in_place || b_in_place ? p.K : (p.K + 7) / 8 * 8;
  const TensorOptions bf16{.dtype = DType::bf16, .device = c.device()};
  cudaStream_t st = stream(dev);
  const uint16_t* a_rows = engine::bf16_bits(a);
  const uint16_t* b_rows = engine::bf16_bits(b);
  Tensor a_scratch, b_scratch;
  if (!a_in_place) {
    a_scratch = Tensor::empty({p.M * red}, bf16);
    engine::transpose_into(static_cast<uint16_t*>(a_scratch.raw_data()), a_rows, 1, p.K, p.M, red, st);
    a_rows = engine::bf16_bits(a_scratch);
  }
  if (!b_in_place) {
    b_scratch = Tensor::empty({p.N * red}, bf16);
    engine::transpose_into(static_cast<uint16_t*>(b_scratch.raw_data()), b_rows, 1, p.K, p.N, red, st);
    b_rows = engine::bf16_bits(b_scratch);
  }
  const int cols = policy.tile == 256 ? 256 : policy.tile == 64 || p.N <= 64 ? 64 : 128;
  engine::Plan plan = engine::make_tma_plan(p.M, p.N, red, cols, dev, policy, Precision::TF32, /*bf16=*/true);
  // A BF16 k-tile carries the same bytes as a TF32 one for twice the products: the loads limit
  // it sooner, and the wide tile's quarter fewer bytes per product count for more.
  if (cols == 128 && policy.tile == 0 && engine::wide_tma_tile_pays(plan, p.N, red, policy, dev))
    plan = engine::make_tma_plan(p.M, p.N, red, 256, dev, policy, Precision::TF32, /*bf16=*/true);
  engine::MainloopArgs args{};
  args.M = int32_t(p.M);
  args.N = int32_t(p.N);
  args.red = int32_t(red);
  args.out = engine::output_map(c, bias.defined() ? bias.data<float>() : nullptr, p.M, p.N);
  engine::run_plan(plan, args, c.device(), [&](const engine::MainloopArgs& m, cudaStream_t stm) {
    engine::launch_matmul_tma_bf16(a_rows, b_rows, plan, m, stm);
  });
}

}  // namespace tg::cuda
