// The process group's collectives against closed-form results, on every rank, for each
// dtype, at odd sizes; CPU tensors through MPI, CUDA tensors (--gpu) through NCCL. Also the
// checks that run before any communication (dtype, shape, agreement between ranks).
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "dist_test_main.h"
#include "ops/elementwise.h"

using namespace tg;
using namespace tg::test;

namespace {

// Rank r's element i: distinct per rank and index, exact in every dtype (small integers,
// halves): value(r, i) = (r + 1) * (i % 97 + 1) + 0.5 * r (the half dropped for i64).
double value(int r, int64_t i, DType dt) {
  const double v = (r + 1.0) * static_cast<double>(i % 97 + 1);
  return dt == DType::i64 ? v : v + 0.5 * r;
}

Tensor rank_tensor(const Shape& shape, DType dt, int r) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = value(r, static_cast<int64_t>(i), dt);
  return from_vector(v, shape, {.dtype = DType::f64}).to(dt).to(test_device());
}

std::vector<double> host(const Tensor& t) { return t.to(DType::f64).to_vector<double>(); }

const std::vector<DType> kDTypes = {DType::f32, DType::f64, DType::i64};

}  // namespace

TEST(DistCollectives, AllReduceSumAvgMaxMin) {
  const int S = group().size(), me = group().rank();
  for (DType dt : kDTypes) {
    for (dist::ReduceOp op : {dist::ReduceOp::sum, dist::ReduceOp::avg, dist::ReduceOp::max, dist::ReduceOp::min}) {
      if (op == dist::ReduceOp::avg && dt == DType::i64) continue;
      Tensor t = rank_tensor({3, 337}, dt, me);  // 1011 elements: no power of two
      group().all_reduce(t, op);
      const std::vector<double> got = host(t);
      for (int64_t i = 0; i < t.numel(); ++i) {
        double want = 0;
        if (op == dist::ReduceOp::max) want = value(S - 1, i, dt);
        else if (op == dist::ReduceOp::min) want = value(0, i, dt);
        else {
          for (int r = 0; r < S; ++r) want += value(r, i, dt);
          if (op == dist::ReduceOp::avg) want /= S;
        }
        const double tol = dt == DType::f32 ? 1e-6 * std::abs(want) : 1e-12 * std::abs(want);
        ASSERT_NEAR(got[i], want, tol) << dtype_name(dt) << " " << dist::reduce_op_name(op) << " element " << i;
      }
    }
  }
}

TEST(DistCollectives, BroadcastFromEveryRoot) {
  const int S = group().size(), me = group().rank();
  for (int root = 0; root < S; ++root)
    for (DType dt : kDTypes) {
      Tensor t = rank_tensor({5, 7, 3}, dt, me);
      group().broadcast(t, root);
      const std::vector<double> got = host(t);
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(got[i], value(root, i, dt)) << "root " << root;
    }
}

TEST(DistCollectives, AllGatherStacksTheRanks) {
  const int S = group().size(), me = group().rank();
  for (DType dt : kDTypes) {
    Tensor t = rank_tensor({3, 5}, dt, me);
    Tensor out = group().all_gather(t);
    ASSERT_EQ(out.shape(), Shape({S, 3, 5}));
    const std::vector<double> got = host(out);
    for (int r = 0; r < S; ++r)
      for (int64_t i = 0; i < 15; ++i) ASSERT_EQ(got[r * 15 + i], value(r, i, dt)) << "slice " << r;
  }
}

TEST(DistCollectives, ReduceScatterGivesEachRankItsSlice) {
  const int S = group().size(), me = group().rank();
  constexpr int64_t m = 3, cols = 11;
  for (DType dt : kDTypes) {
    Tensor t = rank_tensor({S * m, cols}, dt, me);
    Tensor out = group().reduce_scatter(t, dist::ReduceOp::sum);
    ASSERT_EQ(out.shape(), Shape({m, cols}));
    const std::vector<double> got = host(out);
    for (int64_t i = 0; i < m * cols; ++i) {
      const int64_t global = me * m * cols + i;
      double want = 0;
      for (int r = 0; r < S; ++r) want += value(r, global, dt);
      ASSERT_NEAR(got[i], want, 1e-6 * want) << dtype_name(dt) << " element " << i;
    }
  }
}

// The result of a collective feeds the next op without any host synchronisation in
// between: on the GPU this checks the stream ordering both ways.
TEST(DistCollectives, ResultsAreOrderedBeforeLaterOps) {
  const int S = group().size(), me = group().rank();
  Tensor t = full({1 << 20}, me + 1.0, {.device = test_device()});
  for (int round = 0; round < 3; ++round) {
    t = t * 2.0;                 // queued before the collective: it must see this
    group().all_reduce(t);
    t = t + 1.0;                 // queued after: it must see the sum
  }
  // x_{k+1} = S * 2 * x_k + 1, summed over ranks' starting values at round 0.
  double sum0 = 0;
  for (int r = 0; r < S; ++r) sum0 += r + 1.0;
  double want = 2 * sum0 + 1;
  want = S * 2 * want + 1;
  want = S * 2 * want + 1;
  const std::vector<double> got = host(t);
  EXPECT_EQ(got.front(), want);
  EXPECT_EQ(got.back(), want);
}

