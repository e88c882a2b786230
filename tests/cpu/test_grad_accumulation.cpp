// Gradient accumulation over several tapes (nn/optim/optimizer.h): backward on micro-batches
// without zero_grad in between sums the grads, giving what one backward over the
// concatenated batch gives with a sum-reduced loss, and a mean-reduced loss needs each
// micro-batch's loss weighted by its share of the batch. Then one optimizer step on the
// accumulated grads equals the step on the full batch's grads.
#include <cmath>

#include "common/fixtures.h"
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

std::shared_ptr<nn::Sequential> model_f64() {
  auto m = small_cnn(3);
  m->to(f64);
  return m;
}

void expect_grads_match(nn::Module& a, nn::Module& b) {
  const std::vector<Tensor> pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pa[i].grad().defined() && pb[i].grad().defined()) << i;
    // The same sums in another order: f64 rounding only.
    EXPECT_LE(rel_l2(pa[i].grad(), pb[i].grad()), 1e-13) << "parameter " << i;
  }
}

}  // namespace

TEST(GradAccumulation, TwoTapesWithSumReductionEqualOneBackwardOverTheWholeBatch) {
  manual_seed(21);
  const Tensor x = randn({7, 3, 7, 9}, {.dtype = f64});
  const Tensor y = rand({7, 5}, {.dtype = f64});  // BCE targets in [0, 1)
  auto accumulated = model_f64(), whole = model_f64();
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 3}, {3, 7}}) {
    Tape tape;  // one tape per micro-batch; no zero_grad in between
    tape.backward(binary_cross_entropy_with_logits((*accumulated)(rows_of(x, begin, end)), rows_of(y, begin, end),
                                                   Reduction::sum));
  }
  {
    Tape tape;
    tape.backward(binary_cross_entropy_with_logits((*whole)(x), y, Reduction::sum));
  }
  expect_grads_match(*accumulated, *whole);
  // A single micro-batch's grads are not the whole batch's: the test compares sums.
  auto half = model_f64();
  {
    Tape tape;
    tape.backward(binary_cross_entropy_with_logits((*half)(rows_of(x, 0, 3)), rows_of(y, 0, 3), Reduction::sum));
  }
  EXPECT_GT(rel_l2(half->parameters()[0].grad(), whole->parameters()[0].grad()), 0.05);

  // The optimizer then takes the same step.
  nn::SGD sa(accumulated->parameters(), {.lr = 0.1, .momentum = 0.9});
  nn::SGD sw(whole->parameters(), {.lr = 0.1, .momentum = 0.9});
  sa.step();
  sw.step();
  for (size_t i = 0; i < accumulated->parameters().size(); ++i)
    EXPECT_LE(rel_l2(accumulated->parameters()[i], whole->parameters()[i]), 1e-13) << i;
}

TEST(GradAccumulation, MeanReductionNeedsEachMicroBatchWeightedByItsShare) {
  manual_seed(22);
  const Tensor x = randn({5, 3, 7, 9}, {.dtype = f64});
  const Tensor y = uniform({5, 5}, -1.0, 1.0, {.dtype = f64});
  auto accumulated = model_f64(), whole = model_f64();
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 2}, {2, 5}}) {
    Tape tape;
    const Tensor loss = smooth_l1_loss((*accumulated)(rows_of(x, begin, end)), rows_of(y, begin, end), {.beta = 0.3});
    // The mean over the micro-batch, times its share of the batch, is its part of the mean.
    tape.backward(loss, full({}, double(end - begin) / 5.0, {.dtype = f64}));
  }
  {
    Tape tape;
    tape.backward(smooth_l1_loss((*whole)(x), y, {.beta = 0.3}));
  }
  expect_grads_match(*accumulated, *whole);
}
