// DistributedDataParallel: N ranks with b examples each must train exactly like one process
// with the N*b examples (mean loss), for SGD with momentum and for Adam, over several steps;
// buckets of any size (a parameter larger than a bucket, one bucket per parameter), unused
// parameters, no_sync accumulation, mismatched models, and rank-0 checkpoints.
//
// Tolerance: f64 throughout, so the only differences are the order of the sums (a mean over
// b examples per rank, then over ranks, against one mean over N*b): relative 1e-12.
#include <optional>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/safetensors.h"
#include "dist/ddp.h"
#include "dist_test_main.h"
#include "nn/checkpoint.h"
#include "nn/optim/adam.h"
#include "nn/optim/sgd.h"
#include "ops/loss.h"

using namespace tg;
using namespace tg::test;
using tg::dist::DistributedDataParallel;

namespace {

constexpr int64_t kPerRank = 3;  // examples per rank and step

std::shared_ptr<nn::Sequential> model(uint64_t seed) {
  auto m = small_cnn(seed);
  m->to(f64);
  m->to(test_device());
  return m;
}

// The global batch of a step: the same numbers on every rank.
std::pair<Tensor, Tensor> global_batch(int step, int64_t count) {
  manual_seed(5000 + step);
  return {randn({count, 3, 7, 9}, {.dtype = f64}), randn({count, 5}, {.dtype = f64})};
}

void expect_same_parameters(nn::Module& a, nn::Module& b, double tol) {
  const auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_LE(rel_l2(pa[i], pb[i]), tol) << "parameter " << i;
}

std::vector<double> flat_parameters(nn::Module& m) {
  std::vector<double> out;
  for (const Tensor& p : m.parameters())
    for (double v : p.to_vector<double>()) out.push_back(v);
  return out;
}

// Trains `steps` steps both ways and returns the DDP replica's parameters. Rank r starts
// from a different initialisation (seed 7 + 1000 r): DDP must broadcast rank 0's.
template <class Opt, class Options>
std::vector<double> train_both_ways(Options options, int steps, dist::DDPOptions ddp_options = {}) {
  const int S = group().size(), me = group().rank();
  auto reference = model(7);
  Opt reference_opt(reference->parameters(), options);
  auto replica = model(7 + 1000 * me);
  DistributedDataParallel ddp(group(), replica, ddp_options);
  Opt opt(ddp.parameters(), options);
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, S * kPerRank);
    {
      Tape tape;
      tape.backward(mse_loss((*reference)(x.to(test_device())), y.to(test_device())));
    }
    reference_opt.step();
    reference->zero_grad();
    {
      Tape tape;
      tape.backward(mse_loss(ddp(rows_of(x, me * kPerRank, (me + 1) * kPerRank, test_device())),
                             rows_of(y, me * kPerRank, (me + 1) * kPerRank, test_device())));
    }
    opt.step();
    ddp.zero_grad();
  }
  expect_same_parameters(*replica, *reference, 1e-12);
  return flat_parameters(*replica);
}

}  // namespace

TEST(DDP, EqualsOneProcessWithTheWholeBatchSGD) {
  const auto first = train_both_ways<nn::SGD>(nn::SGDOptions{.lr = 0.05, .momentum = 0.9}, 4);
  // Deterministic: the same run again gives the same bits.
  const auto second = train_both_ways<nn::SGD>(nn::SGDOptions{.lr = 0.05, .momentum = 0.9}, 4);
  EXPECT_EQ(first, second);
}

TEST(DDP, EqualsOneProcessWithTheWholeBatchAdam) {
  train_both_ways<nn::Adam>(nn::AdamOptions{.lr = 0.01}, 4);
}

// One bucket per parameter (a cap below every parameter's size), and a cap between sizes so
// that a parameter larger than a bucket shares none.
TEST(DDP, AnyBucketSizeGivesTheSameTraining) {
  train_both_ways<nn::SGD>(nn::SGDOptions{.lr = 0.05}, 3, {.bucket_cap_mb = 1e-9});
  train_both_ways<nn::SGD>(nn::SGDOptions{.lr = 0.05}, 3, {.bucket_cap_mb = 200.0 / (1 << 20)});
}

