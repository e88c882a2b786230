// The engine's BF16 matrix product (ops/cuda/gemm/matmul_bf16_sm90_tma.cu), its transposed
// operands included, and Linear under Autocast(bf16) on the GPU, which runs its forward and
// its input and weight gradients there.
//
// Tolerances. The operands are bf16 values, so every product is exact in f32 and the reference
// (the f64 product of the same bf16 values) differs from the kernel by its f32 accumulation
// alone. The tensor cores need not round that accumulation to nearest: at most 2^-23 of the
// running sum per addition, which over a reduction of K random terms is within K 2^-23 of the
// result (relative L2), and at least 1e-5 (the FP32 kernels' limit). A kernel that mixed up k
// offsets, rows or tiles, or rounded an operand again, misses by 1e-3 and more. Linear under
// Autocast is compared with the CPU's bf16 path (f32 products on f32 copies, one rounding of
// the result to bf16): the two sums differ in order only, so the bf16 results are the same or
// one rounding apart: relative L2 <= 2^-8 (a bf16 ulp at 1 is 2^-7); the gradients pass two
// roundings to bf16 (dy at y's cast, the gradient at the op's boundary): 2^-7, as in
// test_half_ops_cuda.cpp. A bf16 output (each sum rounded once in the epilogue, or from an f32
// scratch) must hold exactly the bits of the f32 output cast to bf16: the same sums, rounded by
// the same function.
// Needs an sm_90a GPU for the BF16 kernel; the fallback (the TF32 engine on f32 copies) on any GPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "autograd/tape.h"
#include "common/autocast_compare.h"
#include "common/half_util.h"
#include "common/test_util.h"
#include "core/autocast.h"
#include "core/precision.h"
#include "ops/elementwise.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/gemm/engine.h"
#include "ops/linear.h"
#include "ops/reduce.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

double tolerance(int64_t K) { return std::max(1e-5, double(K) * std::ldexp(1.0, -23)); }

Tensor f64_cpu(const Tensor& t) { return t.detach().cpu().to(DType::f64); }

bool hopper() {
  const Tensor a = random({8, 8}, DType::bf16, kGpu);
  return cuda::engine_gemm_bf16_uses_tma(a, a, {.M = 8, .N = 8, .K = 8, .transB = true});
}

struct GemmCase {
  const char* name;
  int64_t M, N, K;
  bool bias;
  bool transA = false, transB = true;  // a (M, K) and b (N, K) unless said otherwise
};

using Variant = std::pair<const char*, cuda::EnginePolicy>;

// One case under each policy variant, against one f64 reference; and into a bf16 output, against
// the f32 output's bits rounded.
void expect_gemm_matches(const GemmCase& c, const std::vector<Variant>& variants, bool want_tma) {
  const GemmProblem p{.M = c.M, .N = c.N, .K = c.K, .transA = c.transA, .transB = c.transB};
  const Tensor a = random({p.a_rows(), p.a_cols()}, DType::bf16, kGpu);
  const Tensor b = random({p.b_rows(), p.b_cols()}, DType::bf16, kGpu);
  const Tensor bias = c.bias ? random({c.N}, DType::f32, kGpu) : Tensor();
  // a (M, K) and b (N, K) in f64 on the host, whatever the stored orders.
  const Tensor a_mk = c.transA ? f64_cpu(a).permute({1, 0}).contiguous() : f64_cpu(a);
  const Tensor b_nk = c.transB ? f64_cpu(b) : f64_cpu(b).permute({1, 0}).contiguous();
  const Tensor want = linear(a_mk, b_nk, c.bias ? f64_cpu(bias) : Tensor());
  for (const auto& [variant, policy] : variants) {
    const std::string where = std::string(c.name) + ", " + variant;
    EXPECT_EQ(cuda::engine_gemm_bf16_uses_tma(a, b, p, policy), want_tma) << where;
    Tensor out = Tensor::empty({c.M, c.N}, {.device = kGpu});
    poison(out);
    cuda::engine_gemm_bf16(out, a, b, bias, p, policy);
    EXPECT_LE(rel_l2(out, want), tolerance(c.K)) << where;
    Tensor out16 = Tensor::empty({c.M, c.N}, {.dtype = DType::bf16, .device = kGpu});
    poison(out16);
    cuda::engine_gemm_bf16(out16, a, b, bias, p, policy);
    EXPECT_EQ(half_bits(out16), half_bits(out.to(DType::bf16))) << where << ", bf16 output";
  }
}

#define TG_REQUIRE_HOPPER() TG_REQUIRE_SM90A_KERNEL("BF16 TMA kernel", hopper())

