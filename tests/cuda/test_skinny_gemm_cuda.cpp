// Skinny GEMMs (a dimension <= 8: matrix-vector products) on the GPU against the CPU GEMM,
// for every operand layout, odd sizes, with and without bias; poisoned outputs; the same
// bits on every run.
#include "common/test_util.h"
#include "ops/cuda/skinny_gemm.h"
#include "ops/linear.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

void check_problem(const GemmProblem& p, bool with_bias) {
  SCOPED_TRACE(::testing::Message() << "M=" << p.M << " N=" << p.N << " K=" << p.K << " transA=" << p.transA
                                    << " transB=" << p.transB << " bias=" << with_bias);
  Tensor a = random({p.a_rows(), p.a_cols()}, f32), b = random({p.b_rows(), p.b_cols()}, f32);
  Tensor bias = with_bias ? random({p.N}, f32) : Tensor();
  Tensor ref = Tensor::empty({p.M, p.N});
  // The reference in f64 so that it is the accurate one.
  Tensor ref64 = Tensor::empty({p.M, p.N}, {.dtype = f64});
  cpu::gemm(ref64, a.to(f64), b.to(f64), with_bias ? bias.to(f64) : Tensor(), p);
  ASSERT_TRUE(cuda::skinny_gemm_applies(ref, p));
  Tensor ga = a.to(kGpu), gb = b.to(kGpu), gbias = with_bias ? bias.to(kGpu) : Tensor();
  Tensor c = Tensor::empty({p.M, p.N}, {.device = kGpu});
  poison(c);
  cuda::skinny_gemm(c, ga, gb, gbias, p);
  EXPECT_LE(rel_l2(c, ref64), 1e-5);
  Tensor again = Tensor::empty({p.M, p.N}, {.device = kGpu});
  poison(again);
  cuda::skinny_gemm(again, ga, gb, gbias, p);
  EXPECT_EQ(c.to_vector<float>(), again.to_vector<float>()) << "not deterministic";
}

}  // namespace

TEST(CudaSkinnyGemm, EveryLayoutAndOddSize) {
  TG_REQUIRE_GPU();
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{
               {1023, 1, 1023}, {3, 1, 1}, {1, 1023, 3}, {1, 1, 1}, {1023, 8, 13}, {7, 1023, 1023},
               {4096, 3, 4}, {5, 4097, 1024}, {1, 8, 8}, {9, 9, 8}}) {
        check_problem({.M = m, .N = n, .K = k, .transA = ta, .transB = tb}, false);
        check_problem({.M = m, .N = n, .K = k, .transA = ta, .transB = tb}, true);
      }
}

TEST(CudaSkinnyGemm, LongReductionLikeWorkloadD) {
  TG_REQUIRE_GPU();
  const int64_t K = (int64_t{1} << 20) + 5;
  // Forward (A x), and both gradients of D's shapes at a reduced row count.
  check_problem({.M = 64, .N = 1, .K = K, .transA = false, .transB = true}, false);   // x w^T
  check_problem({.M = 1, .N = K, .K = 64, .transA = true, .transB = false}, false);   // g^T x
  check_problem({.M = 64, .N = K, .K = 1, .transA = false, .transB = false}, false);  // g w
  check_problem({.M = 3, .N = 1, .K = K, .transA = false, .transB = true}, true);     // few rows: split-K
}
