// Async and blocking collectives interleaved on one process group, against closed forms.
// On the GPU (--gpu) they run on two streams (all_reduce_async on the group's own stream,
// the blocking calls on the framework's stream), and these tests check the ordering between
// them: each collective sees the ops queued before it, a blocking collective issued while
// async ones are in flight runs after them (and does not deadlock), an async collective
// issued after a blocking one sees its result, and wait() orders the async result before
// the ops after it. On the CPU (MPI) the same programs check the same results.
#include <cmath>
#include <memory>
#include <vector>

#include "dist_test_main.h"
#include "ops/elementwise.h"

using namespace tg;
using namespace tg::test;

namespace {

// Elements of t that differ from `want` (exact: every value here is a small integer).
int64_t count_wrong(const Tensor& t, double want) {
  int64_t wrong = 0;
  for (double v : t.to(DType::f64).to_vector<double>()) wrong += v != want;
  return wrong;
}

double sum_of_ranks(int S) { return S * (S - 1) / 2.0; }  // sum over r of r

}  // namespace

// async all_reduce of a bucket computed just before it; a blocking all_reduce of another
// tensor while it is in flight; then, after wait(), a blocking all_reduce of a tensor
// computed from the bucket, an async all_reduce of that same tensor (it must see the
// blocking result), and a blocking one of the other tensor while that is in flight.
TEST(DistStreamOrder, AsyncThenBlockingOnADependentTensor) {
  const int S = group().size(), me = group().rank();
  const int64_t n = (int64_t{1} << 22) + 1;  // 16 MiB of f32: long enough for a race to show
  for (int round = 0; round < 3; ++round) {
    Tensor bucket = full({n}, me + 1.0, {.device = test_device()}) * 2.0 + 1.0;  // 2 me + 3
    std::unique_ptr<dist::Work> w = group().all_reduce_async(bucket);
    Tensor other = full({1000}, static_cast<double>(me), {.device = test_device()});
    const uint64_t v0 = other.version();
    group().all_reduce(other);  // issued while the bucket's reduction is in flight
    EXPECT_GT(other.version(), v0) << "a blocking all_reduce must move the tensor's version on";
    w->wait();
    const double bucket_sum = S * (S + 2.0);  // sum over r of 2 r + 3
    Tensor dep = bucket * 2.0 + static_cast<double>(me);
    group().all_reduce(dep);
    const double dep_sum = 2.0 * S * bucket_sum + sum_of_ranks(S);
    std::unique_ptr<dist::Work> w2 = group().all_reduce_async(dep);  // must see the blocking result
    group().all_reduce(other);  // while dep's reduction is in flight
    w2->wait();
    dep = dep + 1.0;
    EXPECT_EQ(count_wrong(bucket, bucket_sum), 0) << "round " << round;
    EXPECT_EQ(count_wrong(dep, S * dep_sum + 1.0), 0) << "round " << round;
    EXPECT_EQ(count_wrong(other, S * sum_of_ranks(S)), 0) << "round " << round;
  }
}

// Several buckets in flight at once, as DDP's backward leaves them, with every blocking
// collective (broadcast, all_gather, reduce_scatter, all_reduce) issued between them; the
// buckets are waited for in reverse order.
TEST(DistStreamOrder, BucketsInFlightAroundEveryBlockingCollective) {
  const int S = group().size(), me = group().rank();
  const std::vector<int64_t> sizes = {(int64_t{1} << 20) + 5, 3, (int64_t{1} << 18) + 7, 1000};
  for (int round = 0; round < 2; ++round) {
    std::vector<Tensor> buckets;
    std::vector<std::unique_ptr<dist::Work>> works;
    Tensor root, gathered, scattered, summed;
    for (size_t k = 0; k < sizes.size(); ++k) {
      buckets.push_back(full({sizes[k]}, 1.0, {.device = test_device()}) * (me + static_cast<double>(k) + 1.0));
      works.push_back(group().all_reduce_async(buckets.back()));
      if (k == 0) {
        root = full({5, 3}, me + 5.0, {.device = test_device()}) + 5.0;
        group().broadcast(root, S - 1);
      } else if (k == 1) {
        gathered = group().all_gather(full({7}, static_cast<double>(me), {.device = test_device()}) * 3.0);
      } else if (k == 2) {
        scattered = group().reduce_scatter(full({S * 2, 3}, me + 1.0, {.device = test_device()}));
      } else {
        summed = full({9}, me + 1.0, {.device = test_device()}) - 1.0;  // me, from an op queued now
        group().all_reduce(summed);
      }
    }
    for (size_t k = sizes.size(); k-- > 0;) works[k]->wait();
    for (size_t k = 0; k < sizes.size(); ++k)
      EXPECT_EQ(count_wrong(buckets[k], sum_of_ranks(S) + S * (k + 1.0)), 0) << "round " << round << " bucket " << k;
    EXPECT_EQ(count_wrong(root, S - 1 + 10.0), 0);
    ASSERT_EQ(gathered.shape(), Shape({S, 7}));
    const std::vector<double> g = gathered.to(DType::f64).to_vector<double>();
    for (int r = 0; r < S; ++r) EXPECT_EQ(g[static_cast<size_t>(r) * 7 + 6], 3.0 * r) << "slice " << r;
    ASSERT_EQ(scattered.shape(), Shape({2, 3}));
    EXPECT_EQ(count_wrong(scattered, S * (S + 1) / 2.0), 0);
    EXPECT_EQ(count_wrong(summed, sum_of_ranks(S)), 0);
  }
}

TG_DIST_TEST_MAIN()
