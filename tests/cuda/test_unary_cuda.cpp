// The unary and softmax CUDA kernels against the CPU reference: every op and every softmax
// layout (warp per row, block per row, column tiles) forward and backward through the tape
// in f32 against f64 CPU, the kernels called directly into NaN-poisoned outputs in f32 and
// f64, edge values (logits of 1000, -inf in rows), typed device/dtype errors, and tensors
// past 2^31 elements (64-bit offsets).
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "common/cuda_compare.h"
#include "core/cuda_context.h"
#include "ops/cpu/unary_kernels.h"
#include "ops/cuda/unary_kernels.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  const char* name;
  UnaryParams params;
  double lo, hi;  // input range: inside the op's domain, away from kinks
};

std::vector<Case> cases() {
  return {
      {"exp", {.op = UnaryOp::exp}, -3, 3},
      {"log", {.op = UnaryOp::log}, 0.2, 3},
      {"sqrt", {.op = UnaryOp::sqrt}, 0.2, 3},
      {"pow3", {.op = UnaryOp::pow, .exponent = 3.0}, -2, 2},
      {"pow-1.5", {.op = UnaryOp::pow, .exponent = -1.5}, 0.5, 2},
      {"pow0", {.op = UnaryOp::pow, .exponent = 0.0}, -2, 2},
      {"abs", {.op = UnaryOp::abs}, -2, 2},
      {"clamp", {.op = UnaryOp::clamp, .min = -0.5, .max = 0.7}, -2, 2},
      {"clamp_min", {.op = UnaryOp::clamp, .min = 0.3}, -2, 2},
      {"clamp_max", {.op = UnaryOp::clamp, .max = -0.2}, -2, 2},
      {"sigmoid", {.op = UnaryOp::sigmoid}, -6, 6},
      {"tanh", {.op = UnaryOp::tanh}, -3, 3},
      {"gelu", {.op = UnaryOp::gelu}, -4, 4},
      {"gelu_tanh", {.op = UnaryOp::gelu, .approximate = GeluApproximate::tanh}, -4, 4},
      {"silu", {.op = UnaryOp::silu}, -6, 6},
      {"leaky_relu", {.op = UnaryOp::leaky_relu, .negative_slope = 0.2}, -2, 2},
  };
}

// The softmax layouts: (shape, dim) pairs that reach each kernel and its edges.
struct SoftmaxCase {
  Shape shape;
  int64_t dim;
};
std::vector<SoftmaxCase> softmax_cases() {
  return {
      {{37, 129}, 1},         // warp per row, D not a multiple of 32
      {{1000, 5}, -1},        // warp per row, short rows, many lanes idle
      {{6, 1024}, 1},         // the longest warp row
      {{5, 1025}, 1},         // the shortest block row (256 threads)
      {{3, 5000}, 1},         // block row, 512 threads
      {{2, 100003}, -1},      // block row, 1024 threads, long rows
      {{37, 129}, 0},         // columns: inner 129 (5 tiles, the last partial), D 37
      {{3, 5, 7, 9}, 0},      // columns: outer 1
      {{3, 5, 7, 9}, 1},      // columns: D 5 (8 threads along D)
      {{3, 5, 7, 9}, 2},      // columns: inner 9 < 32 (lanes idle)
      {{3, 5, 7, 9}, -1},     // warp per row
      {{2, 100003, 3}, 1},    // columns: long D, few columns
      {{4, 3, 2}, 1},         // columns: D 3 (4 threads along D, one idle)
  };
}

}  // namespace

TEST(CudaUnary, EveryOpMatchesF64CpuThroughTheTape) {
  TG_REQUIRE_GPU();
  manual_seed(101);
  for (const Case& c : cases()) {
    for (Shape s : {Shape{7, 9, 13}, Shape{1000003}}) {
      SCOPED_TRACE(std::string(c.name) + " " + s.str());
      Tensor x = uniform(s, c.lo, c.hi, {.device = kGpu}).requires_grad_();
      Tensor seed = random(s, f32, kGpu);
      const UnaryParams p = c.params;
      expect_matches_f64_cpu([p](const std::vector<Tensor>& in) { return unary(in[0], p); }, {x}, seed, 1e-5);
    }
  }
}

