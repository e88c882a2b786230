// data/ DataLoader: every index once per epoch, seeded order per epoch, drop_last, workers
// giving the same batches as none, exceptions reaching the consumer with their type, a
// bounded queue, shutdown or restart in the middle of an epoch, and shards for
// data-parallel training (DistributedSampler's split).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iterator>
#include <numeric>
#include <set>
#include <thread>
#include <type_traits>

#include "common/expect_message.h"
#include "data/dataloader.h"

using tg::Tensor;
using tg::test::contains;
using tg::test::message_of;
using namespace tg::data;

namespace {

// ---- DataLoader -------------------------------------------------------------------------

// Example i: input [i, 10 i] (f32), target i (i64 scalar). Optionally throws at one index,
// sleeps per example, or returns a wrongly shaped input at one index; counts its calls.
class Indexed : public Dataset {
 public:
  explicit Indexed(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    calls.fetch_add(1);
    if (sleep_us) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us.load()));
    if (i == throw_at) throw std::runtime_error("boom at " + std::to_string(i));
    if (i == shape_error_at) throw tg::ShapeError("typed error at " + std::to_string(i));
    const float v = static_cast<float>(i);
    Tensor x = i == misshaped_at ? tg::from_vector(std::vector<float>{v, v, v}, {3})
                                 : tg::from_vector(std::vector<float>{v, 10 * v}, {2});
    return {x, tg::from_vector(std::vector<int64_t>{i}, tg::Shape{})};
  }
  int64_t n_;
  // Atomic: tests change them while the workers of an abandoned epoch may still read them.
  std::atomic<int64_t> throw_at{-1}, shape_error_at{-1}, misshaped_at{-1};
  std::atomic<int> sleep_us{0};
  mutable std::atomic<int64_t> calls{0};
};

std::vector<std::vector<int64_t>> epoch_targets(DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (Batch& b : loader) {
    EXPECT_EQ(b.index, static_cast<int64_t>(out.size()));
    const auto t = b.target.to_vector<int64_t>();
    EXPECT_EQ(t, b.indices);
    const auto x = b.input.to_vector<float>();
    EXPECT_EQ(b.input.shape(), (tg::Shape{static_cast<int64_t>(t.size()), 2}));
    for (std::size_t k = 0; k < t.size(); ++k) {  // the input rows travel with their targets
      EXPECT_EQ(x[2 * k], static_cast<float>(t[k]));
      EXPECT_EQ(x[2 * k + 1], static_cast<float>(10 * t[k]));
    }
    out.push_back(t);
  }
  return out;
}

std::vector<int64_t> flatten(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

TEST(data_loader, EveryIndexOncePerEpoch) {
  auto ds = std::make_shared<Indexed>(103);
  for (int workers : {0, 3}) {
    DataLoader loader(ds, {.batch_size = 10, .shuffle = true, .seed = 5, .num_workers = workers});
    EXPECT_EQ(loader.num_batches(), 11);
    for (int epoch = 0; epoch < 2; ++epoch) {
      auto batches = epoch_targets(loader);
      ASSERT_EQ(batches.size(), 11u);
      EXPECT_EQ(batches.back().size(), 3u);
      auto all = flatten(batches);
      EXPECT_EQ(all, loader.order(epoch));
      std::sort(all.begin(), all.end());
      std::vector<int64_t> expected(103);
      std::iota(expected.begin(), expected.end(), 0);
      EXPECT_EQ(all, expected) << "workers " << workers << " epoch " << epoch;
    }
  }
}

TEST(data_loader, SeededOrder) {
  auto ds = std::make_shared<Indexed>(50);
  DataLoader a(ds, {.batch_size = 7, .shuffle = true, .seed = 42});
  DataLoader b(ds, {.batch_size = 7, .shuffle = true, .seed = 42});
  DataLoader c(ds, {.batch_size = 7, .shuffle = true, .seed = 43});
  const auto a0 = flatten(epoch_targets(a)), a1 = flatten(epoch_targets(a));
  EXPECT_EQ(a0, flatten(epoch_targets(b)));
  EXPECT_EQ(a1, flatten(epoch_targets(b)));
  EXPECT_NE(a0, a1);                             // a new permutation every epoch
  EXPECT_NE(a0, flatten(epoch_targets(c)));      // and per seed
  std::vector<int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a0, identity);
  // set_epoch replays an epoch (resuming training).
  a.set_epoch(1);
  EXPECT_EQ(flatten(epoch_targets(a)), a1);
  EXPECT_EQ(a.epoch(), 2);
  DataLoader plain(ds, {.batch_size = 7});
  EXPECT_EQ(flatten(epoch_targets(plain)), identity);
  EXPECT_EQ(flatten(epoch_targets(plain)), identity);
}