TEST(DDP, BucketsHoldParametersInReverseOrder) {
  auto m = model(7);
  const auto names = [&] {
    std::vector<std::string> n;
    for (const auto& [name, t] : m->named_parameters()) n.push_back(name);
    return n;
  }();
  {
    DistributedDataParallel one(group(), m);
    const auto layout = one.bucket_layout();
    ASSERT_EQ(layout.size(), 1u);
    EXPECT_EQ(layout[0], std::vector<std::string>(names.rbegin(), names.rend()));
  }
  // 200 bytes = 25 f64: conv weight (162 values) exceeds it and sits alone; small ones pair up.
  DistributedDataParallel small(group(), m, {.bucket_cap_mb = 200.0 / (1 << 20)});
  const auto layout = small.bucket_layout();
  size_t total = 0;
  for (const auto& b : layout) {
    total += b.size();
    ASSERT_FALSE(b.empty());
  }
  EXPECT_EQ(total, names.size());
  EXPECT_GT(layout.size(), 2u);
  EXPECT_EQ(layout.back(), std::vector<std::string>{"0.weight"});  // 162 f64 > cap: alone, last
}

namespace {

// Two heads; `b` is used on rank 0 only, `never` by no rank.
struct Branchy : nn::Module {
  std::shared_ptr<nn::Linear> a, b, never;
  bool use_b = false;
  explicit Branchy(bool use) : use_b(use) {
    manual_seed(11);
    a = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 3});
    b = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 3});
    never = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 3});
    register_module("a", a);
    register_module("b", b);
    register_module("never", never);
    to(f64);
    to(test_device());
  }
  Tensor forward(const Tensor& x) override { return use_b ? (*a)(x) + (*b)(x) : (*a)(x); }
};

Tensor rank_input(int r) {
  manual_seed(900 + r);
  return randn({5, 4}, {.dtype = f64}).to(test_device());
}

}  // namespace

TEST(DDP, UnusedParameters) {
  const int S = group().size(), me = group().rank();
  // The expected averages: every rank's local gradients, computed here for all ranks.
  Branchy ref_a_b(true), ref_a(false);
  std::vector<double> want_a(12, 0.0), want_b(12, 0.0);  // weights of 3 x 4
  for (int r = 0; r < S; ++r) {
    Branchy& m = r == 0 ? ref_a_b : ref_a;
    m.zero_grad();
    Tape tape;
    tape.backward(sum((m)(rank_input(r))));
    auto ga = m.a->weight.grad().to_vector<double>();
    ASSERT_EQ(ga.size(), want_a.size());
    for (size_t i = 0; i < ga.size(); ++i) want_a[i] += ga[i] / S;
    if (r == 0) {
      auto gb = m.b->weight.grad().to_vector<double>();
      ASSERT_EQ(gb.size(), want_b.size());
      for (size_t i = 0; i < gb.size(); ++i) want_b[i] += gb[i] / S;
    }
  }
  for (bool find_unused : {false, true}) {
    auto m = std::make_shared<Branchy>(me == 0);
    DistributedDataParallel ddp(group(), m, {.find_unused_parameters = find_unused});
    Tape tape;
    tape.backward(sum(ddp(rank_input(me))));
    const auto ga = m->a->weight.grad().to_vector<double>();
    ASSERT_TRUE(m->b->weight.grad().defined()) << "b is used by rank 0: every rank gets the average";
    const auto gb = m->b->weight.grad().to_vector<double>();
    ASSERT_EQ(ga.size(), want_a.size());
    ASSERT_EQ(gb.size(), want_b.size());
    for (size_t i = 0; i < want_a.size(); ++i) {
      EXPECT_NEAR(ga[i], want_a[i], 1e-12);
      EXPECT_NEAR(gb[i], want_b[i], 1e-12);
    }
    if (find_unused) {
      EXPECT_FALSE(m->never->weight.grad().defined()) << "no rank used it: its grad stays undefined";
    } else {
      ASSERT_TRUE(m->never->weight.grad().defined());
      for (double v : m->never->weight.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
    }
  }
}

// Two micro-batches: the first inside no_sync (local accumulation only), the second synced;
// the result is the whole batch's mean gradient.
TEST(DDP, NoSyncAccumulatesLocally) {
  const int S = group().size(), me = group().rank();
  auto reference = model(7);
  auto replica = model(7);
  DistributedDataParallel ddp(group(), replica);
  auto [x, y] = global_batch(0, S * kPerRank * 2);
  {
    Tape tape;
    tape.backward(mse_loss((*reference)(x.to(test_device())), y.to(test_device())));
  }
  for (int micro = 0; micro < 2; ++micro) {
    const int64_t begin = (2 * me + micro) * kPerRank;
    Tape tape;
    Tensor loss = mse_loss(ddp(rows_of(x, begin, begin + kPerRank, test_device())),
                           rows_of(y, begin, begin + kPerRank, test_device())) * 0.5;
    if (micro == 0) {
      auto guard = ddp.no_sync();
      tape.backward(loss);
    } else {
      tape.backward(loss);
    }
  }
  const auto pr = replica->parameters(), pf = reference->parameters();
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_LE(rel_l2(pr[i].grad(), pf[i].grad()), 1e-12) << i;
}

TEST(DDP, MismatchedModelsFailOnEveryRank) {
  if (group().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = group().rank();
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = me == 1 ? 2 : 3}));
  m->to(test_device());
  expect_message<DistError>([&] { DistributedDataParallel ddp(group(), m); },
                            {"do not match", "rank 1 differs from rank 0", "0.weight f32[3, 4]", "0.weight f32[2, 4]"});
  // The group is still usable.
  Tensor t = ones({2}, {.device = test_device()});
  group().all_reduce(t);
  EXPECT_EQ(t.to_vector<float>()[0], static_cast<float>(group().size()));
}

