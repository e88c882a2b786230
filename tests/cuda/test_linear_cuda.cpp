// The CUDA GEMM and linear/matmul against the CPU reference (computed in f64 from the same
// f32 values), at shapes that break the 64x64x16 tiles, every transpose combination, with
// outputs poisoned with NaN so an unwritten element fails.
#include "common/cuda_compare.h"
#include "common/test_util.h"
#include "ops/conv.h"
#include "ops/cuda/conv1x1/conv1x1.h"
#include "ops/cuda/linear.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr double kTol = 1e-5;

struct Dims {
  int64_t M, N, K;
};
const std::vector<Dims> kOddDims = {{65, 127, 33}, {1, 1, 1}, {7, 9, 13}, {64, 64, 16}, {130, 70, 300}, {3, 200, 1}};

}  // namespace

TEST(GemmCuda, EveryTransposeMatchesCpu) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (const Dims& d : kOddDims)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool with_bias : {false, true}) {
          GemmProblem p{.M = d.M, .N = d.N, .K = d.K, .transA = ta, .transB = tb};
          SCOPED_TRACE(testing::Message() << "M=" << d.M << " N=" << d.N << " K=" << d.K << " transA=" << ta
                                          << " transB=" << tb << " bias=" << with_bias);
          Tensor a = random({p.a_rows(), p.a_cols()}, f32, gpu), b = random({p.b_rows(), p.b_cols()}, f32, gpu);
          Tensor bias = with_bias ? random({p.N}, f32, gpu) : Tensor();
          Tensor c = Tensor::empty({p.M, p.N}, {.dtype = f32, .device = gpu});
          poison(c);
          cuda::gemm(c, a, b, bias, p);
          Tensor want = Tensor::empty({p.M, p.N}, {.dtype = f64});
          cpu::gemm(want, ref_of(a), ref_of(b), with_bias ? ref_of(bias) : Tensor(), p);
          EXPECT_LE(rel_l2(c, want), kTol);
        }
}

TEST(GemmCuda, DoublePrecisionMatchesCpu) {
  TG_REQUIRE_GPU();
  GemmProblem p{.M = 65, .N = 127, .K = 33, .transA = true, .transB = false};
  Tensor a = random({p.a_rows(), p.a_cols()}, f64), b = random({p.b_rows(), p.b_cols()}, f64);
  Tensor c = Tensor::empty({p.M, p.N}, {.dtype = f64, .device = Device::cuda()});
  poison(c);
  cuda::gemm(c, a.cuda(), b.cuda(), Tensor(), p);
  Tensor want = Tensor::empty({p.M, p.N}, {.dtype = f64});
  cpu::gemm(want, a, b, Tensor(), p);
  EXPECT_LE(rel_l2(c, want), 1e-13);
}

TEST(GemmCuda, MoreRowTilesThanTheGridAllows) {
  TG_REQUIRE_GPU();
  // 65535 * 64 + 100 rows: gridDim.y is capped, so the kernel must loop over row tiles.
  const int64_t M = 65535 * 64 + 100;
  GemmProblem p{.M = M, .N = 3, .K = 2};
  Tensor a = random({M, 2}, f32, Device::cuda()), b = random({2, 3}, f32, Device::cuda());
  Tensor c = Tensor::empty({M, 3}, {.dtype = f32, .device = Device::cuda()});
  poison(c);
  cuda::gemm(c, a, b, Tensor(), p);
  Tensor want = Tensor::empty({M, 3}, {.dtype = f64});
  cpu::gemm(want, ref_of(a), ref_of(b), Tensor(), p);
  EXPECT_LE(rel_l2(c, want), kTol);
}

TEST(GemmCuda, SumRowsMatchesCpu) {
  TG_REQUIRE_GPU();
  for (Dims d : {Dims{65, 127, 0}, Dims{1, 1, 0}, Dims{1000, 33, 0}}) {
    Tensor dy = random({d.M, d.N}, f32, Device::cuda());
    Tensor db = Tensor::empty({d.N}, {.dtype = f32, .device = Device::cuda()});
    poison(db);
    cuda::sum_rows(db, dy);
    Tensor want = Tensor::empty({d.N}, {.dtype = f64});
    cpu::sum_rows(want, ref_of(dy));
    EXPECT_LE(rel_l2(db, want), kTol) << "rows=" << d.M << " cols=" << d.N;
  }
}

TEST(LinearCuda, ForwardAndEveryGradientMatchCpu) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (const Dims& d : kOddDims)
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(testing::Message() << "B=" << d.M << " out=" << d.N << " in=" << d.K << " bias=" << with_bias);
      Tensor x = random({d.M, d.K}, f32, gpu).requires_grad_(), w = random({d.N, d.K}, f32, gpu).requires_grad_();
      Tensor b = with_bias ? random({d.N}, f32, gpu).requires_grad_() : Tensor();
      Tensor dy = random({d.M, d.N}, f32, gpu);
      expect_matches_f64_cpu([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b}, dy,
                             kTol);
    }
}

