// Elementwise ops, reductions and shape ops on the CPU: values against direct loops,
// gradients against central differences.
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

TEST(Elementwise, AddBroadcastsChannelBias) {
  Tensor x = random({2, 3, 4, 5});
  Tensor b = random({3, 1, 1});
  Tensor y = add(x, b);
  auto vx = x.to_vector<double>(), vb = b.to_vector<double>(), vy = y.to_vector<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t c = (i / 20) % 3;
    EXPECT_DOUBLE_EQ(vy[i], vx[i] + vb[c]);
  }
}

TEST(Elementwise, BinaryGrad) {
  Tensor a = param({2, 3, 5}), b = param({3, 1});
  using Binary = Tensor (*)(const Tensor&, const Tensor&);
  for (Binary op : {Binary(add), Binary(sub), Binary(mul)}) {
    TG_EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return op(in[0], in[1]); },
                        std::vector<Tensor>({a, b}));
  }
  Tensor d = uniform({3, 1}, 0.5, 2.0, {.dtype = f64}).requires_grad_();
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return div(in[0], in[1]); },
                      std::vector<Tensor>({a, d}));
}

TEST(Elementwise, ScalarAndReluGrad) {
  Tensor a = param({7, 9});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return relu(in[0] * 3.0 - 0.5); },
                      std::vector<Tensor>({a}));
}

TEST(Elementwise, ReluValues) {
  Tensor x = from_vector(std::vector<double>{-1.5, 0.0, 2.5}, {3});
  EXPECT_EQ(relu(x).to_vector<double>(), (std::vector<double>{0.0, 0.0, 2.5}));
}

TEST(Elementwise, MismatchedShapesAreRejected) {
  TG_EXPECT_ERROR(add(random({2, 3}), random({4})), "add", "[2, 3]", "[4]");
  TG_EXPECT_ERROR(mul(random({2}), random({2}, f32)), "mul", "f64[2]", "f32[2]");
}

TEST(Reduce, SumOverDimsMatchesLoop) {
  Tensor x = random({3, 4, 5});
  Tensor s = sum(x, {0, 2}, true);
  ASSERT_EQ(s.shape(), Shape({1, 4, 1}));
  auto vx = x.to_vector<double>(), vs = s.to_vector<double>();
  for (int j = 0; j < 4; ++j) {
    double acc = 0;
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 5; ++k) acc += vx[(i * 4 + j) * 5 + k];
    EXPECT_NEAR(vs[j], acc, 1e-12);
  }
  EXPECT_NEAR(mean(x).item(), sum(x).item() / 60.0, 1e-12);
  EXPECT_EQ(sum(x, {-1}).shape(), Shape({3, 4}));
}

TEST(Reduce, SumMeanGrad) {
  Tensor x = param({3, 5, 7});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return sum(in[0], {1}); }, std::vector<Tensor>({x}));
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return mean(in[0], {0, 2}, true); },
                      std::vector<Tensor>({x}));
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return mean(in[0]); }, std::vector<Tensor>({x}));
}

TEST(Reduce, BadDimsAreRejected) {
  TG_EXPECT_ERROR(sum(random({2, 3}), {2}), "sum", "dim 2", "[2, 3]");
  TG_EXPECT_ERROR(mean(random({2, 3}), {1, -1}), "mean", "twice");
}

TEST(ShapeOps, PermuteAndReshape) {
  Tensor x = random({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});
  ASSERT_EQ(p.shape(), Shape({4, 2, 3}));
  auto vx = x.to_vector<double>(), vp = p.to_vector<double>();
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c) EXPECT_EQ(vp[(c * 2 + a) * 3 + b], vx[(a * 3 + b) * 4 + c]);
  Tensor r = x.reshape({6, -1});
  EXPECT_EQ(r.shape(), Shape({6, 4}));
  EXPECT_EQ(r.raw_data(), x.raw_data());  // a view
  TG_EXPECT_ERROR(x.reshape({5, -1}), "reshape", "[5, -1]");
}

TEST(ShapeOps, PermuteReshapeGrad) {
  Tensor x = param({2, 3, 4});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].permute({1, 2, 0}).reshape({4, 6}) * 2.0; },
                      std::vector<Tensor>({x}));
}

TEST(Tensor, FactoriesAreSeededAndReproducible) {
  manual_seed(7);
  auto a = randn({100}).to_vector<float>();
  manual_seed(7);
  auto b = randn({100}).to_vector<float>();
  EXPECT_EQ(a, b);
  auto c = randn({100}).to_vector<float>();
  EXPECT_NE(a, c);
  double m = 0, v = 0;
  auto big = randn({20000}, {.dtype = f64}).to_vector<double>();
  for (double x : big) m += x;
  m /= big.size();
  for (double x : big) v += (x - m) * (x - m);
  v /= big.size();
  EXPECT_NEAR(m, 0.0, 0.03);
  EXPECT_NEAR(v, 1.0, 0.05);
  EXPECT_EQ(arange(4).to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(full({2}, 3.5).to_vector<float>(), (std::vector<float>{3.5f, 3.5f}));
}

TEST(Tensor, PrintsShapeDtypeDeviceValues) {
  std::ostringstream os;
  os << from_vector(std::vector<float>{1, 2, 3}, {3});
  EXPECT_EQ(os.str(), "Tensor(f32[3] on cpu, values [1, 2, 3])");
  TG_EXPECT_ERROR(Tensor::empty({1, 1, 1, 1, 1, 1, 1}), "more than 6");
}

// Integer labels stay integers (and doubles doubles) when only the device is given; an explicit
// dtype converts. (Before, {.device = d} meant f32 and cross_entropy rejected the "labels".)
TEST(Tensor, FromVectorKeepsTheValuesDtypeUnlessTold) {
  const Tensor labels = from_vector(std::vector<int64_t>{3, -1, int64_t{1} << 40}, {3}, {.device = Device::cpu()});
  EXPECT_EQ(labels.dtype(), DType::i64);
  EXPECT_EQ(labels.to_vector<int64_t>(), (std::vector<int64_t>{3, -1, int64_t{1} << 40}));
  const Tensor exact = from_vector(std::vector<double>{1.0 / 3}, {1}, {.device = Device::cpu()});
  EXPECT_EQ(exact.dtype(), DType::f64);
  EXPECT_EQ(exact.to_vector<double>()[0], 1.0 / 3);
  const Tensor converted = from_vector(std::vector<int64_t>{2, 5}, {2}, {.dtype = DType::f32});
  EXPECT_EQ(converted.dtype(), DType::f32);
  EXPECT_EQ(converted.to_vector<float>(), (std::vector<float>{2.f, 5.f}));
  const TensorOptions named{.dtype = DType::f64};  // a TensorOptions says its dtype
  EXPECT_EQ(from_vector(std::vector<int64_t>{7}, {1}, named).dtype(), DType::f64);
}