// After the DDP is destroyed its hooks are gone: a backward on one rank alone does not
// start a collective (it would wait for the others forever).
TEST(DDP, DestroyedWrapperLeavesNoHooks) {
  auto m = model(7);
  { DistributedDataParallel ddp(group(), m); }
  if (group().rank() == 0) {
    Tape tape;
    tape.backward(mse_loss((*m)(randn({2, 3, 7, 9}, {.dtype = f64}).to(test_device())),
                           zeros({2, 5}, {.dtype = f64, .device = test_device()})));
    EXPECT_TRUE(m->parameters()[0].grad().defined());
  }
  group().barrier();
}

TEST(DDP, CheckpointWrittenByRankZeroOnly) {
  auto m = model(7 + group().rank());
  DistributedDataParallel ddp(group(), m);
  // Rank 0's scratch directory (the ranks share this host's file system), removed when the
  // test ends, after the barrier below.
  std::optional<TempDir> dir;
  if (group().rank() == 0) dir.emplace();
  const std::string path = group().broadcast_string(dir ? dir->file("checkpoint.safetensors") : "", 0);
  dist::save_checkpoint(group(), *m, path);
  auto loaded = model(99);
  tg::load(*loaded, path);
  expect_same_parameters(*loaded, *m, 0.0);
  group().barrier();
}

namespace {

// A layer with a buffer that differs per rank (as running statistics would).
struct Buffered : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Tensor counter;
  explicit Buffered(int rank) {
    manual_seed(13);
    fc = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 3, .out_features = 2});
    register_module("fc", fc);
    counter = register_buffer("counter", full({4}, 10.0 * (rank + 1)));
    to(f64);
    to(test_device());
  }
  Tensor forward(const Tensor& x) override { return (*fc)(x); }
};

}  // namespace

// broadcast_buffers (the default): rank 0's buffers at construction and before each forward;
// off: each rank keeps its own after construction.
TEST(DDP, BuffersFollowRankZero) {
  const int me = group().rank();
  for (bool broadcast : {true, false}) {
    auto m = std::make_shared<Buffered>(me);
    DistributedDataParallel ddp(group(), m, {.broadcast_buffers = broadcast});
    EXPECT_EQ(m->counter.to_vector<double>()[0], 10.0) << "construction broadcasts rank 0's state";
    m->counter.fill_(100.0 * (me + 1));  // ranks drift apart between steps
    Tape tape;
    tape.backward(sum(ddp(ones({2, 3}, {.dtype = f64, .device = test_device()}))));
    EXPECT_EQ(m->counter.to_vector<double>()[3], broadcast ? 100.0 : 100.0 * (me + 1)) << "broadcast " << broadcast;
  }
}

// A bf16 buffer (2-byte elements) moves whole at construction and before each forward:
// each element is rank 0's, and nothing is read or written past the buffer.
struct HalfBuffered : Buffered {
  Tensor half;
  explicit HalfBuffered(int rank) : Buffered(rank) {
    half = register_buffer("half", full({67}, 1.5 * (rank + 1), {.dtype = DType::bf16, .device = test_device()}));
  }
};