// A large buffer: 2^24 + 3 elements (64 MiB of f32).
TEST(DistCollectives, LargeOddSizedAllReduce) {
  const int S = group().size(), me = group().rank();
  const int64_t n = (int64_t{1} << 24) + 3;
  Tensor t = full({n}, 1.0 + me, {.device = test_device()});
  group().all_reduce(t, dist::ReduceOp::avg);
  const std::vector<float> got = t.to_vector<float>();
  const double want = (S + 1) / 2.0;
  size_t wrong = 0;
  for (float v : got) wrong += std::abs(v - want) > 1e-6;
  EXPECT_EQ(wrong, 0u);
}

TEST(DistCollectives, CpuTensorsWorkInEveryGroup) {
  const int S = group().size(), me = group().rank();
  Tensor t = full({17}, me, {.dtype = DType::f64});
  group().all_reduce(t);
  EXPECT_EQ(t.to_vector<double>()[16], S * (S - 1) / 2.0);
}

TEST(DistCollectives, HostHelpers) {
  const int me = group().rank();
  EXPECT_EQ(group().broadcast_string("from rank " + std::to_string(me), 0), "from rank 0");
  EXPECT_TRUE(group().all_true(true));
  EXPECT_FALSE(group().all_true(me != group().size() - 1));
  group().barrier();
}

// Checks that need no communication: every rank throws the same, before any collective.
TEST(DistCollectives, LocalChecksThrowTyped) {
  Tensor ints = zeros({4}, {.dtype = DType::i64, .device = test_device()});
  expect_message<DTypeError>([&] { group().all_reduce(ints, dist::ReduceOp::avg); },
                             {"all_reduce", "avg", "i64[4]"});
  if (group().size() > 1) {  // any first dim divides among one rank
    Tensor odd = zeros({group().size() * 2 + 1, 3}, {.device = test_device()});
    expect_message<ShapeError>([&] { group().reduce_scatter(odd); }, {"reduce_scatter", "divisible"});
  }
  Tensor t = zeros({2}, {.device = test_device()});
  expect_message<Error>([&] { group().broadcast(t, group().size()); }, {"broadcast", "root"});
  Tensor six = zeros({1, 1, 1, 1, 1, 2}, {.device = test_device()});
  expect_message<ShapeError>([&] { group().all_gather(six); }, {"all_gather", "dims"});
}

// Ranks that pass different shapes get DistError on every rank, naming both shapes, and
// the group stays usable.
TEST(DistCollectives, RanksThatDisagreeOnTheShapeGetDistError) {
  if (group().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = group().rank();
  Tensor t = zeros({me == 1 ? 5 : 4}, {.device = test_device()});
  expect_message<DistError>([&] { group().all_reduce(t); }, {"all_reduce", "rank 0 passes f32[4]", "rank 1 passes f32[5]"});
  Tensor d = zeros({4}, {.dtype = me == 1 ? DType::f64 : DType::f32, .device = test_device()});
  expect_message<DistError>([&] { group().broadcast(d); }, {"broadcast", "f64[4]"});
  Tensor ok = ones({4}, {.device = test_device()});
  group().all_reduce(ok);
  EXPECT_EQ(ok.to_vector<float>()[0], static_cast<float>(group().size()));
}

// Ranks that agree on the tensor but not on the reduce op or the root would not fail in MPI
// or NCCL, only end with different replicas: DistError on every rank, naming both.
TEST(DistCollectives, RanksThatDisagreeOnTheOpOrRootGetDistError) {
  if (group().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = group().rank();
  Tensor t = ones({3}, {.device = test_device()});
  expect_message<DistError>([&] { group().all_reduce(t, me == 0 ? dist::ReduceOp::sum : dist::ReduceOp::avg); },
                            {"all_reduce", "with op sum", "with op avg"});
  expect_message<DistError>([&] { group().broadcast(t, me == 0 ? 0 : 1); }, {"broadcast", "from root 0", "from root 1"});
  Tensor rows = ones({2 * group().size(), 2}, {.device = test_device()});
  expect_message<DistError>(
      [&] { group().reduce_scatter(rows, me == 0 ? dist::ReduceOp::max : dist::ReduceOp::min); },
      {"reduce_scatter", "with op max", "with op min"});
  expect_message<DistError>([&] { group().broadcast_string("x", group().size()); }, {"broadcast_string", "root"});
  Tensor ok = ones({3}, {.device = test_device()});
  group().all_reduce(ok);  // the group is still usable
  EXPECT_EQ(ok.to_vector<float>()[2], static_cast<float>(group().size()));
}

TG_DIST_TEST_MAIN()