TEST(data_loader, DropLast) {
  auto ds = std::make_shared<Indexed>(23);
  DataLoader keep(ds, {.batch_size = 5, .shuffle = true, .seed = 1});
  DataLoader drop(ds, {.batch_size = 5, .shuffle = true, .seed = 1, .drop_last = true});
  EXPECT_EQ(keep.num_batches(), 5);
  EXPECT_EQ(drop.num_batches(), 4);
  const auto k = epoch_targets(keep), d = epoch_targets(drop);
  ASSERT_EQ(k.size(), 5u);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(k.back().size(), 3u);
  for (const auto& b : d) EXPECT_EQ(b.size(), 5u);
  EXPECT_EQ(std::vector(k.begin(), k.begin() + 4), d);  // the same order, the short batch left out
  auto exact = std::make_shared<Indexed>(20);
  EXPECT_EQ(DataLoader(exact, {.batch_size = 5, .drop_last = true}).num_batches(), 4);
  EXPECT_EQ(DataLoader(exact, {.batch_size = 5}).num_batches(), 4);
  EXPECT_EQ(DataLoader(std::make_shared<Indexed>(3), {.batch_size = 5, .drop_last = true}).num_batches(), 0);
  DataLoader none(std::make_shared<Indexed>(0), {.batch_size = 5, .num_workers = 2});
  EXPECT_TRUE(epoch_targets(none).empty());
}

TEST(data_loader, WorkersGiveTheSameBatchesAsNone) {
  auto ds = std::make_shared<Indexed>(97);
  ds->sleep_us = 50;  // let the workers finish out of order
  DataLoader inline_loader(ds, {.batch_size = 4, .shuffle = true, .seed = 9});
  const auto e0 = epoch_targets(inline_loader), e1 = epoch_targets(inline_loader);
  for (int workers : {1, 4}) {
    for (int prefetch : {1, 3}) {
      DataLoader threaded(ds, {.batch_size = 4, .shuffle = true, .seed = 9, .num_workers = workers,
                               .prefetch_factor = prefetch});
      EXPECT_EQ(epoch_targets(threaded), e0) << workers << " workers, prefetch " << prefetch;
      EXPECT_EQ(epoch_targets(threaded), e1) << workers << " workers, prefetch " << prefetch;
    }
  }
}

TEST(data_loader, ExceptionsReachTheConsumer) {
  for (int workers : {0, 1, 4}) {
    auto ds = std::make_shared<Indexed>(40);
    ds->throw_at = 17;
    DataLoader loader(ds, {.batch_size = 4, .num_workers = workers});
    int64_t seen = 0;
    try {
      for (Batch& b : loader) {
        (void)b;
        ++seen;
      }
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "boom at 17");
    }
    EXPECT_EQ(seen, 4) << workers << " workers: batches 0-3 come first, batch 4 holds example 17";
    // The loader is usable afterwards: the next epoch starts over (and fails at the same place).
    ds->throw_at = -1;
    EXPECT_EQ(epoch_targets(loader).size(), 10u);
  }
  // The exception's type survives the trip across threads.
  auto typed = std::make_shared<Indexed>(12);
  typed->shape_error_at = 9;
  DataLoader loader(typed, {.batch_size = 3, .num_workers = 2});
  EXPECT_TRUE(contains(message_of<tg::ShapeError>([&] { epoch_targets(loader); }), "typed error at 9"));
  // Examples that cannot be stacked: the message names both examples.
  auto misshaped = std::make_shared<Indexed>(12);
  misshaped->misshaped_at = 5;
  DataLoader bad(misshaped, {.batch_size = 3, .num_workers = 2});
  const std::string msg = message_of<tg::ShapeError>([&] { epoch_targets(bad); });
  EXPECT_TRUE(contains(msg, "example 5") && contains(msg, "example 3")) << msg;
}

