// Every row of the matrix-product dispatcher's table (ops/cuda/gemm_variants.h) on every case it
// can implement on this GPU, forced through KernelPolicy::gemm_variant, against the CPU
// reference in f64, into NaN-poisoned outputs: FP32 (relative L2 <= 1e-5) and TF32 (<= 2e-3, the
// bound common/variant_rows.h derives), every transpose, with and without a bias, sizes
// that break every kernel's tiles. Also: the default order takes the first row that prefers a
// problem, a forced row that cannot implement one is an UnsupportedError, an unknown name too,
// and Linear's fused backward matches on every row that can take both products.
#include <set>
#include <string>

#include "common/cuda_compare.h"
#include "common/test_util.h"
#include "common/variant_rows.h"
#include "core/error.h"
#include "core/precision.h"
#include "ops/cuda/gemm_variants.h"
#include "ops/cuda/linear.h"
#include "ops/cuda/policy.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

struct Case {
  const char* name;
  GemmProblem p;
  bool bias;
};

// Shapes that reach every row: a matrix-vector product and a few columns (skinny), short
// reductions with at most 512 columns (pointwise), ragged larger products (engine), and each
// transpose combination.
std::vector<Case> cases() {
  return {
      {"matvec NT", {.M = 1, .N = 300, .K = 257, .transB = true}, true},
      {"3 columns NN", {.M = 129, .N = 3, .K = 70}, false},
      {"short reduction NT + bias", {.M = 300, .N = 96, .K = 40, .transB = true}, true},
      {"short reduction NN", {.M = 257, .N = 72, .K = 33}, false},
      {"grad-weight TN", {.M = 40, .N = 56, .K = 300, .transA = true}, false},
      {"ragged NT + bias", {.M = 131, .N = 197, .K = 300, .transB = true}, true},
      {"ragged NN", {.M = 65, .N = 130, .K = 129}, false},
      {"ragged TN", {.M = 70, .N = 33, .K = 517, .transA = true}, false},
      {"ragged TT + bias", {.M = 45, .N = 77, .K = 91, .transA = true, .transB = true}, true},
  };
}

struct Operands {
  Tensor a, b, bias;  // on the GPU
  Tensor want;        // the CPU reference, f64
};

Operands operands(const Case& c) {
  Operands o;
  o.a = random({c.p.a_rows(), c.p.a_cols()}, f32, kGpu);
  o.b = random({c.p.b_rows(), c.p.b_cols()}, f32, kGpu);
  if (c.bias) o.bias = random({c.p.N}, f32, kGpu);
  o.want = Tensor::empty({c.p.M, c.p.N}, {.dtype = f64});
  cpu::gemm(o.want, ref_of(o.a), ref_of(o.b), c.bias ? ref_of(o.bias) : Tensor(), c.p);
  return o;
}

}  // namespace

TEST(CudaGemmVariants, EveryRowOnEveryCaseItCanImplement) {
  TG_REQUIRE_GPU();
  std::set<std::string> rows_run;
  for (const Precision mode : {Precision::FP32, Precision::TF32}) {
    PrecisionGuard guard(mode);
    const double tol = row_tolerance(mode);
    for (const Case& c : cases()) {
      const Operands o = operands(c);
      for (const cuda::GemmVariant& v : cuda::gemm_variants()) {
        const Tensor out = poisoned_gpu({c.p.M, c.p.N}, f32);
        if (!v.can_implement(cuda::gemm_case(c.p, f32), {.c = out, .a = o.a, .b = o.b, .bias = o.bias})) continue;
        cuda::KernelPolicyGuard forced(forcing_gemm_row(v.name));
        cuda::gemm(out, o.a, o.b, o.bias, c.p);
        EXPECT_LE(rel_l2(out, o.want), tol) << c.name << " on " << v.name << (mode == Precision::TF32 ? " tf32" : " fp32");
        rows_run.insert(std::string(v.name));
      }
    }
  }
  expect_every_row_ran(cuda::gemm_variants(), rows_run);
}

TEST(CudaGemmVariants, DoublePrecisionRunsOnTheDirectRowOnly) {
  TG_REQUIRE_GPU();
  const GemmProblem p{.M = 33, .N = 65, .K = 17, .transA = true};
  const Tensor a = random({p.a_rows(), p.a_cols()}, f64, kGpu), b = random({p.b_rows(), p.b_cols()}, f64, kGpu);
  const Tensor c = poisoned_gpu({p.M, p.N}, f64);
  const cuda::GemmCase g = cuda::gemm_case(p, f64);
  for (const cuda::GemmVariant& v : cuda::gemm_variants())
    EXPECT_EQ(v.can_implement(g, {.c = c, .a = a, .b = b}), v.name == "direct") << v.name;
  cuda::gemm(c, a, b, Tensor(), p);
  Tensor want = Tensor::empty({p.M, p.N}, {.dtype = f64});
  cpu::gemm(want, a.cpu(), b.cpu(), Tensor(), p);
  EXPECT_LE(rel_l2(c, want), 1e-13);
}

