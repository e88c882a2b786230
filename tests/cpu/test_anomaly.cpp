// Anomaly mode: the first op on a tape whose output holds NaN/Inf, and the first gradient
// with NaN/Inf in backward, raise tg::Error naming the op; a NaN/Inf already in an input
// from outside the tape is reported as that input's; off, nothing is checked.
#include <limits>

#include "autograd/anomaly.h"
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

TEST(Anomaly, OffByDefaultAndGuardRestores) {
  EXPECT_FALSE(detect_anomaly());
  {
    DetectAnomalyGuard on;
    EXPECT_TRUE(detect_anomaly());
    {
      DetectAnomalyGuard off(false);
      EXPECT_FALSE(detect_anomaly());
    }
    EXPECT_TRUE(detect_anomaly());
  }
  EXPECT_FALSE(detect_anomaly());
  set_detect_anomaly(true);
  EXPECT_TRUE(detect_anomaly());
  set_detect_anomaly(false);
}

TEST(Anomaly, FirstNonFiniteFindsNaNAndInf) {
  EXPECT_EQ(first_non_finite(from_vector(std::vector<float>{1, 2, 3}, {3})), -1);
  EXPECT_EQ(first_non_finite(from_vector(std::vector<double>{1, kNaN, kInf}, {3})), 1);
  EXPECT_EQ(first_non_finite(from_vector(std::vector<float>{1, 2, float(-kInf)}, {3})), 2);
  EXPECT_EQ(first_non_finite(from_vector(std::vector<int64_t>{1, 2}, {2})), -1);
  EXPECT_EQ(first_non_finite(zeros({0, 4})), -1);
  EXPECT_EQ(first_non_finite(Tensor()), -1);
}

TEST(Anomaly, ForwardNamesTheOpAndTheOutput) {
  DetectAnomalyGuard on;
  Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  Tensor b = from_vector(std::vector<float>{1, 0, 2}, {3});
  Tape tape;
  Tensor ok = mul(a, b);  // finite: no complaint
  TG_EXPECT_ERROR(div(a, b), "anomaly: forward of 'div' produced NaN/Inf in output 0 f32[2, 3] on cpu",
                  "element 1 is inf");
  // The failed op was not recorded; the ones before it were.
  ASSERT_EQ(tape.entries().size(), 1u);
  EXPECT_EQ(tape.entries()[0].op, "mul");
}

TEST(Anomaly, ForwardNaNIsReportedAsNaN) {
  DetectAnomalyGuard on;
  Tensor a = from_vector(std::vector<double>{0, 1}, {2}).requires_grad_();
  Tape tape;
  TG_EXPECT_ERROR(div(a, a), "forward of 'div'", "output 0 f64[2] on cpu", "element 0 is nan");
}

// A NaN already in a leaf is the leaf's, not the first op's that passed it on.
TEST(Anomaly, NonFiniteLeafIsReportedAsAnInput) {
  DetectAnomalyGuard on;
  Tensor a = from_vector(std::vector<float>{1, float(kNaN), 3}, {3}).requires_grad_();
  Tensor b = from_vector(std::vector<float>{1, 2, 3}, {3}).requires_grad_();
  Tape tape;
  TG_EXPECT_ERROR(mul(b, a), "anomaly: leaf input 1 of 'mul' f32[3] on cpu already held NaN/Inf",
                  "element 1 is nan", "not the output of an op");
  EXPECT_TRUE(tape.entries().empty());
}

// Data that needs no gradient is an input too.
TEST(Anomaly, NonFiniteDataIsReportedAsAnInput) {
  DetectAnomalyGuard on;
  Tensor x = from_vector(std::vector<double>{kInf, 1}, {1, 2});
  Tensor w = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tape tape;
  TG_EXPECT_ERROR(matmul(x, w), "leaf input 0 of 'matmul' f64[1, 2] on cpu", "element 0 is inf",
                  "not the output of an op");
}

// A tensor of an ended tape (recorded while anomaly mode was off) is an input here.
TEST(Anomaly, NonFiniteTensorOfAnotherTapeIsReportedAsAnInput) {
  Tensor a = from_vector(std::vector<double>{-1, 4}, {2}).requires_grad_();
  Tensor h;
  {
    Tape first;
    h = div(a, zeros({2}, {.dtype = f64}));
  }
  DetectAnomalyGuard on;
  Tape second;
  TG_EXPECT_ERROR(mul(h, 2.0), "anomaly: input 0 of 'affine' f64[2] on cpu already held NaN/Inf",
                  "element 0 is -inf", "recorded on another tape");
}