TEST(data_loader, QueueIsBounded) {
  auto ds = std::make_shared<Indexed>(1000);
  DataLoader loader(ds, {.batch_size = 1, .num_workers = 2, .prefetch_factor = 1});
  auto it = loader.begin();
  ASSERT_EQ(it->indices, (std::vector<int64_t>{0}));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Batch 0 was taken; two more may wait (2 workers x 1): at most examples 0, 1, 2 made.
  EXPECT_LE(ds->calls.load(), 3);
  ++it;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LE(ds->calls.load(), 4);
  EXPECT_GE(ds->calls.load(), 3);  // and the workers did work ahead
}

TEST(data_loader, DestroyedOrRestartedMidEpoch) {
  auto ds = std::make_shared<Indexed>(400);
  ds->sleep_us = 200;
  {
    DataLoader loader(ds, {.batch_size = 8, .shuffle = true, .num_workers = 4});
    auto it = loader.begin();
    ++it;
    ++it;
  }  // workers are busy or blocked on the full queue: the destructor must stop and join them
  {
    DataLoader never_iterated(ds, {.batch_size = 8, .num_workers = 4});
  }
  {
    DataLoader loader(ds, {.batch_size = 8, .num_workers = 3});
    auto old = loader.begin();
    ++old;
    auto fresh = loader.begin();  // ends the first epoch early
    EXPECT_EQ(fresh->index, 0);
    EXPECT_TRUE(contains(message_of<tg::Error>([&] { ++old; }), "ended by a later begin()"));
    // Abandon an epoch after an error, then destroy.
    ds->throw_at = 30;
    auto failing = loader.begin();
    EXPECT_THROW(
        for (; !(failing == loader.end()); ++failing) {}, std::runtime_error);
    ds->throw_at = -1;
  }
  SUCCEED();
}

// Batches are handed out once each, in order, so a copied iterator could only wait for a
// batch its original already took (with workers, forever). Iterators are move-only; a
// moved-from one, or one whose loader is gone, throws instead of waiting or reading freed
// memory.
TEST(data_loader, IteratorIsMoveOnly) {
  EXPECT_FALSE(std::is_copy_constructible_v<DataLoader::Iterator>);
  EXPECT_FALSE(std::is_copy_assignable_v<DataLoader::Iterator>);
  EXPECT_TRUE(std::input_iterator<DataLoader::Iterator>);
  EXPECT_TRUE((std::sentinel_for<DataLoader::End, DataLoader::Iterator>));
  auto ds = std::make_shared<Indexed>(20);
  for (int workers : {0, 2}) {
    SCOPED_TRACE(workers);
    DataLoader loader(ds, {.batch_size = 2, .num_workers = workers});
    auto it = loader.begin();
    auto moved = std::move(it);
    ++moved;
    EXPECT_EQ(moved->index, 1);
    // ASSERT: without the check, the moved-from iterator asks again for batch 1, which
    // (with workers) never arrives.
    ASSERT_TRUE(contains(message_of<tg::Error>([&] { ++it; }), "moved-from iterator"));
    EXPECT_TRUE(contains(message_of<tg::Error>([&] { *it; }), "moved-from iterator"));
    it = std::move(moved);  // assigning a live iterator makes it usable again
    ++it;
    EXPECT_EQ(it->index, 2);
    int rest = 0;
    for (; it != loader.end(); ++it) ++rest;
    EXPECT_EQ(rest, 8);
  }
}

TEST(data_loader, IteratorOfDestroyedLoaderThrows) {
  auto ds = std::make_shared<Indexed>(20);
  auto loader = std::make_unique<DataLoader>(ds, DataLoaderOptions{.batch_size = 2, .num_workers = 2});
  auto it = loader->begin();
  loader.reset();
  EXPECT_TRUE(contains(message_of<tg::Error>([&] { ++it; }), "DataLoader's destruction"));
  EXPECT_TRUE(contains(message_of<tg::Error>([&] { *it; }), "DataLoader's destruction"));
}

// ---- shards -----------------------------------------------------------------------------

// The epochs of shards 0..S-1 of one configuration, as the batches' indices (which are the
// shard's order, less a short last batch with drop_last).
std::vector<std::vector<int64_t>> shard_epochs(std::shared_ptr<Indexed> ds, DataLoaderOptions o, int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < o.num_shards; ++r) {
    o.shard = r;
    DataLoader loader(ds, o);
    loader.set_epoch(epoch);
    out.push_back(flatten(epoch_targets(loader)));
    const auto order = loader.order(epoch);
    EXPECT_EQ(static_cast<int64_t>(order.size()), loader.shard_size());
    EXPECT_EQ(out.back(), std::vector(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(out.back().size())));
    if (!o.drop_last) {
      EXPECT_EQ(out.back().size(), order.size());
    }
  }
  return out;
}

