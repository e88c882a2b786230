// ZeroRedundancyOptimizer (ZeRO stage 1): sharded optimizer state must train to the same
// bits as the unsharded optimizer (each parameter's update is computed by the same code on
// the same values, then copied by broadcast), while each rank holds state for its own
// parameters only; ownership balances sizes and tolerates ranks that own nothing.
#include <vector>

#include "autograd/tape.h"
#include "common/fixtures.h"
#include "dist/ddp.h"
#include "dist/zero.h"
#include "dist_test_main.h"
#include "nn/optim/adam.h"
#include "nn/optim/sgd.h"
#include "ops/loss.h"

using namespace tg;
using namespace tg::test;

namespace {

std::shared_ptr<nn::Sequential> model(uint64_t seed) {
  auto m = small_cnn(seed);
  m->to(f64);
  m->to(test_device());
  return m;
}

std::vector<double> flat(nn::Module& m) {
  std::vector<double> out;
  for (const Tensor& p : m.parameters())
    for (double v : p.to_vector<double>()) out.push_back(v);
  return out;
}

// Trains 4 steps of Adam under DDP, sharded or not; returns the parameters.
std::vector<double> train(bool sharded, size_t* state_entries = nullptr) {
  const int me = group().rank();
  auto m = model(7 + 1000 * me);
  dist::DistributedDataParallel ddp(group(), m);
  const nn::AdamOptions options{.lr = 0.01, .weight_decay = 0.01};
  std::unique_ptr<nn::Adam> full;
  std::unique_ptr<dist::ZeroRedundancyOptimizer> zero;
  if (sharded)
    zero = std::make_unique<dist::ZeroRedundancyOptimizer>(group(), ddp.parameters(), [&](std::vector<Tensor> owned) {
      return std::make_unique<nn::Adam>(std::move(owned), options);
    });
  else
    full = std::make_unique<nn::Adam>(ddp.parameters(), options);
  for (int step = 0; step < 4; ++step) {
    manual_seed(300 + 17 * step + me);
    Tensor x = randn({3, 3, 7, 9}, {.dtype = f64}).to(test_device());
    Tensor y = randn({3, 5}, {.dtype = f64}).to(test_device());
    Tape tape;
    tape.backward(mse_loss(ddp(x), y));
    if (sharded) {
      zero->step();
      zero->zero_grad();
    } else {
      full->step();
      full->zero_grad();
    }
  }
  if (state_entries) *state_entries = zero && zero->local() ? zero->local()->state().size() : 0;
  return flat(*m);
}

}  // namespace

TEST(Zero, ShardedAdamTrainsToTheSameBitsAsFullAdam) {
  size_t entries = 0;
  const std::vector<double> sharded = train(true, &entries);
  const std::vector<double> unsharded = train(false);
  EXPECT_EQ(sharded, unsharded);
  // Adam keeps step, exp_avg and exp_avg_sq per owned parameter, nothing for the others.
  auto m = model(7);
  dist::ZeroRedundancyOptimizer probe(group(), m->parameters(), [](std::vector<Tensor> owned) {
    return std::make_unique<nn::SGD>(std::move(owned), nn::SGDOptions{.lr = 0.1});
  });
  size_t owned = 0;
  for (size_t i = 0; i < m->parameters().size(); ++i) owned += probe.owner(i) == group().rank();
  EXPECT_EQ(entries, 3 * owned);
  // Every rank's share is all the parameters.
  Tensor count = full({1}, static_cast<double>(owned), {.dtype = f64});
  group().all_reduce(count);
  EXPECT_EQ(count.to_vector<double>()[0], static_cast<double>(m->parameters().size()));
}

TEST(Zero, OwnershipBalancesSizes) {
  const int S = group().size();
  auto m = model(7);
  dist::ZeroRedundancyOptimizer z(group(), m->parameters(), [](std::vector<Tensor> owned) {
    return std::make_unique<nn::SGD>(std::move(owned), nn::SGDOptions{.lr = 0.1});
  });
  std::vector<int64_t> load(static_cast<size_t>(S), 0);
  int64_t largest = 0;
  const auto params = m->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_GE(z.owner(i), 0);
    ASSERT_LT(z.owner(i), S);
    load[static_cast<size_t>(z.owner(i))] += params[i].numel();
    largest = std::max(largest, params[i].numel());
  }
  // Greedy by decreasing size: no rank exceeds the lightest by more than the largest tensor.
  EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), largest);
}

// More ranks than parameters: some rank owns nothing and still takes part in the broadcasts.
TEST(Zero, RanksThatOwnNothing) {
  const int me = group().rank();
  manual_seed(5 + me);
  Tensor w = randn({4}, {.dtype = f64, .device = test_device()});
  w.requires_grad_();
  dist::ZeroRedundancyOptimizer z(group(), {w}, [](std::vector<Tensor> owned) {
    return std::make_unique<nn::SGD>(std::move(owned), nn::SGDOptions{.lr = 0.5});
  });
  EXPECT_EQ(z.owner(0), 0);
  EXPECT_EQ(z.local() != nullptr, me == 0);
  w.set_grad(full({4}, 1.0 + me, {.dtype = f64, .device = test_device()}));
  const std::vector<double> before = w.to_vector<double>();
  z.step();
  // Rank 0's update (its own weights minus 0.5 * its grad 1) reaches every rank.
  Tensor root = w.detach().clone();
  group().broadcast(root, 0);
  EXPECT_EQ(w.to_vector<double>(), root.to_vector<double>());
  if (me == 0) {
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(w.to_vector<double>()[i], before[i] - 0.5);
  }
}

TEST(Zero, DifferentParameterListsFailOnEveryRank) {
  if (group().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Tensor w = zeros({group().rank() == 1 ? 3 : 4}, {.dtype = f64, .device = test_device()});
  w.requires_grad_();
  expect_message<DistError>(
      [&] {
        dist::ZeroRedundancyOptimizer z(group(), {w}, [](std::vector<Tensor> owned) {
          return std::make_unique<nn::SGD>(std::move(owned), nn::SGDOptions{.lr = 0.1});
        });
      },
      {"ZeroRedundancyOptimizer", "different parameter lists"});
}

TG_DIST_TEST_MAIN()