// Inputs recorded on this tape were scanned as outputs: the op that made the NaN is blamed.
TEST(Anomaly, NaNMadeOnTheTapeBlamesItsOp) {
  Tensor a = from_vector(std::vector<double>{0, 1}, {2}).requires_grad_();
  Tape tape;
  Tensor h = div(a, a);  // 0/0, recorded with anomaly mode off
  DetectAnomalyGuard on;
  TG_EXPECT_ERROR(mul(h, 2.0), "forward of 'affine' produced NaN/Inf in output 0");
}

// Autocast's half results are scanned too: the f16 product overflows where it is made (on
// the CPU, in the cast that ends the f32 matmul), before anything carries the inf on.
TEST(Anomaly, HalfResultsAreScanned) {
  EXPECT_EQ(first_non_finite(from_vector(std::vector<float>{1, 70000, 2}, {3}).to(DType::f16)), 1);
  EXPECT_EQ(first_non_finite(from_vector(std::vector<float>{1, 2}, {2}).to(DType::bf16)), -1);
  DetectAnomalyGuard on;
  Tensor w = from_vector(std::vector<float>{300, 300}, {2, 1}).requires_grad_();
  Tensor x = full({1, 2}, 300.0);
  Tape tape;
  Autocast f16(DType::f16);
  TG_EXPECT_ERROR(matmul(x, w), "produced NaN/Inf in output 0 f16[1, 1]", "element 0 is inf");
}

TEST(Anomaly, OnlyOpsOnATapeAreScanned) {
  DetectAnomalyGuard on;
  Tensor a = from_vector(std::vector<float>{1, 2}, {2});
  Tensor z = zeros({2});
  EXPECT_NO_THROW(div(a, z));  // no tape
  Tape tape;
  EXPECT_NO_THROW(div(a, z));  // no input requires grad: not recorded, not scanned
}

TEST(Anomaly, OffMeansNoChecks) {
  Tensor a = from_vector(std::vector<float>{1, 2}, {2}).requires_grad_();
  Tape tape;
  Tensor y = div(a, zeros({2}));
  EXPECT_TRUE(std::isinf(y.to_vector<float>()[0]));
}

// y = a / b: the quotient (1e35) and the loss are finite in f32, but b's gradient
// -a / b^2 = -1e40 overflows to -inf. The forward pass is clean, backward is not.
TEST(Anomaly, BackwardNamesTheOpAndTheInput) {
  DetectAnomalyGuard on;
  Tensor a = from_vector(std::vector<float>{1e30f, 1.f, 2.f}, {3}).requires_grad_();
  Tensor b = from_vector(std::vector<float>{1e-5f, 2.f, 4.f}, {3}).requires_grad_();
  Tape tape;
  Tensor loss = sum(div(a, b));
  ASSERT_TRUE(std::isfinite(loss.item()));
  TG_EXPECT_ERROR(tape.backward(loss), "anomaly: backward of 'div' produced NaN/Inf in the gradient of input 1",
                  "f32[3] on cpu", "element 0 is -inf");
}

// An Inf arriving from outside (the seed) is reported by the first op that passes it on.
TEST(Anomaly, BackwardReportsTheFirstOpReached) {
  DetectAnomalyGuard on;
  manual_seed(4);
  Tensor x = randn({2, 5}, {.dtype = f64}).requires_grad_();
  Tape tape;
  Tensor y = relu(mul(x, 2.0));
  Tensor seed = full({2, 5}, kInf, {.dtype = f64});
  TG_EXPECT_ERROR(tape.backward(y, seed), "anomaly: backward of 'relu'", "gradient of input 0", "f64[2, 5]");
}

TEST(Anomaly, CleanTrainingStepPasses) {
  DetectAnomalyGuard on;
  manual_seed(1);
  nn::Sequential model;
  model.add(std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 2, .out_channels = 4, .kernel_size = 3}));
  model.add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 2, .num_channels = 4}));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::MeanPool>());
  model.add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 3}));
  Tensor x = randn({3, 2, 7, 9});
  Tensor t = from_vector(std::vector<int64_t>{0, 2, 1}, {3});
  Tape tape;
  Tensor loss = cross_entropy(model(x), t);
  EXPECT_NO_THROW(tape.backward(loss));
  for (const Tensor& p : model.parameters()) EXPECT_TRUE(p.grad().defined());
}
