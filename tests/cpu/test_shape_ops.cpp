// The shape ops (cat, split, chunk, narrow, slice, flatten, unflatten) on the CPU: values
// against direct index loops written here, gradients against central differences in f64 at
// odd shapes, and the typed errors. Pooling: test_pool.cpp.
#include <cmath>
#include <numeric>

#include "common/test_util.h"
#include "ops/cpu/shape_pool_kernels.h"

using namespace tg;
using namespace tg::test;

namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// Row-major multi-index <-> flat index.
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(static_cast<size_t>(s.rank()));
  for (int64_t d = s.rank() - 1; d >= 0; --d) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}
int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t i = 0;
  for (int64_t d = 0; d < s.rank(); ++d) i = i * s[d] + idx[d];
  return i;
}

// y must equal x at positions start + j * step along dim.
void expect_window(const Tensor& y, const Tensor& x, int64_t dim, int64_t start, int64_t step) {
  auto vx = values(x), vy = values(y);
  ASSERT_EQ(static_cast<int64_t>(vy.size()), y.numel());
  for (int64_t i = 0; i < y.numel(); ++i) {
    auto idx = unravel(i, y.shape());
    idx[dim] = start + idx[dim] * step;
    ASSERT_EQ(vy[i], vx[ravel(idx, x.shape())]) << "element " << i << " of " << y.shape();
  }
}

}  // namespace

// ---- shape ops -----------------------------------------------------------------------------

TEST(ShapeOps, CatMatchesDirectLoopsOnEveryDim) {
  manual_seed(41);
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    std::vector<Tensor> parts;
    for (int64_t len : {2, 5, 1, 0}) {
      std::vector<int64_t> s = {3, 4, 7};
      s[d] = len;
      parts.push_back(random(Shape(s)));
    }
    Tensor y = cat(parts, dim);
    ASSERT_EQ(y.size(d), 8);
    int64_t offset = 0;
    for (const Tensor& p : parts) {
      expect_window(narrow(y, dim, offset, p.size(d)), p, d, 0, 1);
      expect_window(p, y, d, offset, 1);
      offset += p.size(d);
    }
  }
  // One input: a copy, not the same buffer.
  Tensor x = random({3, 4});
  Tensor c = cat({x}, 1);
  EXPECT_NE(c.raw_data(), x.raw_data());
  EXPECT_EQ(values(c), values(x));
}

TEST(ShapeOps, SplitAndChunkFollowPyTorch) {
  manual_seed(42);
  Tensor x = random({5, 13, 3});
  auto sizes_of = [](const std::vector<Tensor>& v) {
    std::vector<int64_t> s;
    for (const Tensor& t : v) s.push_back(t.size(1));
    return s;
  };
  EXPECT_EQ(sizes_of(split(x, 4, 1)), (std::vector<int64_t>{4, 4, 4, 1}));
  EXPECT_EQ(sizes_of(split(x, 13, 1)), (std::vector<int64_t>{13}));
  EXPECT_EQ(sizes_of(split(x, 20, -2)), (std::vector<int64_t>{13}));
  EXPECT_EQ(sizes_of(split(x, {2, 0, 11}, 1)), (std::vector<int64_t>{2, 0, 11}));
  EXPECT_EQ(sizes_of(chunk(x, 4, 1)), (std::vector<int64_t>{4, 4, 4, 1}));  // ceil(13 / 4) = 4
  EXPECT_EQ(sizes_of(chunk(x, 6, 1)), (std::vector<int64_t>{3, 3, 3, 3, 1}));  // fewer than 6
  EXPECT_EQ(sizes_of(chunk(x, 13, 1)), std::vector<int64_t>(13, 1));
  EXPECT_EQ(chunk(x, 2, 0).size(), 2u);
  int64_t offset = 0;
  for (const Tensor& p : split(x, {2, 0, 11}, 1)) {
    expect_window(p, x, 1, offset, 1);
    offset += p.size(1);
  }
  EXPECT_EQ(values(cat(chunk(x, 3, 2), 2)), values(x));
}