TEST(CudaGemmVariants, DefaultOrderTakesTheFirstPreferredRow) {
  TG_REQUIRE_GPU();
  cuda::KernelPolicyGuard automatic(cuda::KernelPolicy{});
  const auto row_of = [](const GemmProblem& p, bool bias) {
    const Tensor c = Tensor::empty({p.M, p.N}, {.device = kGpu});
    const Tensor b = bias ? Tensor::empty({p.N}, {.device = kGpu}) : Tensor();
    return std::string(cuda::choose_gemm_variant(cuda::gemm_case(p, f32), {.c = c, .bias = b}).name);
  };
  EXPECT_EQ(row_of({.M = 1, .N = 4096, .K = 4096, .transB = true}, true), "skinny");
  EXPECT_EQ(row_of({.M = 4096, .N = 256, .K = 64, .transB = true}, true), "pointwise");
  EXPECT_EQ(row_of({.M = 4096, .N = 256, .K = 64}, true), "engine");  // NN with a bias: not the 1x1 kernels
  EXPECT_EQ(row_of({.M = 4096, .N = 1024, .K = 1024, .transB = true}, false), "engine");
  // Every case's first preferred row is the one chosen, and it can implement the case.
  for (const Case& c : cases()) {
    const Tensor out = Tensor::empty({c.p.M, c.p.N}, {.device = kGpu});
    const Tensor bias = c.bias ? Tensor::empty({c.p.N}, {.device = kGpu}) : Tensor();
    const cuda::GemmOperands ops{.c = out, .bias = bias};
    const cuda::GemmCase g = cuda::gemm_case(c.p, f32);
    const cuda::GemmVariant& chosen = cuda::choose_gemm_variant(g, ops);
    for (const cuda::GemmVariant& v : cuda::gemm_variants()) {
      if (&v == &chosen) break;
      EXPECT_FALSE(v.preferred(g, ops)) << c.name << ": " << v.name << " prefers it but " << chosen.name << " was chosen";
    }
    EXPECT_TRUE(chosen.can_implement(g, ops)) << c.name << " on " << chosen.name;
  }
  // KernelPath::Engine skips the specialised rows; Direct takes the last one.
  cuda::KernelPolicy engine_only;
  engine_only.gemm = cuda::KernelPath::Engine;
  {
    cuda::KernelPolicyGuard forced(engine_only);
    EXPECT_EQ(row_of({.M = 1, .N = 4096, .K = 4096, .transB = true}, true), "engine");
  }
  cuda::KernelPolicy direct_only;
  direct_only.gemm = cuda::KernelPath::Direct;
  cuda::KernelPolicyGuard forced(direct_only);
  EXPECT_EQ(row_of({.M = 4096, .N = 1024, .K = 1024, .transB = true}, false), "direct");
}

TEST(CudaGemmVariants, ForcedRowsThatCannotServeAreUnsupportedErrors) {
  TG_REQUIRE_GPU();
  const GemmProblem big{.M = 300, .N = 200, .K = 600, .transB = true};
  const Tensor a = random({big.a_rows(), big.a_cols()}, f32, kGpu), b = random({big.b_rows(), big.b_cols()}, f32, kGpu);
  const Tensor c = poisoned_gpu({big.M, big.N}, f32);
  {
    cuda::KernelPolicyGuard forced(forcing_gemm_row("skinny"));  // no dimension is at most 8
    EXPECT_THROW(cuda::gemm(c, a, b, Tensor(), big), UnsupportedError);
    TG_EXPECT_ERROR(cuda::gemm(c, a, b, Tensor(), big), "gemm", "'skinny'", "M 300, N 200, K 600");
  }
  {
    const GemmProblem tt{.M = 20, .N = 30, .K = 40, .transA = true, .transB = true};
    const Tensor ta = random({tt.a_rows(), tt.a_cols()}, f32, kGpu), tb = random({tt.b_rows(), tt.b_cols()}, f32, kGpu);
    cuda::KernelPolicyGuard forced(forcing_gemm_row("pointwise"));  // the 1x1 kernels have no TT form
    EXPECT_THROW(cuda::gemm(poisoned_gpu({tt.M, tt.N}, f32), ta, tb, Tensor(), tt), UnsupportedError);
  }
  cuda::KernelPolicyGuard forced(forcing_gemm_row("tiled"));
  TG_EXPECT_ERROR(cuda::gemm(c, a, b, Tensor(), big), "gemm", "no matrix-product kernels named 'tiled'");
}

TEST(CudaGemmVariants, LinearBackwardOnEveryRow) {
  TG_REQUIRE_GPU();
  // linear_grad_input_weight takes the 1x1 kernels' fused backward when both products route
  // there; on other rows, two products. dx = dy w, dw = dy^T x.
  const int64_t B = 300, out = 48, in = 72;
  const Tensor dy = random({B, out}, f32, kGpu), x = random({B, in}, f32, kGpu), w = random({out, in}, f32, kGpu);
  Tensor dx_want = Tensor::empty({B, in}, {.dtype = f64}), dw_want = Tensor::empty({out, in}, {.dtype = f64});
  cpu::gemm(dx_want, ref_of(dy), ref_of(w), Tensor(), {.M = B, .N = in, .K = out});
  cpu::gemm(dw_want, ref_of(dy), ref_of(x), Tensor(), {.M = out, .N = in, .K = B, .transA = true});
  PrecisionGuard fp32(Precision::FP32);
  for (const std::string_view row : {"pointwise", "engine", "direct"}) {
    cuda::KernelPolicyGuard forced(forcing_gemm_row(row));
    const Tensor dx = poisoned_gpu({B, in}, f32), dw = poisoned_gpu({out, in}, f32);
    cuda::linear_grad_input_weight(dx, dw, dy, x, w);
    EXPECT_LE(rel_l2(dx, dx_want), 1e-5) << row << ": dx";
    EXPECT_LE(rel_l2(dw, dw_want), 1e-5) << row << ": dw";
  }
}
