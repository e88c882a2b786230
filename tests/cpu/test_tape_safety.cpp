// The tape's safety contract: which tape records when tapes are destroyed out of order or
// on another thread (never a dangling tape), gradients that would stop at a tape boundary
// (an error, not a silent missing gradient), outputs written in place after they were
// recorded (refused), and leaf gradients that share no storage with each other, with the
// caller's seed or with gradients still on their way, also when threads share a leaf.
#include <atomic>
#include <future>
#include <memory>
#include <thread>

#include "autograd/grad_hooks.h"
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

// ---- which tape records ------------------------------------------------------------------

TEST(TapeStack, OuterDestroyedFirstLeavesInnerRecording) {
  Tensor x = param({3});
  auto outer = std::make_unique<Tape>();
  auto inner = std::make_unique<Tape>();
  outer.reset();  // out of creation order
  EXPECT_EQ(Tape::active(), inner.get());
  Tensor y = x * x;
  EXPECT_EQ(inner->entries().size(), 1u);
  inner.reset();
  EXPECT_EQ(Tape::active(), nullptr);
  Tensor z = x * x;  // must not record into the destroyed outer tape
  EXPECT_FALSE(z.requires_grad());
}

TEST(TapeStack, MiddleDestroyedKeepsTheOthersInOrder) {
  Tensor x = param({2});
  auto a = std::make_unique<Tape>();
  auto b = std::make_unique<Tape>();
  auto c = std::make_unique<Tape>();
  b.reset();
  EXPECT_EQ(Tape::active(), c.get());
  c.reset();
  EXPECT_EQ(Tape::active(), a.get());  // not b
  Tensor y = x * 3.0;
  ASSERT_EQ(a->entries().size(), 1u);
  a->backward(sum(y));
  for (double g : x.grad().to_vector<double>()) EXPECT_EQ(g, 3.0);
  a.reset();
  EXPECT_EQ(Tape::active(), nullptr);
}

TEST(TapeStack, ManyTapesDestroyedFrontToBack) {
  Tensor x = param({2});
  std::vector<std::unique_ptr<Tape>> tapes;
  for (int i = 0; i < 8; ++i) tapes.push_back(std::make_unique<Tape>());
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Tape::active(), tapes.back().get());
    tapes[i].reset();
    Tensor y = x * x;  // records on the innermost survivor, or nowhere after the last
    EXPECT_EQ(y.requires_grad(), i < 7);
  }
  EXPECT_EQ(Tape::active(), nullptr);
}

TEST(TapeStack, DestroyedOnAnotherThread) {
  Tensor x = param({4});
  auto tape = std::make_unique<Tape>();
  Tensor y = x * 2.0;
  ASSERT_EQ(tape->entries().size(), 1u);
  std::thread([t = std::move(tape)]() mutable { t.reset(); }).join();
  EXPECT_EQ(Tape::active(), nullptr);  // the creator thread's stack dropped it
  Tensor z = x * x;                    // must not record into the destroyed tape
  EXPECT_FALSE(z.requires_grad());
}

TEST(TapeStack, InnerDestroyedOnAnotherThreadHandsBackToOuter) {
  Tensor x = param({3});
  Tape outer;
  auto inner = std::make_unique<Tape>();
  std::thread([t = std::move(inner)]() mutable { t.reset(); }).join();
  EXPECT_EQ(Tape::active(), &outer);
  Tensor loss = sum(x * 5.0);
  ASSERT_EQ(outer.entries().size(), 2u);
  outer.backward(loss);
  for (double g : x.grad().to_vector<double>()) EXPECT_EQ(g, 5.0);
}

// The foreign thread does not touch its own stack either: a tape of its own stays active.
TEST(TapeStack, ForeignDestructionLeavesTheDestroyingThreadsTapeAlone) {
  Tensor x = param({2});
  auto tape = std::make_unique<Tape>();
  std::thread([&] {
    Tape own;
    tape.reset();
    EXPECT_EQ(Tape::active(), &own);
    Tensor y = x * x;
    EXPECT_EQ(own.entries().size(), 1u);
  }).join();
  EXPECT_EQ(Tape::active(), nullptr);
}

