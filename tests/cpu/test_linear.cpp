// matmul and linear on the CPU: values against direct loops, gradients against central
// differences, every transpose combination of the shared GEMM problem, and the error paths.
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

// c[m][n] = sum_k op(a)[m][k] * op(b)[k][n], straight from the definition of GemmProblem.
std::vector<double> gemm_loop(const std::vector<double>& a, const std::vector<double>& b, const GemmProblem& p) {
  std::vector<double> c(static_cast<size_t>(p.M * p.N), 0.0);
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < p.K; ++k) {
        double av = p.transA ? a[k * p.M + m] : a[m * p.K + k];
        double bv = p.transB ? b[n * p.K + k] : b[k * p.N + n];
        acc += av * bv;
      }
      c[m * p.N + n] = acc;
    }
  return c;
}

void expect_all_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

}  // namespace

TEST(Matmul, ValuesMatchLoop) {
  Tensor a = random({7, 9}), b = random({9, 5});
  Tensor c = matmul(a, b);
  ASSERT_EQ(c.shape(), Shape({7, 5}));
  expect_all_near(c.to_vector<double>(),
                  gemm_loop(a.to_vector<double>(), b.to_vector<double>(), {.M = 7, .N = 5, .K = 9}), 1e-12);
}

TEST(Gemm, EveryTransposeAndBiasMatchLoop) {
  const int64_t M = 7, N = 13, K = 9;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      GemmProblem p{.M = M, .N = N, .K = K, .transA = ta, .transB = tb};
      Tensor a = random({p.a_rows(), p.a_cols()}), b = random({p.b_rows(), p.b_cols()});
      Tensor bias = random({N});
      Tensor c = Tensor::empty({M, N}, {.dtype = f64});
      poison(c);
      cpu::gemm(c, a, b, bias, p);
      std::vector<double> want = gemm_loop(a.to_vector<double>(), b.to_vector<double>(), p);
      auto vb = bias.to_vector<double>();
      for (int64_t i = 0; i < M * N; ++i) want[i] += vb[i % N];
      SCOPED_TRACE(testing::Message() << "transA=" << ta << " transB=" << tb);
      expect_all_near(c.to_vector<double>(), want, 1e-12);
    }
}

TEST(Gemm, EmptyInnerDimensionGivesBias) {
  Tensor a = random({3, 0}), b = random({0, 4}), bias = random({4});
  Tensor c = Tensor::empty({3, 4}, {.dtype = f64});
  poison(c);
  cpu::gemm(c, a, b, bias, {.M = 3, .N = 4, .K = 0});
  auto vc = c.to_vector<double>(), vb = bias.to_vector<double>();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(vc[i], vb[i % 4]);
}

TEST(Gemm, OperandsThatDoNotFitAreRejected) {
  Tensor c = Tensor::empty({3, 4}, {.dtype = f64});
  TG_EXPECT_ERROR(cpu::gemm(c, random({3, 5}), random({4, 5}), Tensor(), {.M = 3, .N = 4, .K = 5}),
                  "gemm", "M=3 N=4 K=5", "b [4, 5]");
  TG_EXPECT_ERROR(cpu::gemm(c, random({3, 5}), random({5, 4}), random({3}), {.M = 3, .N = 4, .K = 5}),
                  "gemm: bias [3]");
}

TEST(Linear, ValuesMatchLoopWithAndWithoutBias) {
  const int64_t B = 7, in = 9, out = 13;
  Tensor x = random({B, in}), w = random({out, in}), b = random({out});
  auto vx = x.to_vector<double>(), vw = w.to_vector<double>(), vb = b.to_vector<double>();
  auto with = linear(x, w, b).to_vector<double>(), without = linear(x, w).to_vector<double>();
  ASSERT_EQ(with.size(), size_t(B * out));
  for (int64_t i = 0; i < B; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t k = 0; k < in; ++k) acc += vx[i * in + k] * vw[o * in + k];
      EXPECT_NEAR(without[i * out + o], acc, 1e-12);
      EXPECT_NEAR(with[i * out + o], acc + vb[o], 1e-12);
    }
}