TEST(data_loader, ShardsCoverTheEpochDisjointlyWithPadding) {
  for (int64_t n : {103, 100, 3, 1}) {
    auto ds = std::make_shared<Indexed>(n);
    for (int64_t shards : {2, 3, 4}) {
      for (int workers : {0, 2}) {
        const DataLoaderOptions o{.batch_size = 5, .shuffle = true, .seed = 7, .num_shards = shards,
                                  .num_workers = workers};
        const auto parts = shard_epochs(ds, o, 0);
        const int64_t per = (n + shards - 1) / shards;  // padded up to a multiple of shards
        std::vector<int64_t> all;
        for (const auto& p : parts) {
          EXPECT_EQ(static_cast<int64_t>(p.size()), per) << "n " << n << " shards " << shards;
          all.insert(all.end(), p.begin(), p.end());
        }
        // Every index at least once; only the padding (per * shards - n of them) repeats.
        std::set<int64_t> distinct(all.begin(), all.end());
        EXPECT_EQ(static_cast<int64_t>(distinct.size()), n) << "n " << n << " shards " << shards;
        EXPECT_EQ(*distinct.begin(), 0);
        EXPECT_EQ(*distinct.rbegin(), n - 1);
        EXPECT_EQ(static_cast<int64_t>(all.size()) - n, per * shards - n);
        // Element k of the common permutation (wrapping around for the padding) is shard
        // k mod S's element k / S: the padding repeats the permutation's start.
        DataLoader whole(ds, {.batch_size = 5, .shuffle = true, .seed = 7});
        const auto perm = whole.order(0);
        for (int64_t k = 0; k < per * shards; ++k)
          EXPECT_EQ(parts[static_cast<std::size_t>(k % shards)][static_cast<std::size_t>(k / shards)],
                    perm[static_cast<std::size_t>(k % n)]);
      }
    }
  }
}

TEST(data_loader, ShardsWithDropLastCutTheTail) {
  auto ds = std::make_shared<Indexed>(103);
  const auto parts = shard_epochs(ds, {.batch_size = 4, .shuffle = true, .seed = 3, .drop_last = true,
                                       .num_shards = 4}, 2);
  std::vector<int64_t> all;
  for (const auto& p : parts) {
    EXPECT_EQ(p.size(), 24u);  // 103 / 4 = 25 per shard, batches of 4 with the short one dropped
    all.insert(all.end(), p.begin(), p.end());
  }
  std::set<int64_t> distinct(all.begin(), all.end());
  EXPECT_EQ(distinct.size(), all.size());  // no padding: disjoint
  // The shards' orders: 25 each, disjoint, the permutation's first 100 (its tail of 3 cut).
  DataLoader whole(ds, {.batch_size = 4, .shuffle = true, .seed = 3});
  const auto perm = whole.order(2);
  for (int64_t r = 0; r < 4; ++r) {
    DataLoader one(ds, {.batch_size = 4, .shuffle = true, .seed = 3, .drop_last = true, .num_shards = 4, .shard = r});
    EXPECT_EQ(one.shard_size(), 25);
    EXPECT_EQ(one.num_batches(), 6);
    const auto order = one.order(2);
    ASSERT_EQ(order.size(), 25u);
    for (std::size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], perm[static_cast<std::size_t>(r) + 4 * i]);
  }
  // Fewer examples than shards: every shard is empty, and so is every epoch.
  DataLoader tiny(std::make_shared<Indexed>(3), {.batch_size = 4, .drop_last = true, .num_shards = 4});
  EXPECT_EQ(tiny.num_batches(), 0);
  EXPECT_TRUE(epoch_targets(tiny).empty());
}