// The creator thread is gone (its stack with it) when the tape is destroyed.
TEST(TapeStack, CreatorThreadExitedBeforeDestruction) {
  std::unique_ptr<Tape> tape;
  Tensor x = param({2});
  Tensor loss;
  std::thread([&] {
    tape = std::make_unique<Tape>();
    loss = sum(x * x);
  }).join();
  ASSERT_EQ(tape->entries().size(), 2u);
  EXPECT_EQ(Tape::active(), nullptr);  // it was never this thread's
  tape->backward(loss);
  tape.reset();
  EXPECT_TRUE(x.grad().defined());
}

// Recording on the creator thread while another thread destroys the tape: each op either
// lands on the tape before it dies or on no tape; nothing is written into freed memory
// (run under ASan by scripts/sanitize-cpu).
TEST(TapeStack, DestroyedOnAnotherThreadWhileRecording) {
  Tensor x = param({16});
  for (int round = 0; round < 20; ++round) {
    auto tape = std::make_unique<Tape>();
    std::atomic<bool> go{false};
    std::thread killer([&] {
      while (!go.load()) std::this_thread::yield();
      tape.reset();
    });
    try {
      for (int i = 0; i < 400; ++i) {
        if (i == 20) go.store(true);
        Tensor y = x * x;
      }
    } catch (const Error& e) {
      go.store(true);
      ADD_FAILURE() << e.what();
    }
    killer.join();
    EXPECT_EQ(Tape::active(), nullptr);
    Tensor z = x * x;
    EXPECT_FALSE(z.requires_grad());
  }
}

// ---- gradients across tapes ----------------------------------------------------------------

TEST(TapeBoundary, GradientIntoAnEndedTapeIsAnError) {
  Tensor x = param({3});
  Tensor h;
  {
    Tape first;
    h = x * 2.0;
  }
  Tape second;
  Tensor loss = sum(h * h);
  TG_EXPECT_ERROR(second.backward(loss), "Tape::backward", "'mul' input 0 f64[3] on cpu", "cannot flow",
                  "another tape", "detach()");
  EXPECT_FALSE(x.grad().defined());
}

TEST(TapeBoundary, GradientIntoAnEnclosingTapeIsAnError) {
  Tensor x = param({2, 3});
  Tape outer;
  Tensor h = relu(x);
  Tape inner;
  Tensor loss = sum(h.reshape({6}) * 2.0);
  TG_EXPECT_ERROR(inner.backward(loss), "'reshape' input 0 f64[2, 3] on cpu", "another tape");
}

// Tapes built in the same stack slot reuse an address; they must still be told apart.
TEST(TapeBoundary, TapesAtTheSameAddressAreDistinct) {
  Tensor x = param({4});
  Tensor h;
  for (int i = 0; i < 2; ++i) {
    Tape tape;
    if (i == 0) {
      h = x * x;
    } else {
      Tensor loss = sum(h * x);
      TG_EXPECT_ERROR(tape.backward(loss), "'mul' input 0", "another tape");
    }
  }
}

TEST(TapeBoundary, DetachedOrNoGradInputsStillWork) {
  Tensor x = param({3});
  Tensor w = param({3});
  Tensor h;
  {
    Tape first;
    h = x * 2.0;
  }
  Tape second;
  Tensor loss = sum(h.detach() * w) + sum(random({3}) * w);  // leaves and detached: no error
  second.backward(loss);
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
}

// ---- leaf gradients share no storage -------------------------------------------------------

TEST(LeafGrads, AddGivesEachInputItsOwnGradient) {
  Tensor x = param({3});
  Tensor y = param({3});
  Tape tape;
  tape.backward(sum(add(x, y)));
  ASSERT_TRUE(x.grad().defined() && y.grad().defined());
  EXPECT_NE(x.grad().raw_data(), y.grad().raw_data());
  x.grad().fill_(7.0);
  for (double g : y.grad().to_vector<double>()) EXPECT_EQ(g, 1.0);
}

