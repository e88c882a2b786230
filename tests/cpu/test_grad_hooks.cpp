// Post-accumulate-grad hooks (autograd/grad_hooks.h) and Tape::queue_callback: a leaf's hook
// runs once per backward, as soon as its gradient is complete (before the leaves nearer the
// input), with grad() already final; callbacks run after every hook. Data-parallel training
// relies on both to overlap gradient reduction with backward.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/grad_hooks.h"
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

Tensor leaf(const Shape& s) {
  Tensor t = randn(s, {.dtype = f64});
  t.requires_grad_();
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace

// y = relu(x w1^T) w2^T: w2's gradient is complete first (its only consumer is the last
// op), w1's after. Each hook sees its leaf's final grad and runs exactly once.
TEST(GradHooks, RunOnceWhenTheLeafIsCompleteInReverseOrder) {
  manual_seed(3);
  Tensor x = randn({5, 4}, {.dtype = f64});
  Tensor w1 = leaf({6, 4}), w2 = leaf({3, 6});
  std::vector<std::string> order;
  std::vector<double> seen_norms;
  register_post_accumulate_grad_hook(w1, [&](const Tensor& t) {
    order.push_back("w1");
    ASSERT_TRUE(t.grad().defined());
    seen_norms.push_back(sum(t.grad() * t.grad()).item());
  });
  register_post_accumulate_grad_hook(w2, [&](const Tensor& t) {
    order.push_back("w2");
    ASSERT_TRUE(t.grad().defined());
    // w1 has no grad yet when w2's hook runs: backward has not reached it.
    EXPECT_FALSE(w1.grad().defined());
    seen_norms.push_back(sum(t.grad() * t.grad()).item());
  });
  Tape tape;
  Tensor y = linear(relu(linear(x, w1)), w2);
  tape.backward(sum(y * y));
  ASSERT_EQ(order, (std::vector<std::string>{"w2", "w1"}));
  // What each hook saw is the grad left after backward.
  EXPECT_DOUBLE_EQ(seen_norms[0], sum(w2.grad() * w2.grad()).item());
  EXPECT_DOUBLE_EQ(seen_norms[1], sum(w1.grad() * w1.grad()).item());
}

// A leaf used by two ops gets its hook after both have contributed, once.
TEST(GradHooks, ALeafUsedTwiceRunsAfterBothUses) {
  manual_seed(4);
  Tensor w = leaf({4, 4});
  Tensor x = randn({2, 4}, {.dtype = f64});
  int calls = 0;
  Tensor seen;
  register_post_accumulate_grad_hook(w, [&](const Tensor& t) {
    ++calls;
    seen = t.grad().clone();
  });
  Tape tape;
  Tensor h = linear(x, w);     // first use
  Tensor y = linear(h, w);     // second use, nearer the loss
  tape.backward(sum(y));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(max_abs_diff(seen, w.grad()), 0.0);
  // The grad includes both uses: compare with the gradient of a copy used once per path.
  Tensor wa = w.detach().clone(), wb = w.detach().clone();
  wa.requires_grad_();
  wb.requires_grad_();
  Tape t2;
  t2.backward(sum(linear(linear(x, wa), wb)));
  EXPECT_LE(max_abs_diff(w.grad(), wa.grad() + wb.grad()), 1e-12);
}

// Across two backward calls the hook sees the accumulated grad; a leaf off the loss's path
// gets no call; a removed hook no longer runs.
TEST(GradHooks, AccumulationUnusedLeavesAndRemoval) {
  manual_seed(5);
  Tensor w = leaf({3}), unused = leaf({3});
  std::vector<Tensor> seen;
  const uint64_t id = register_post_accumulate_grad_hook(w, [&](const Tensor& t) { seen.push_back(t.grad().clone()); });
  int unused_calls = 0;
  register_post_accumulate_grad_hook(unused, [&](const Tensor&) { ++unused_calls; });
  for (int step = 0; step < 2; ++step) {
    Tape tape;
    Tensor other = unused * 2.0;  // recorded, but not on the loss's path
    (void)other;
    tape.backward(sum(w * w));
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_LE(max_abs_diff(seen[1], seen[0] * 2.0), 1e-15);  // 2w, then 2w + 2w
  EXPECT_EQ(unused_calls, 0);
  remove_post_accumulate_grad_hook(w, id);
  remove_post_accumulate_grad_hook(w, id);  // idempotent
  Tape tape;
  tape.backward(sum(w * w));
  EXPECT_EQ(seen.size(), 2u);
}

// Callbacks queued from hooks run after every leaf is final, once; queue_callback outside a
// backward throws.
TEST(GradHooks, QueuedCallbacksRunAfterAllLeaves) {
  manual_seed(6);
  Tensor a = leaf({2, 3}), b = leaf({3});
  Tensor x = randn({4, 3}, {.dtype = f64});
  std::vector<std::string> events;
  bool queued = false;
  auto hook = [&](const std::string& name) {
    return [&, name](const Tensor&) {
      events.push_back(name);
      if (!queued) {
        queued = true;
        Tape::queue_callback([&] {
          events.push_back("callback");
          EXPECT_TRUE(a.grad().defined() && b.grad().defined());
          Tape::queue_callback([&] { events.push_back("nested"); });
        });
      }
    };
  };
  register_post_accumulate_grad_hook(a, hook("a"));
  register_post_accumulate_grad_hook(b, hook("b"));
  Tape tape;
  tape.backward(sum(linear(x * b, a)));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2], "callback");
  EXPECT_EQ(events[3], "nested");
  EXPECT_THROW(Tape::queue_callback([] {}), Error);
}

TEST(GradHooks, OnlyLeavesThatRequireGrad) {
  Tensor plain = randn({2});
  EXPECT_THROW(register_post_accumulate_grad_hook(plain, [](const Tensor&) {}), Error);
  Tensor w = leaf({2});
  Tape tape;
  Tensor y = w * 3.0;
  EXPECT_THROW(register_post_accumulate_grad_hook(y, [](const Tensor&) {}), Error);
  EXPECT_THROW(register_post_accumulate_grad_hook(w, GradHook()), Error);
}

// A hook that throws ends backward with its exception.
TEST(GradHooks, AThrowingHookPropagates) {
  Tensor w = leaf({2});
  register_post_accumulate_grad_hook(w, [](const Tensor&) { throw Error("hook failed on purpose"); });
  Tape tape;
  EXPECT_THROW(tape.backward(sum(w * w)), Error);
}