TEST(CudaUnary, KernelsWriteEveryOutput) {
  TG_REQUIRE_GPU();
  manual_seed(102);
  for (DType dt : {f32, f64}) {
    const double tol = dt == f32 ? 1e-6 : 1e-12;
    for (const Case& c : cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const Shape s{7, 9, 13};
      Tensor x = uniform(s, c.lo, c.hi, {.dtype = dt, .device = kGpu});
      Tensor dy = random(s, dt, kGpu);
      Tensor y = poisoned_gpu(s, dt);
      cuda::unary(y, x, c.params);
      Tensor y_ref = Tensor::empty(s, {.dtype = dt});
      cpu::unary(y_ref, x.cpu(), c.params);
      EXPECT_LE(rel_l2(y, y_ref), tol) << "forward";

      // The backward reads y or x, as the op saves.
      const Tensor& saved = unary_saves_output(c.params.op) ? y : x;
      Tensor dx = poisoned_gpu(s, dt);
      cuda::unary_backward(dx, dy, saved, c.params);
      Tensor dx_ref = Tensor::empty(s, {.dtype = dt});
      cpu::unary_backward(dx_ref, dy.cpu(), saved.cpu(), c.params);
      EXPECT_LE(rel_l2(dx, dx_ref), tol) << "backward";
    }
  }
}

TEST(CudaUnary, EdgeValuesMatchTheCpu) {
  TG_REQUIRE_GPU();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = from_vector(std::vector<float>{0.0f, -1.0f, 4.0f, -1000.0f, 1000.0f, -40.0f, 40.0f, 1.0f}, {8});
  std::vector<UnaryParams> ps = {{.op = UnaryOp::log},     {.op = UnaryOp::sqrt}, {.op = UnaryOp::exp},
                                 {.op = UnaryOp::sigmoid}, {.op = UnaryOp::tanh}, {.op = UnaryOp::silu},
                                 {.op = UnaryOp::gelu},    {.op = UnaryOp::gelu, .approximate = GeluApproximate::tanh},
                                 {.op = UnaryOp::pow, .exponent = 0.5},
                                 {.op = UnaryOp::clamp, .min = 2.0, .max = 1.0}};
  for (const UnaryParams& p : ps) {
    SCOPED_TRACE(unary_name(p.op));
    auto got = unary(x.to(kGpu), p).to_vector<float>();
    auto want = unary(x, p).to_vector<float>();
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
      } else if (std::isinf(want[i])) {
        EXPECT_EQ(got[i], want[i]) << i;
      } else {
        EXPECT_NEAR(got[i], want[i], 1e-6 * std::max(1.0f, std::fabs(want[i]))) << i;
      }
    }
  }
  auto c = clamp(from_vector(std::vector<double>{nan, -3.0}, {2}).to(kGpu), -1.0, 1.0).to_vector<double>();
  EXPECT_TRUE(std::isnan(c[0]));
  EXPECT_EQ(c[1], -1.0);
}

TEST(CudaSoftmax, EveryLayoutMatchesF64CpuThroughTheTape) {
  TG_REQUIRE_GPU();
  manual_seed(103);
  for (const SoftmaxCase& l : softmax_cases()) {
    for (bool log : {false, true}) {
      SCOPED_TRACE(l.shape.str() + " dim " + std::to_string(l.dim) + (log ? " log_softmax" : " softmax"));
      Tensor x = uniform(l.shape, -4, 4, {.device = kGpu}).requires_grad_();
      Tensor seed = random(l.shape, f32, kGpu);
      const int64_t dim = l.dim;
      expect_matches_f64_cpu(
          [dim, log](const std::vector<Tensor>& in) { return log ? log_softmax(in[0], dim) : softmax(in[0], dim); },
          {x}, seed, 1e-5);
    }
  }
}

TEST(CudaSoftmax, KernelsWriteEveryOutput) {
  TG_REQUIRE_GPU();
  manual_seed(104);
  for (DType dt : {f32, f64}) {
    const double tol = dt == f32 ? 1e-6 : 1e-12;
    for (const SoftmaxCase& l : softmax_cases()) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(l.shape.str() + " dim " + std::to_string(l.dim) + (log ? " log " : " ") + dtype_name(dt));
        const SoftmaxProblem p = make_softmax_problem("test", l.shape, l.dim, log);
        Tensor x = uniform(l.shape, -4, 4, {.dtype = dt, .device = kGpu});
        Tensor y = poisoned_gpu(l.shape, dt);
        cuda::softmax(y, x, p);
        Tensor y_ref = Tensor::empty(l.shape, {.dtype = dt});
        cpu::softmax(y_ref, x.cpu(), p);
        EXPECT_LE(rel_l2(y, y_ref), tol) << "forward";

        Tensor dy = random(l.shape, dt, kGpu);
        Tensor dx = poisoned_gpu(l.shape, dt);
        cuda::softmax_backward(dx, dy, y, p);
        Tensor dx_ref = Tensor::empty(l.shape, {.dtype = dt});
        cpu::softmax_backward(dx_ref, dy.cpu(), y.cpu(), p);
        EXPECT_LE(rel_l2(dx, dx_ref), tol) << "backward";
      }
    }
  }
}

