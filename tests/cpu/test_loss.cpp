// mse_loss and cross_entropy on the CPU: values against direct loops, gradients against
// central differences, numerical stability for large logits, and the error paths.
#include <cmath>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

double cross_entropy_loop(const Tensor& logits, const std::vector<int64_t>& t) {
  auto x = logits.to_vector<double>();
  const int64_t N = logits.size(0), K = logits.size(1);
  double total = 0;
  for (int64_t r = 0; r < N; ++r) {
    double z = 0;
    for (int64_t j = 0; j < K; ++j) z += std::exp(x[r * K + j]);
    total += -std::log(std::exp(x[r * K + t[r]]) / z);
  }
  return total / double(N);
}

Tensor class_indices(const std::vector<int64_t>& v) { return from_vector(v, {int64_t(v.size())}); }

}  // namespace

TEST(MseLoss, ValuesMatchLoop) {
  Tensor p = random({7, 9, 13}), t = random({7, 9, 13});
  Tensor l = mse_loss(p, t);
  EXPECT_EQ(l.shape(), Shape{});
  auto vp = p.to_vector<double>(), vt = t.to_vector<double>();
  double acc = 0;
  for (size_t i = 0; i < vp.size(); ++i) acc += (vp[i] - vt[i]) * (vp[i] - vt[i]);
  EXPECT_NEAR(l.item(), acc / double(vp.size()), 1e-14);
}

TEST(MseLoss, MseLossGrad) {
  Tensor p = param({7, 9}), t = param({7, 9});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1]); },
                      std::vector<Tensor>({p, t}));
  Tensor fixed = random({7, 9});
  TG_EXPECT_GRADCHECK([fixed](const std::vector<Tensor>& in) { return mse_loss(in[0], fixed); },
                      std::vector<Tensor>({p}));
}

TEST(MseLoss, GradientIsTwiceTheErrorOverN) {
  Tensor p = param({3, 5}), t = random({3, 5});
  {
    Tape tape;
    tape.backward(mse_loss(p, t));
  }
  auto g = p.grad().to_vector<double>(), vp = p.to_vector<double>(), vt = t.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], 2.0 * (vp[i] - vt[i]) / 15.0, 1e-15);
}

TEST(MseLoss, BadArgumentsAreRejected) {
  TG_EXPECT_ERROR(mse_loss(random({4, 3}), random({4, 2})), "mse_loss: prediction [4, 3] and target [4, 2] differ");
  TG_EXPECT_ERROR(mse_loss(random({4, 3}), random({4, 3}, f32)), "mse_loss", "dtypes differ");
  TG_EXPECT_ERROR(mse_loss(random({0, 3}), random({0, 3})), "mse_loss", "empty");
  TG_EXPECT_ERROR(mse_loss(random({4}), Tensor()), "mse_loss", "undefined");
}

TEST(CrossEntropy, ValuesMatchLoop) {
  Tensor x = random({7, 13});
  std::vector<int64_t> t = {0, 12, 5, 3, 3, 11, 7};
  Tensor l = cross_entropy(x, class_indices(t));
  EXPECT_EQ(l.shape(), Shape{});
  EXPECT_NEAR(l.item(), cross_entropy_loop(x, t), 1e-13);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  // exp(1000) overflows a double; log-sum-exp must not. Shifting every row changes nothing.
  Tensor x = random({5, 9});
  std::vector<int64_t> t = {1, 0, 8, 4, 4};
  double base = cross_entropy(x, class_indices(t)).item();
  double shifted = cross_entropy(x + 1000.0, class_indices(t)).item();
  EXPECT_TRUE(std::isfinite(shifted));
  EXPECT_NEAR(shifted, base, 1e-10);
  Tensor xf = x.to(f32) - 200.0f;  // exp(-200) underflows f32
  EXPECT_NEAR(cross_entropy(xf, class_indices(t)).item(), base, 1e-5);
}

TEST(CrossEntropy, CrossEntropyGrad) {
  Tensor x = param({7, 13});
  Tensor t = class_indices({0, 12, 5, 3, 3, 11, 7});
  TG_EXPECT_GRADCHECK([t](const std::vector<Tensor>& in) { return cross_entropy(in[0], t); },
                      std::vector<Tensor>({x}));
  Tensor one = param({1, 1});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return cross_entropy(in[0], class_indices({0})); },
                      std::vector<Tensor>({one}));
}

TEST(CrossEntropy, GradientIsSoftmaxMinusOneHotOverN) {
  Tensor x = param({4, 6});
  std::vector<int64_t> t = {5, 0, 2, 2};
  {
    Tape tape;
    tape.backward(cross_entropy(x, class_indices(t)));
  }
  auto g = x.grad().to_vector<double>(), vx = x.to_vector<double>();
  for (int r = 0; r < 4; ++r) {
    double z = 0;
    for (int j = 0; j < 6; ++j) z += std::exp(vx[r * 6 + j]);
    for (int j = 0; j < 6; ++j)
      EXPECT_NEAR(g[r * 6 + j], (std::exp(vx[r * 6 + j]) / z - (j == t[r])) / 4.0, 1e-15);
  }
}

TEST(CrossEntropy, BadArgumentsAreRejected) {
  Tensor x = random({4, 5});
  TG_EXPECT_ERROR(cross_entropy(x, class_indices({0, 1, 5, 2})), "cross_entropy: target 5 at row 2 is out of range [0, 5)");
  TG_EXPECT_ERROR(cross_entropy(x, class_indices({0, -1, 1, 2})), "cross_entropy: target -1 at row 1");
  TG_EXPECT_ERROR(cross_entropy(x, random({4})), "cross_entropy: targets must be i64", "f64[4]");
  TG_EXPECT_ERROR(cross_entropy(x, class_indices({0, 1, 2})), "cross_entropy: logits [4, 5] have 4 rows but targets [3]");
  TG_EXPECT_ERROR(cross_entropy(x, from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4, 1})), "targets [4, 1]");
  TG_EXPECT_ERROR(cross_entropy(random({20}), class_indices({0})), "cross_entropy: logits must be (N, classes)", "[20]");
  TG_EXPECT_ERROR(cross_entropy(random({0, 5}), class_indices({})), "cross_entropy: empty logits");
}