TEST(LeafGrads, ReshapedViewsOfOneGradientAreSeparated) {
  Tensor x = param({2, 3});
  Tensor y = param({6});
  Tape tape;
  tape.backward(sum(x.reshape({6}) + y));
  EXPECT_NE(x.grad().raw_data(), y.grad().raw_data());
  y.grad().fill_(-1.0);
  for (double g : x.grad().to_vector<double>()) EXPECT_EQ(g, 1.0);
}

TEST(LeafGrads, SeedIsNotHandedOutAsAGradient) {
  Tensor x = param({2, 3});
  Tensor c = random({2, 3});
  Tensor seed = full({2, 3}, 0.5, {.dtype = f64});
  Tape tape;
  tape.backward(x + c, seed);
  ASSERT_TRUE(x.grad().defined());
  EXPECT_NE(x.grad().raw_data(), seed.raw_data());
  seed.fill_(9.0);
  for (double g : x.grad().to_vector<double>()) EXPECT_EQ(g, 0.5);
}

// A gradient nobody else holds is kept as produced: no copy for nothing.
TEST(LeafGrads, UnsharedGradientIsNotCopied) {
  Tensor x = param({5});
  Tape tape;
  Tensor produced;
  tape.on_gradient = [&](const TapeEntry& e, size_t, const Tensor& g) {
    if (e.op == "affine") produced = g;
  };
  tape.backward(sum(x * 3.0));
  ASSERT_TRUE(produced.defined());
  EXPECT_EQ(x.grad().raw_data(), produced.raw_data());
}

// ---- what backward refuses, and what it keeps apart ----------------------------------------

// y no longer holds x * 2 once written in place: the gradient through it would be the
// multiply's, for a value that does not depend on x. Backward refuses rather than lie.
TEST(TapeOutputs, WrittenInPlaceAfterRecordingIsRefused) {
  for (int how = 0; how < 2; ++how) {
    Tensor x = param({2});
    Tensor w = random({2});
    Tape tape;
    Tensor y = x * 2.0;
    if (how == 0) y.fill_(7.0);
    else y.copy_(random({2}));
    TG_EXPECT_ERROR(tape.backward(sum(y * w)), "output 0 f64[2] on cpu of 'affine' was modified in place");
  }
}

// Written before anything consumed it, or not at all: nothing to refuse.
TEST(TapeOutputs, UntouchedOutputsStillRunBackward) {
  Tensor x = param({3});
  Tensor w = random({3});
  Tape tape;
  Tensor y = x * 2.0;
  Tensor copy = y.detach().clone();
  copy.fill_(1.0);  // a clone has its own storage and version
  tape.backward(sum(y * w));
  const std::vector<double> g = x.grad().to_vector<double>(), wv = w.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i], 2.0 * wv[i]);
}

// add hands one gradient to both of its inputs: the leaf a gets it while b's copy is still
// on its way to x. A post-accumulate hook that edits a's grad in place must not change x's.
TEST(LeafGrads, HookEditingALeafGradLeavesPendingGradientsAlone) {
  Tensor a = param({2});
  Tensor x = param({2});
  Tensor w = from_vector(std::vector<double>{3, 4}, {2});
  register_post_accumulate_grad_hook(a, [](const Tensor& leaf) { leaf.grad().fill_(0.0); });
  Tape tape;
  Tensor b = x * 2.0;
  tape.backward(sum((a + b) * w));
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0, 0}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{6, 8}));
}

// One model, one tape per thread: every thread's backward adds into the shared leaf's grad.
// Each adds 1 per element per step, so the sum is exact whatever the interleaving.
TEST(LeafGrads, BackwardOnSeveralThreadsAccumulatesEveryGradient) {
  Tensor w = zeros({4}, {.dtype = f64});
  w.requires_grad_();
  constexpr int kThreads = 4, kSteps = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kSteps; ++i) {
        Tape tape;
        tape.backward(sum(w * 1.0));
      }
    });
  for (std::thread& t : threads) t.join();
  for (double g : w.grad().to_vector<double>()) EXPECT_EQ(g, double(kThreads * kSteps));
}