TEST(ShapeOps, SliceAndNarrowFollowPythonRules) {
  manual_seed(43);
  Tensor x = random({5, 13, 3});
  struct S {
    int64_t start, end, step, want_start, want_len;
  };
  for (S s : {S{1, 12, 3, 1, 4}, S{-9, -1, 2, 4, 4}, S{-100, 100, 5, 0, 3}, S{8, 3, 1, 8, 0}, S{0, 13, 1, 0, 13},
              S{12, 13, 7, 12, 1}, S{13, 20, 1, 13, 0}}) {
    Tensor y = slice(x, 1, s.start, s.end, s.step);
    ASSERT_EQ(y.shape(), Shape({5, s.want_len, 3})) << s.start << ":" << s.end << ":" << s.step;
    expect_window(y, x, 1, s.want_start, s.step);
  }
  expect_window(slice(x, -1, 1), x, 2, 1, 1);
  EXPECT_EQ(values(narrow(x, 2, -2, 2)), values(slice(x, 2, 1, 3)));
  EXPECT_EQ(values(narrow(x, 0, 4, 1)), values(slice(x, 0, 4, 5)));
  EXPECT_EQ(narrow(x, 1, 13, 0).shape(), Shape({5, 0, 3}));
}

TEST(ShapeOps, FlattenAndUnflattenAreViews) {
  Tensor x = random({2, 3, 5, 7});
  Tensor f = flatten(x, 1);
  EXPECT_EQ(f.shape(), Shape({2, 105}));
  EXPECT_EQ(f.raw_data(), x.raw_data());
  EXPECT_EQ(flatten(x).shape(), Shape({210}));
  EXPECT_EQ(flatten(x, -3, -2).shape(), Shape({2, 15, 7}));
  EXPECT_EQ(flatten(x, 2, 2).shape(), x.shape());
  EXPECT_EQ(flatten(full({}, 2.0)).shape(), Shape({1}));
  Tensor u = unflatten(f, 1, {3, -1, 7});
  EXPECT_EQ(u.shape(), x.shape());
  EXPECT_EQ(u.raw_data(), x.raw_data());
  EXPECT_EQ(unflatten(x, -1, {7, 1}).shape(), Shape({2, 3, 5, 7, 1}));
  EXPECT_EQ(values(u), values(x));
}

TEST(ShapeOps, GradcheckAtOddShapes) {
  manual_seed(44);
  Tensor a = param({3, 2, 7}), b = param({3, 5, 7}), c = param({3, 1, 7});
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[2]}, -2) * 1.5; },
                      std::vector<Tensor>({a, b, c}));
  // The same tensor twice: its gradient is the sum of both windows'.
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[0]}, 1); },
                      std::vector<Tensor>({a, b}));
  Tensor x = param({3, 13, 5});
  // Pieces used out of order, one unused (its gradient must be zero, not missing).
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) {
    auto parts = split(in[0], {4, 2, 7}, 1);
    return cat({parts[2] * 2.0, parts[0]}, 1);
  }, std::vector<Tensor>({x}));
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return chunk(in[0], 3, 1)[0] * chunk(in[0], 3, 1)[1]; },
                      std::vector<Tensor>({x}));
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return slice(in[0], 1, -12, 13, 3); },
                      std::vector<Tensor>({x}));
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return narrow(in[0], 0, 1, 2); }, std::vector<Tensor>({x}));
  TG_EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return unflatten(flatten(in[0], 1) * 3.0, 1, {5, 13}); },
                      std::vector<Tensor>({x}));

  // The unused piece and the skipped rows get exact zeros.
  x = param({3, 13, 5});
  Tape tape;
  auto parts = split(x, {4, 2, 7}, 1);
  tape.backward(sum(parts[0]) + sum(slice(parts[2], 1, 0, 7, 3)));
  auto g = values(x.grad());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t j = unravel(i, x.shape())[1];
    const bool used = j < 4 || (j >= 6 && (j - 6) % 3 == 0);
    EXPECT_EQ(g[i], used ? 1.0 : 0.0) << "row " << j;
  }
}