TEST(DDP, HalfBuffersAreBroadcastWhole) {
  const int me = group().rank();
  auto m = std::make_shared<HalfBuffered>(me);
  Tensor half = m->half;
  DistributedDataParallel ddp(group(), m);
  for (double v : half.to_vector<double>()) EXPECT_EQ(v, 1.5);
  half.fill_(4.0 * (me + 1));
  Tape tape;
  tape.backward(sum(ddp(ones({2, 3}, {.dtype = f64, .device = test_device()}))));
  for (double v : half.to_vector<double>()) EXPECT_EQ(v, 4.0);
}

// A frozen parameter (requires_grad off) is broadcast with the rest but never bucketed: it
// keeps no grad, and the trainable ones are averaged as usual.
TEST(DDP, FrozenParametersAreBroadcastNotReduced) {
  const int me = group().rank();
  manual_seed(31 + me);
  auto m = std::make_shared<nn::Sequential>();
  auto frozen = m->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 3, .out_features = 4}));
  auto head = m->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 2}));
  m->to(f64);
  m->to(test_device());
  frozen->weight.requires_grad_(false);
  frozen->bias.requires_grad_(false);
  DistributedDataParallel ddp(group(), m);
  size_t bucketed = 0;
  for (const auto& b : ddp.bucket_layout()) bucketed += b.size();
  EXPECT_EQ(bucketed, 2u);  // head.weight, head.bias
  Tensor w0 = frozen->weight.detach().clone();
  group().broadcast(w0, 0);
  EXPECT_EQ(frozen->weight.to_vector<double>(), w0.to_vector<double>()) << "rank 0's frozen weight everywhere";
  manual_seed(700 + me);
  Tape tape;
  tape.backward(sum(ddp(randn({5, 3}, {.dtype = f64, .device = test_device()}))));
  EXPECT_FALSE(frozen->weight.grad().defined());
  ASSERT_TRUE(head->bias.grad().defined());
  // d sum / d head.bias = 5 on every rank: the average is 5 too.
  for (double v : head->bias.grad().to_vector<double>()) EXPECT_DOUBLE_EQ(v, 5.0);
}

namespace {

// An f32 layer feeding an f64 one.
struct MixedDtypes : nn::Module {
  std::shared_ptr<nn::Linear> single, dbl;
  MixedDtypes() {
    manual_seed(17);
    single = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 3, .out_features = 3});
    dbl = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 3, .out_features = 2});
    register_module("single", single);
    register_module("dbl", dbl);
    dbl->to(f64);
    to(test_device());
  }
  Tensor forward(const Tensor& x) override { return (*dbl)((*single)(x).to(f64)); }
};

}  // namespace

// Parameters of two dtypes go to buckets of their own dtype; both are averaged.
TEST(DDP, MixedDtypesGetTheirOwnBuckets) {
  const int S = group().size(), me = group().rank();
  auto m = std::make_shared<MixedDtypes>();
  DistributedDataParallel ddp(group(), m);
  const auto layout = ddp.bucket_layout();
  ASSERT_EQ(layout.size(), 2u);
  EXPECT_EQ(layout[0], (std::vector<std::string>{"single.bias", "single.weight"}));  // f32 first
  EXPECT_EQ(layout[1], (std::vector<std::string>{"dbl.bias", "dbl.weight"}));
  // Rank r scales its loss by r + 1: each gradient is (r + 1) times rank 0's, so the average
  // is (S + 1) / 2 times it. With 4 rows of ones: d/d dbl.bias = 4 (r + 1); d/d single.bias_j
  // = 4 (r + 1) * sum_i dbl.weight[i][j].
  Tape tape;
  tape.backward(sum(ddp(ones({4, 3}, {.device = test_device()}))) * (me + 1.0));
  const double scale = (S + 1) / 2.0;
  for (double v : m->dbl->bias.grad().to_vector<double>()) EXPECT_DOUBLE_EQ(v, 4.0 * scale);
  const std::vector<double> w = m->dbl->weight.to_vector<double>();  // (2, 3), same on every rank
  const std::vector<float> g = m->single->bias.grad().to_vector<float>();
  ASSERT_EQ(g.size(), 3u);
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(g[j], 4.0 * scale * (w[j] + w[3 + j]), 1e-5) << j;
}

TG_DIST_TEST_MAIN()