TEST(data_loader, ShardsFollowSeedAndEpoch) {
  auto ds = std::make_shared<Indexed>(50);
  const DataLoaderOptions o{.batch_size = 6, .shuffle = true, .seed = 11, .num_shards = 3};
  const auto e0 = shard_epochs(ds, o, 0);
  EXPECT_EQ(shard_epochs(ds, o, 0), e0);  // the same (seed, epoch) on every rank: the same shards
  EXPECT_NE(shard_epochs(ds, o, 1), e0);  // set_epoch gives new ones
  DataLoaderOptions other = o;
  other.seed = 12;
  EXPECT_NE(shard_epochs(ds, other, 0), e0);
  // Consecutive epochs of one loader are those of set_epoch.
  DataLoaderOptions second = o;
  second.shard = 1;
  DataLoader loader(ds, second);
  EXPECT_EQ(flatten(epoch_targets(loader)), e0[1]);
  EXPECT_EQ(flatten(epoch_targets(loader)), shard_epochs(ds, o, 1)[1]);
  // Without shuffle the shards interleave 0, 1, 2, ...: 50 is padded to 51 with index 0,
  // which lands in shard 2 (2, 5, ..., 47, 0).
  DataLoader plain(ds, {.batch_size = 6, .num_shards = 3, .shard = 2});
  const auto p = flatten(epoch_targets(plain));
  ASSERT_EQ(p.size(), 17u);
  for (std::size_t i = 0; i + 1 < p.size(); ++i) EXPECT_EQ(p[i], static_cast<int64_t>(2 + 3 * i));
  EXPECT_EQ(p.back(), 0);
}

TEST(data_loader, OneShardIsTheWholeEpoch) {
  auto ds = std::make_shared<Indexed>(37);
  for (bool drop : {false, true}) {
    DataLoader sharded(ds, {.batch_size = 5, .shuffle = true, .seed = 4, .drop_last = drop, .num_shards = 1});
    DataLoader plain(ds, {.batch_size = 5, .shuffle = true, .seed = 4, .drop_last = drop});
    EXPECT_EQ(sharded.num_batches(), plain.num_batches());
    EXPECT_EQ(sharded.shard_size(), 37);
    EXPECT_EQ(epoch_targets(sharded), epoch_targets(plain));
    EXPECT_EQ(epoch_targets(sharded), epoch_targets(plain));
  }
}

TEST(data_loader, BadShardOptions) {
  auto ds = std::make_shared<Indexed>(5);
  std::string msg = message_of<tg::Error>([&] { DataLoader(ds, {.num_shards = 0}); });
  EXPECT_TRUE(contains(msg, "DataLoader") && contains(msg, "num_shards") && contains(msg, "got 0")) << msg;
  msg = message_of<tg::Error>([&] { DataLoader(ds, {.num_shards = 4, .shard = 4}); });
  EXPECT_TRUE(contains(msg, "DataLoader") && contains(msg, "[0, 4)") && contains(msg, "got 4")) << msg;
  msg = message_of<tg::Error>([&] { DataLoader(ds, {.num_shards = 2, .shard = -1}); });
  EXPECT_TRUE(contains(msg, "shard must be in [0, 2)") && contains(msg, "got -1")) << msg;
  msg = message_of<tg::Error>([&] { DataLoader(ds, {.shard = 1}); });
  EXPECT_TRUE(contains(msg, "num_shards 1")) << msg;
}

TEST(data_loader, OptionsAndTensorDataset) {
  auto ds = std::make_shared<Indexed>(5);
  message_of<tg::Error>([&] { DataLoader(ds, {.batch_size = 0}); });
  message_of<tg::Error>([&] { DataLoader(ds, {.num_workers = -1}); });
  message_of<tg::Error>([&] { DataLoader(ds, {.prefetch_factor = 0}); });
  if (!tg::cuda_available()) {
    const std::string msg = message_of<tg::DeviceError>([&] { DataLoader(ds, {.device = tg::Device::cuda()}); });
    EXPECT_TRUE(contains(msg, "cuda:0")) << msg;
  }

  Tensor x = tg::arange(12).reshape({6, 2});
  Tensor y = tg::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, {6});
  TensorDataset td(x, y);
  DataLoader loader(td, {.batch_size = 4});  // borrowed: td outlives the loader
  std::vector<Tensor> inputs;
  for (Batch& b : loader) inputs.push_back(b.input);
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[1].shape(), (tg::Shape{2, 2}));
  EXPECT_EQ(inputs[1].to_vector<float>(), (std::vector<float>{8, 9, 10, 11}));
  message_of<tg::ShapeError>([&] { TensorDataset(x, tg::zeros({5})); });
  message_of<tg::ShapeError>([&] { td.get(6); });
}

}  // namespace