TEST(ShapeOps, ErrorsAreTypedAndNameTheOp) {
  Tensor x = random({3, 5, 7});
  EXPECT_THROW(cat({}, 0), ShapeError);
  TG_EXPECT_ERROR(cat({x, random({3, 4, 6})}, 1), "cat", "tensor 1", "f64[3, 4, 6]", "f64[3, 5, 7]");
  EXPECT_THROW(cat({x, random({3, 5})}, 0), ShapeError);
  EXPECT_THROW(cat({x, random({3, 5, 7}, f32)}, 0), DTypeError);
  TG_EXPECT_ERROR(cat({x, x}, 3), "cat", "dim 3", "[3, 5, 7]");
  EXPECT_THROW(cat({x, x}, -4), ShapeError);
  TG_EXPECT_ERROR(cat({full({}, 1.0)}, 0), "cat", "zero-dimensional");
  EXPECT_THROW(split(x, {2, 2}, 1), ShapeError);
  TG_EXPECT_ERROR(split(x, {2, 2}, 1), "split", "[2, 2]", "sum to 4", "(5)");
  TG_EXPECT_ERROR(split(x, {6, -1}, 1), "split", "negative");
  TG_EXPECT_ERROR(split(x, 0, 1), "split", "split_size 0");
  TG_EXPECT_ERROR(split(x, 2, 5), "split", "dim 5");
  TG_EXPECT_ERROR(chunk(x, 0, 1), "chunk", "positive");
  EXPECT_THROW(narrow(x, 1, 3, 3), ShapeError);
  TG_EXPECT_ERROR(narrow(x, 1, 3, 3), "narrow", "exceeds", "[3, 5, 7]");
  TG_EXPECT_ERROR(narrow(x, 1, -6, 1), "narrow", "start -6");
  TG_EXPECT_ERROR(narrow(x, 1, 0, -1), "narrow");
  EXPECT_THROW(slice(x, 1, 0, 5, 0), ShapeError);
  TG_EXPECT_ERROR(slice(x, 1, 0, 5, -1), "slice", "step", "positive");
  TG_EXPECT_ERROR(slice(x, -4), "slice", "dim -4");
  TG_EXPECT_ERROR(flatten(x, 2, 1), "flatten", "start_dim 2", "end_dim 1");
  EXPECT_THROW(flatten(x, 0, 3), ShapeError);
  TG_EXPECT_ERROR(unflatten(x, 1, {2, 3}), "unflatten", "[2, 3]", "(size 5)");
  TG_EXPECT_ERROR(unflatten(x, 1, {-1, -1}), "unflatten", "-1");
  TG_EXPECT_ERROR(unflatten(x, 2, {-1, 3}), "unflatten", "infer");
  TG_EXPECT_ERROR(unflatten(x, 0, {1, 1, 1, 1, 3}), "unflatten", "more than 6");

  // The kernels check their buffers against the window before touching memory.
  const SliceProblem p = make_slice_problem("test", x.shape(), 1, 0, 3, 2);
  EXPECT_EQ(p.outer, 3);
  EXPECT_EQ(p.inner, 7);
  EXPECT_THROW(cpu::slice_gather(Tensor::empty({3, 4, 7}, {.dtype = f64}), x, p), ShapeError);
  EXPECT_THROW(cpu::slice_gather(Tensor::empty({3, 3, 7}), x, p), DTypeError);
  SliceProblem past = p;
  past.step = 3;  // 0 + 2 * 3 = 6 > 4
  EXPECT_THROW(cpu::slice_scatter(x, Tensor::empty({3, 3, 7}, {.dtype = f64}), past), ShapeError);
  TG_EXPECT_ERROR(make_slice_problem("test", x.shape(), 1, 2, 2, 3), "test", "ends past");
}