// More rows (and column tiles) than the grid has warps (blocks): the grid-stride loops over
// rows must cover them all.
TEST(CudaSoftmax, MoreRowsThanTheGrid) {
  TG_REQUIRE_GPU();
  manual_seed(105);
  for (SoftmaxCase l : {SoftmaxCase{{4300001, 2}, 1}, SoftmaxCase{{524300, 2, 2}, 1}}) {
    SCOPED_TRACE(l.shape.str());
    const SoftmaxProblem p = make_softmax_problem("test", l.shape, l.dim, false);
    Tensor x = uniform(l.shape, -4, 4, {.device = kGpu});
    Tensor y = poisoned_gpu(l.shape, f32);
    cuda::softmax(y, x, p);
    Tensor y_ref = Tensor::empty(l.shape);
    cpu::softmax(y_ref, x.cpu(), p);
    EXPECT_LE(rel_l2(y, y_ref), 1e-6);
  }
}

TEST(CudaSoftmax, LargeLogitsAndMinusInfinity) {
  TG_REQUIRE_GPU();
  // Rows at +-1000 (exp would overflow without the max shift), a row with -inf entries, and
  // a row of -inf only (NaN, as on the CPU and in PyTorch); both layouts (dim 1 and dim 0).
  std::vector<float> v = {1000, 1001, 999, 998, -999, -998, -1000, -997, -INFINITY, 0, 1, -INFINITY,
                          -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  Tensor x = from_vector(v, {4, 4});
  for (int64_t dim : {1, 0}) {
    Tensor xd = dim == 1 ? x : x.permute({1, 0}).contiguous();
    for (bool log : {false, true}) {
      SCOPED_TRACE(std::string(log ? "log_softmax" : "softmax") + " dim " + std::to_string(dim));
      auto got = (log ? log_softmax(xd.to(kGpu), dim) : softmax(xd.to(kGpu), dim)).to_vector<float>();
      auto want = (log ? log_softmax(xd, dim) : softmax(xd, dim)).to_vector<float>();
      for (size_t i = 0; i < want.size(); ++i) {
        if (std::isnan(want[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << i;
        } else if (std::isinf(want[i])) {
          EXPECT_EQ(got[i], want[i]) << i;
        } else {
          EXPECT_NEAR(got[i], want[i], 2e-6 * std::max(1.0f, std::fabs(want[i]))) << i;
        }
      }
    }
  }
  // Gradients of a row with -inf entries stay finite on the GPU too.
  Tensor row = from_vector(std::vector<float>{-INFINITY, 0, 1, 2}, {1, 4}).to(kGpu).requires_grad_();
  Tensor lrow = from_vector(std::vector<float>{-INFINITY, 0, 1, 2}, {1, 4}).to(kGpu).requires_grad_();
  {
    Tape tape;
    Tensor w = from_vector(std::vector<float>{1, 2, 3, 4}, {1, 4}).to(kGpu);
    tape.backward(sum(softmax(row, 1) * w) + sum(log_softmax(lrow, 1) * (w * 0.0 + 1.0)));
  }
  for (float g : row.grad().to_vector<float>()) EXPECT_TRUE(std::isfinite(g));
  for (float g : lrow.grad().to_vector<float>()) EXPECT_TRUE(std::isfinite(g));
  EXPECT_EQ(row.grad().to_vector<float>()[0], 0.0f);
}

TEST(CudaUnary, DeviceAndDtypeMismatchesAreTypedErrors) {
  TG_REQUIRE_GPU();
  Tensor g = random({2, 3}, f32, kGpu), c = random({2, 3}, f32);
  const UnaryParams sig{.op = UnaryOp::sigmoid};
  EXPECT_THROW(unary_backward(g, c, sig), DeviceError);
  TG_EXPECT_ERROR(unary_backward(g, c, sig), "sigmoid_backward", "cuda:0", "cpu");
  EXPECT_THROW(unary_backward(g, random({2, 3}, f64, kGpu), sig), DTypeError);
  EXPECT_THROW(softmax_backward(g, softmax(c, 1), 1, false), DeviceError);
  TG_EXPECT_ERROR(softmax_backward(g, softmax(c, 1), 1, false), "softmax_backward", "cuda:0", "cpu");
  // The launchers check before launching.
  EXPECT_THROW(cuda::unary(Tensor::empty({2, 3}), g, sig), DeviceError);
  EXPECT_THROW(cuda::unary(Tensor::empty({2, 3}, {.dtype = f64, .device = kGpu}), g, sig), DTypeError);
  EXPECT_THROW(cuda::unary(Tensor::empty({3, 2}, {.device = kGpu}), g, sig), ShapeError);
  const SoftmaxProblem p = make_softmax_problem("test", g.shape(), 1, true);
  EXPECT_THROW(cuda::softmax(Tensor::empty({2, 3}, {.dtype = f64, .device = kGpu}), g, p), DTypeError);
  EXPECT_THROW(cuda::softmax_backward(Tensor::empty({2, 3}, {.device = kGpu}), g, c, p), DeviceError);
  SoftmaxProblem wrong = p;
  wrong.dim_size = 4;
  EXPECT_THROW(cuda::softmax(Tensor::empty({2, 3}, {.device = kGpu}), g, wrong), ShapeError);
  // Empty tensors launch nothing and fail nothing.
  EXPECT_EQ(softmax(Tensor::empty({0, 5}, {.device = kGpu}), 1).shape(), Shape({0, 5}));
  EXPECT_EQ(gelu(Tensor::empty({0}, {.device = kGpu})).shape(), Shape({0}));
}

// ---- past 2^31 elements: every index and offset is 64-bit ---------------------------------

namespace {

// Copies host values into the tail of a GPU f32 tensor (raw copies run on the legacy
// stream, which does not wait for the framework's: synchronize around them).
void set_tail(const Tensor& t, const std::vector<float>& tail) {
  synchronize(kGpu);
  ASSERT_EQ(cudaMemcpy(t.data<float>() + (t.numel() - static_cast<int64_t>(tail.size())), tail.data(),
                       tail.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  t.bump_version();
}

std::vector<float> tail_of(const Tensor& t, int64_t count) {
  synchronize(kGpu);
  std::vector<float> out(static_cast<size_t>(count));
  EXPECT_EQ(cudaMemcpy(out.data(), t.data<float>() + (t.numel() - count), count * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

}  // namespace

TEST(CudaUnary, ExpPast2To31Elements) {
  TG_REQUIRE_GPU();
  const int64_t n = (int64_t{1} << 31) + 7;
  Tensor x = zeros({n}, {.device = kGpu});
  set_tail(x, {1, 2, 3, 4, 5, 6, 7});  // a kernel that wraps at 2^31 reads zeros here
  Tensor y = poisoned_gpu({n}, f32);
  cuda::unary(y, x, {.op = UnaryOp::exp});
  EXPECT_NEAR(sum(y).item(), double(n - 7) + std::exp(1.0) * (std::exp(7.0) - 1.0) / (std::exp(1.0) - 1.0),
              1e-6 * double(n));  // NaN (an unwritten element) fails too
  auto t = tail_of(y, 8);
  EXPECT_EQ(t[0], 1.0f);  // element 2^31 - 1
  for (int i = 1; i < 8; ++i) EXPECT_NEAR(t[i], std::exp(double(i)), 1e-6 * std::exp(double(i))) << i;
}

TEST(CudaSoftmax, RowsPast2To31Elements) {
  TG_REQUIRE_GPU();
  // Each layout over 2^31 + small elements: a block row, many warp rows, column tiles.
  for (SoftmaxCase l : {SoftmaxCase{{3, (int64_t{1} << 31) / 3 + 5}, 1}, SoftmaxCase{{(int64_t{1} << 29) + 3, 4}, 1},
                   SoftmaxCase{{2, 4, (int64_t{1} << 28) + 1}, 1}}) {
    SCOPED_TRACE(l.shape.str());
    Tensor x = zeros(l.shape, {.device = kGpu});
    ASSERT_GT(x.numel(), int64_t{1} << 31);
    const SoftmaxProblem p = make_softmax_problem("test", l.shape, l.dim, false);
    // The last element of the last row is 1, the rest 0: its row's values are known exactly.
    set_tail(x, {1.0f});
    Tensor y = poisoned_gpu(l.shape, f32);
    cuda::softmax(y, x, p);
    // Every row sums to 1: also false for an unwritten (NaN) element anywhere.
    EXPECT_NEAR(sum(y).item(), double(p.rows()), 1e-5 * double(p.rows()));
    const double D = double(p.dim_size), e = std::exp(1.0);
    EXPECT_NEAR(tail_of(y, 1)[0], e / (D - 1 + e), 1e-6 * e / (D - 1 + e));
    y = Tensor();
    // Backward of the same problem, dy = 1 everywhere: sum(dy y) = 1, so dx = y (1 - 1) = 0.
    Tensor yy = Tensor::empty(l.shape, {.device = kGpu});
    cuda::softmax(yy, x, p);
    x = Tensor();
    Tensor dy = ones(l.shape, {.device = kGpu});
    Tensor dx = poisoned_gpu(l.shape, f32);
    cuda::softmax_backward(dx, dy, yy, p);
    EXPECT_NEAR(sum(dx).item(), 0.0, 1e-3);
    EXPECT_NEAR(tail_of(dx, 1)[0], 0.0, 1e-6);
  }
}