TEST(MatmulCuda, ForwardAndEveryGradientMatchCpu) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  for (const Dims& d : kOddDims) {
    SCOPED_TRACE(testing::Message() << "M=" << d.M << " N=" << d.N << " K=" << d.K);
    Tensor a = random({d.M, d.K}, f32, gpu).requires_grad_(), b = random({d.K, d.N}, f32, gpu).requires_grad_();
    Tensor dc = random({d.M, d.N}, f32, gpu);
    expect_matches_f64_cpu([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b}, dc, kTol);
  }
}

TEST(LinearCuda, MixedDevicesAreRejected) {
  TG_REQUIRE_GPU();
  TG_EXPECT_ERROR(linear(random({4, 5}, f32, Device::cuda()), random({3, 5}, f32)), "linear", "different devices");
}

// A batched linear layer is a channels-last 1x1 convolution (rows = pixels): gemm routes its
// forward (NT), input-gradient (NN) and weight-gradient (TN) forms with a short reduction and
// few output columns to the pointwise tensor-core kernels. Both precisions, shapes that break
// their 128-pixel tiles and 16-channel steps, and the widest forms still routed (128-long
// reduction, 512 columns) and the first ones not (129).
TEST(LinearCuda, PointwiseShapesMatchCpuInBothPrecisions) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  const std::vector<Dims> dims = {{1000, 128, 64}, {131, 24, 9}, {4099, 512, 128}, {300, 40, 129}, {1, 7, 3}};
  for (Precision precision : {Precision::FP32, Precision::TF32}) {
    PrecisionGuard guard(precision);
    const double tol = precision == Precision::FP32 ? kTol : 1e-3;
    for (const Dims& d : dims) {
      SCOPED_TRACE(testing::Message() << "B=" << d.M << " out=" << d.N << " in=" << d.K << " tf32="
                                      << (precision == Precision::TF32));
      Tensor x = random({d.M, d.K}, f32, gpu).requires_grad_(), w = random({d.N, d.K}, f32, gpu).requires_grad_();
      Tensor b = random({d.N}, f32, gpu).requires_grad_();
      Tensor dy = random({d.M, d.N}, f32, gpu);
      expect_matches_f64_cpu([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b}, dy,
                             tol);
    }
  }
}

// The routed products are the 1x1 convolution's own kernels: the same bits as conv2d on the
// same values laid out as one NHWC image of 1 x B pixels, forward and both gradients.
TEST(LinearCuda, BatchedLinearIsTheChannelsLastPointwiseConv) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  const int64_t B = 2053, in = 64, out = 128;
  for (Precision precision : {Precision::FP32, Precision::TF32}) {
    PrecisionGuard guard(precision);
    const Tensor x0 = random({B, in}, f32, gpu), w0 = random({out, in}, f32, gpu), dy = random({B, out}, f32, gpu);
    Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
    Tensor xc = x0.detach().reshape({1, 1, B, in}).requires_grad_(), wc = w0.detach().reshape({out, in, 1, 1}).requires_grad_();
    Tensor y, yc;
    {
      Tape tape;
      y = linear(x, w);
      tape.backward(y, dy);
    }
    {
      Tape tape;
      yc = conv2d(xc, wc, Tensor(), {.layout = Layout::NHWC});
      tape.backward(yc, dy.reshape({1, 1, B, out}));
    }
    EXPECT_EQ(y.to_vector<float>(), yc.to_vector<float>()) << "forward";
    EXPECT_EQ(x.grad().to_vector<float>(), xc.grad().to_vector<float>()) << "input gradient";
    EXPECT_EQ(w.grad().to_vector<float>(), wc.grad().to_vector<float>()) << "weight gradient";
  }
}

TEST(LinearCuda, PointwiseMatmulRejectsMismatchedShapes) {
  TG_REQUIRE_GPU();
  const Device gpu = Device::cuda();
  Tensor y = Tensor::empty({10, 6}, {.dtype = f32, .device = gpu});
  TG_EXPECT_ERROR(cuda::pointwise_matmul_forward(y, random({10, 5}, f32, gpu), random({7, 5}, f32, gpu), Tensor()),
                  "pointwise_matmul_forward", "[10, 6]", "do not agree");
  TG_EXPECT_ERROR(cuda::pointwise_matmul_grad_weight(y, random({10, 4}, f32, gpu), random({10, 5}, f32, gpu)),
                  "pointwise_matmul_grad_weight", "[10, 6] (K, C)", "do not agree");
}