TEST(Linear, VectorInputIsABatchOfOne) {
  Tensor x = random({9}), w = random({13, 9}), b = random({13});
  Tensor y = linear(x, w, b);
  ASSERT_EQ(y.shape(), Shape({13}));
  expect_all_near(y.to_vector<double>(), linear(x.reshape({1, 9}), w, b).to_vector<double>(), 0.0);
}

TEST(Matmul, MatmulGrad) {
  Tensor a = param({7, 9}), b = param({9, 5});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
                      std::vector<Tensor>({a, b}));
}

TEST(Linear, LinearGradWithBias) {
  Tensor x = param({7, 9}), w = param({13, 9}), b = param({13});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                      std::vector<Tensor>({x, w, b}));
}

TEST(Linear, LinearGradWithoutBias) {
  Tensor x = param({7, 9}), w = param({13, 9});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
                      std::vector<Tensor>({x, w}));
}

TEST(Linear, LinearGradOfVectorInputAndOfWeightAlone) {
  Tensor v = param({9}), w = param({13, 9}), b = param({13});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                      std::vector<Tensor>({v, w, b}));
  // x without grad: only the weight's and bias's paths run.
  Tensor x = random({7, 9});
  TG_EXPECT_GRADCHECK([x](const std::vector<Tensor>& in) { return linear(x, in[0], in[1]); },
                      std::vector<Tensor>({w, b}));
}

TEST(Linear, LinearGradValuesAreTheTransposedProducts) {
  // dL/dx = dy w, dL/dw = dy^T x, dL/db = column sums of dy, for an explicit seed dy.
  Tensor x = param({7, 9}), w = param({13, 9}), b = param({13});
  Tensor dy = random({7, 13});
  {
    Tape tape;
    tape.backward(linear(x, w, b), dy);
  }
  auto vx = x.to_vector<double>(), vw = w.to_vector<double>(), vg = dy.to_vector<double>();
  expect_all_near(x.grad().to_vector<double>(), gemm_loop(vg, vw, {.M = 7, .N = 9, .K = 13}), 1e-12);
  expect_all_near(w.grad().to_vector<double>(), gemm_loop(vg, vx, {.M = 13, .N = 9, .K = 7, .transA = true}), 1e-12);
  std::vector<double> db(13, 0.0);
  for (int i = 0; i < 7; ++i)
    for (int o = 0; o < 13; ++o) db[o] += vg[i * 13 + o];
  expect_all_near(b.grad().to_vector<double>(), db, 1e-12);
}

TEST(Linear, BadShapesAreRejected) {
  TG_EXPECT_ERROR(linear(random({4, 5}), random({3, 6})),
                  "linear: input [4, 5] has 5 features but weight [3, 6] expects 6");
  TG_EXPECT_ERROR(linear(random({2, 4, 5}), random({3, 5})), "linear: input must be (batch, in) or (in)", "[2, 4, 5]");
  TG_EXPECT_ERROR(linear(random({4, 5}), random({3, 5, 1})), "linear: weight must be 2-D", "[3, 5, 1]");
  TG_EXPECT_ERROR(linear(random({4, 5}), random({3, 5}), random({4})), "linear: bias [4] does not match weight [3, 5]",
                  "expected [3]");
  TG_EXPECT_ERROR(linear(random({4, 5}), random({3, 5}), random({3, 1})), "linear: bias [3, 1]");
  TG_EXPECT_ERROR(linear(random({4, 5}), random({3, 5}, f32)), "linear", "dtypes differ", "f32[3, 5]");
  TG_EXPECT_ERROR(linear(random({4, 5}), random({3, 5}), random({3}, f32)), "linear", "f32[3]");
}

TEST(Matmul, BadShapesAreRejected) {
  TG_EXPECT_ERROR(matmul(random({4, 5}), random({6, 3})), "matmul: [4, 5] x [6, 3]: inner dimensions 5 and 6 differ");
  TG_EXPECT_ERROR(matmul(random({4}), random({4, 3})), "matmul: expects two 2-D matrices", "f64[4]");
  TG_EXPECT_ERROR(matmul(random({4, 5}), from_vector(std::vector<int64_t>{1, 2}, {2})), "matmul", "i64[2]");
}