// Odd sizes: rows and columns past whole tiles, reductions that end inside a 64-deep k-tile
// (8: one eighth of one), one row, 64 columns or fewer (64-wide tiles), bias or none.
TEST(GemmBf16, MatchesF64ReferenceOnTheTmaKernel) {
  TG_REQUIRE_HOPPER();
  const GemmCase cases[] = {
      {"130 x 70 x 72, bias", 130, 70, 72, true},
      {"300 x 300 x 200", 300, 300, 200, false},
      {"one row, 11008 -> 4096 (a GEMV)", 1, 4096, 11008, false},
      {"reduction of 8", 257, 129, 8, true},
      {"33 columns (a 64-wide tile)", 500, 33, 520, true},
      {"512 x 384 x 4096", 512, 384, 4096, false},
      {"1000 columns, bias (bf16 rows: a box past the last column)", 200, 1000, 136, true},
  };
  const std::vector<Variant> variants = {
      {"auto", {}},
      {"128 wide, unsplit", {.tile = 128, .splits = 1}},
      {"128 wide, split 3", {.tile = 128, .splits = 3}},
      {"256 wide, split 2", {.tile = 256, .splits = 2}},
      {"64 wide", {.tile = 64, .splits = 1}},
      {"128 wide, two blocks per SM", {.tile = 128, .splits = 1, .blocks_per_sm = 2}},
      {"128 wide, split 2, stores through the output map", {.tile = 128, .splits = 2, .tma_store = -1}},
  };
  for (const GemmCase& c : cases) expect_gemm_matches(c, variants, true);
}

// Operands stored with the reduction strided (Linear's backward: dx = dy w, dw = dy^T x) are
// transposed into a scratch whose rows are padded to 16 bytes: any K once both are.
TEST(GemmBf16, TransposedOperandsOnTheTmaKernel) {
  TG_REQUIRE_HOPPER();
  const std::vector<Variant> variants = {{"auto", {}}, {"128 wide, split 3", {.tile = 128, .splits = 3}}};
  expect_gemm_matches({"b stored (K, N): dx = dy w", 300, 200, 72, false, false, false}, variants, true);
  expect_gemm_matches({"a stored (K, M), b (K, N): dw = dy^T x", 130, 70, 1000, false, true, false}, variants, true);
  expect_gemm_matches({"both stored (K, .), K = 37", 65, 90, 37, true, true, false}, variants, true);
  expect_gemm_matches({"a stored (K, M), b (N, K)", 100, 80, 64, false, true, true}, variants, true);
  // One operand read in place needs whole 16-byte rows.
  expect_gemm_matches({"b stored (K, N), K = 20", 50, 40, 20, false, false, false}, {{"auto", {}}}, false);
}

// Reductions that are not whole 16-byte rows, and the mma.sync policy: the TF32 engine on f32
// copies, the same products.
TEST(GemmBf16, FallsBackToTheTf32EngineWithTheSameProducts) {
  TG_REQUIRE_GPU();
  const bool tma = hopper();
  expect_gemm_matches({"reduction of 20", 70, 90, 20, true}, {{"auto", {}}}, false);
  expect_gemm_matches({"reduction of 1", 33, 17, 1, false}, {{"auto", {}}}, false);
  expect_gemm_matches({"130 x 70 x 72", 130, 70, 72, true}, {{"arch 80", {.arch = 80}}, {"tile 16", {.tile = 16}}},
                      false);
  expect_gemm_matches({"the kernel where it applies", 130, 70, 64, false}, {{"auto", {}}}, tma);
}

TEST(GemmBf16, ErrorsAreTypedAndNameTheOp) {
  TG_REQUIRE_GPU();
  const GemmProblem p{.M = 4, .N = 8, .K = 16, .transB = true};
  const Tensor a = random({4, 16}, DType::bf16, kGpu), b = random({8, 16}, DType::bf16, kGpu);
  const Tensor a32 = random({4, 16}, DType::f32, kGpu);
  Tensor out = Tensor::empty({4, 8}, {.device = kGpu});
  EXPECT_THROW(cuda::engine_gemm_bf16(out, a32, b, Tensor(), p), DTypeError);
  TG_EXPECT_ERROR(cuda::engine_gemm_bf16(out, a32, b, Tensor(), p), "engine_gemm_bf16", "got a f32");
  Tensor out16 = Tensor::empty({4, 8}, {.dtype = DType::f16, .device = kGpu});
  EXPECT_THROW(cuda::engine_gemm_bf16(out16, a, b, Tensor(), p), DTypeError);
  TG_EXPECT_ERROR(cuda::engine_gemm_bf16(out, a, b, Tensor(), {.M = 4, .N = 8, .K = 12, .transB = true}),
                  "engine_gemm_bf16", "4 x 8 x 12");
}

// Linear under Autocast(bf16) on the GPU: forward on the BF16 kernel, backward as the f32 path;
// the same model on the CPU (the bf16 path of compute_in_f32) as the reference. Parameters stay
// f32 (their gradients arrive in f32 through Autocast's recorded casts).
TEST(GemmBf16, LinearUnderAutocastMatchesTheCpuPath) {
  TG_REQUIRE_GPU();
  PrecisionGuard fp32(Precision::FP32);
  struct Shape3 {
    int64_t B, in, out;
  };
  for (const Shape3& s : {Shape3{37, 72, 50}, Shape3{256, 1024, 384}, Shape3{5, 20, 3}}) {
    const std::string where =
        std::to_string(s.B) + " x " + std::to_string(s.in) + " -> " + std::to_string(s.out);
    expect_autocast_gpu_matches_cpu(
        where, random({s.B, s.in}, DType::f32), random({s.out, s.in}, DType::f32), random({s.out}, DType::f32),
        random({s.B, s.out}, DType::f32),
        [](const Tensor& x, const Tensor& w, const Tensor& b) { return linear(x, w, b); });
  }
}

}  // namespace
