// The CPU backend's threads (core/threads.h): set/get, and the rule that results do not
// depend on the thread count. Each case runs one computation at 1 thread and again at 2, 3
// and 4 (more threads than this machine may have cores is fine: they are still separate
// partitions) and compares every output bit for bit. Shapes are large enough that each op
// does split its work (ThreadsSplitWork checks that work really runs on several threads), and
// odd-sized, so partitions are uneven.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "common/test_util.h"
#include "ops/cpu/parallel.h"

using namespace tg;
using namespace tg::test;

namespace {

using Outputs = std::vector<Tensor>;
using Computation = std::function<Outputs()>;

Outputs run_with(int threads, const Computation& fn) {
  NumThreadsGuard guard(threads);
  return fn();
}

// Index of the first element whose bytes differ, or -1.
int64_t first_difference(const Tensor& a, const Tensor& b) {
  const std::size_t elem = dtype_size(a.dtype());
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(pa + i * elem, pb + i * elem, elem) != 0) return i;
  return -1;
}

void expect_same_bits_for_any_threads(const Computation& fn) {
  const Outputs ref = run_with(1, fn);
  for (int threads : {2, 3, 4}) {
    const Outputs got = run_with(threads, fn);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t k = 0; k < ref.size(); ++k) {
      ASSERT_TRUE(ref[k].defined() && got[k].defined()) << "output " << k;
      ASSERT_EQ(got[k].shape(), ref[k].shape()) << "output " << k;
      ASSERT_EQ(got[k].dtype(), ref[k].dtype()) << "output " << k;
      const int64_t i = first_difference(got[k], ref[k]);
      EXPECT_EQ(i, -1) << "output " << k << " (" << ref[k].shape() << ") differs at element " << i << " with "
                       << threads << " threads: " << got[k].to_vector<double>()[size_t(std::max<int64_t>(i, 0))]
                       << " vs " << ref[k].to_vector<double>()[size_t(std::max<int64_t>(i, 0))];
    }
  }
}

// Forward output and the gradients of sum(y * gy) with respect to each input: backward with
// a fixed random output gradient. Inputs are cloned per run so their grads start empty.
Outputs forward_backward(const std::function<Tensor(const std::vector<Tensor>&)>& op, const std::vector<Tensor>& inputs,
                         const Tensor& gy) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.clone().requires_grad_());
  Tape tape;
  Tensor y = op(leaves);
  tape.backward(sum(mul(y, gy)));
  Outputs out{y.detach()};
  for (const Tensor& l : leaves) out.push_back(l.grad());
  return out;
}

void expect_op_same_bits(const std::function<Tensor(const std::vector<Tensor>&)>& op, std::vector<Tensor> inputs) {
  const Tensor gy = random(op(inputs).shape(), inputs[0].dtype());
  expect_same_bits_for_any_threads([&] { return forward_backward(op, inputs, gy); });
}

constexpr DType kF32 = DType::f32;

}  // namespace

TEST(Threads, SetGetRoundTrip) {
  const int before = get_num_threads();
  EXPECT_GE(before, 1);
  EXPECT_GE(default_num_threads(), 1);
  set_num_threads(3);
  EXPECT_EQ(get_num_threads(), 3);
  set_num_threads(1);
  EXPECT_EQ(get_num_threads(), 1);
  {
    NumThreadsGuard guard(5);
    EXPECT_EQ(get_num_threads(), 5);
  }
  EXPECT_EQ(get_num_threads(), 1);
  set_num_threads(0);  // back to the default
  EXPECT_EQ(get_num_threads(), default_num_threads());
  set_num_threads(-2);
  EXPECT_EQ(get_num_threads(), default_num_threads());
  set_num_threads(before);
}

TEST(Threads, TooManyIsAnError) {
  const int before = get_num_threads();
  TG_EXPECT_ERROR(set_num_threads(kMaxThreads + 1), "set_num_threads(1025)", "at most 1024");
  EXPECT_EQ(get_num_threads(), before);  // unchanged
  set_num_threads(kMaxThreads);
  EXPECT_EQ(get_num_threads(), kMaxThreads);
  set_num_threads(before);
}

// The cases below are only meaningful if work really is split: a large loop at 4 threads is
// cut into disjoint ranges that cover it, and they run on more than one thread.
TEST(Threads, ThreadsSplitWork) {
  NumThreadsGuard guard(4);
  EXPECT_EQ(cpu::threads_for(1 << 20, 1), 4);
  EXPECT_EQ(cpu::threads_for(10, 1), 1);  // too little work to wake the pool
  const int64_t n = 1 << 20;
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex m;
  std::set<std::thread::id> ids;
  std::atomic<int64_t> ranges{0};
  cpu::parallel_ranges(n, 1, [&](int64_t b, int64_t e) {
    ++ranges;
    {
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    }
    // Hold the first ranges a moment, so that a second thread joins even on a busy machine.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < until) {
      std::lock_guard<std::mutex> lock(m);
      if (ids.size() > 1) break;
    }
    for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
  });
  EXPECT_EQ(ranges.load(), 4 * cpu::kRangesPerThread);
  EXPECT_GE(ids.size(), 2u);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << i;
}

// A kernel called while another thread's kernel holds the pool runs on its own thread, and
// both are right.
TEST(Threads, ConcurrentCallersSameBits) {
  manual_seed(10);
  const Tensor a = random({301, 271}, kF32), w = random({263, 271}, kF32);
  const Tensor ref = linear(a, w);
  std::vector<Tensor> got(4);
  std::vector<std::thread> callers;
  for (size_t k = 0; k < got.size(); ++k) callers.emplace_back([&, k] { got[k] = linear(a, w); });
  for (std::thread& t : callers) t.join();
  for (const Tensor& g : got) EXPECT_EQ(first_difference(g, ref), -1);
}

TEST(Threads, Conv2dSameBits) {
  manual_seed(11);
  for (Layout layout : {Layout::NCHW, Layout::NHWC}) {
    SCOPED_TRACE(layout == Layout::NCHW ? "NCHW" : "NHWC");
    const Shape xs = layout == Layout::NCHW ? Shape{6, 5, 37, 41} : Shape{6, 37, 41, 5};
    expect_op_same_bits(
        [&](const std::vector<Tensor>& t) {
          return conv2d(t[0], t[1], t[2], {.stride = {1, 2}, .padding = {1}, .layout = layout});
        },
        {random(xs, kF32), random({13, 5, 3, 3}, kF32), random({13}, kF32)});
  }
  // Many chunks per sample (C * kvol = 9: 29127 positions per chunk) and one sample only.
  expect_op_same_bits([](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], Tensor(), {.padding = {1}}); },
                      {random({1, 1, 181, 367}, kF32), random({7, 1, 3, 3}, kF32)});
}

TEST(Threads, Conv3dSameBits) {
  manual_seed(12);
  expect_op_same_bits(
      [](const std::vector<Tensor>& t) { return conv3d(t[0], t[1], t[2], {.padding = {1, 0, 1}, .dilation = {1, 2, 1}}); },
      {random({5, 3, 9, 19, 17}, kF32), random({11, 3, 3, 3, 3}, kF32), random({11}, kF32)});
}

TEST(Threads, ConvTranspose2dSameBits) {
  manual_seed(13);
  expect_op_same_bits([](const std::vector<Tensor>& t) { return conv_transpose2d(t[0], t[1], t[2], {.stride = {2}}); },
                      {random({5, 9, 23, 29}, kF32), random({9, 7, 3, 3}, kF32), random({7}, kF32)});
}

TEST(Threads, LinearSameBits) {
  manual_seed(14);
  // 301 x 263 outputs: 2 x 2 tiles, uneven; backward's GEMMs (301 x 271 and 263 x 271) too.
  expect_op_same_bits([](const std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); },
                      {random({301, 271}, kF32), random({263, 271}, kF32), random({263}, kF32)});
  expect_op_same_bits([](const std::vector<Tensor>& t) { return matmul(t[0], t[1]); },
                      {random({517, 33}, DType::f64), random({33, 7}, DType::f64)});
}

TEST(Threads, GroupNormSameBits) {
  manual_seed(15);
  expect_op_same_bits([](const std::vector<Tensor>& t) { return group_norm(t[0], t[1], t[2], 4); },
                      {random({7, 12, 31, 29}, kF32), random({12}, kF32), random({12}, kF32)});
}

TEST(Threads, LayerNormSameBits) {
  manual_seed(16);
  expect_op_same_bits([](const std::vector<Tensor>& t) { return layer_norm(t[0], {257}, t[1], t[2]); },
                      {random({301, 257}, kF32), random({257}, kF32), random({257}, kF32)});
}

TEST(Threads, SoftmaxSameBits) {
  manual_seed(17);
  expect_op_same_bits([](const std::vector<Tensor>& t) { return softmax(t[0], 1); }, {random({37, 101, 29}, kF32)});
  expect_op_same_bits([](const std::vector<Tensor>& t) { return log_softmax(t[0], 2); }, {random({37, 101, 29}, kF32)});
}

TEST(Threads, PoolUpsampleSameBits) {
  manual_seed(18);
  const Tensor x = random({6, 7, 47, 53}, kF32);
  expect_op_same_bits([](const std::vector<Tensor>& t) { return max_pool2d(t[0], {.kernel_size = {3}, .stride = {2}}); },
                      {x});
  expect_op_same_bits([](const std::vector<Tensor>& t) { return avg_pool2d(t[0], {.kernel_size = {3}, .stride = {2}}); },
                      {x});
  expect_op_same_bits([](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], {5, 7}); }, {x});
  expect_op_same_bits([](const std::vector<Tensor>& t) { return upsample_bilinear2d(t[0], {2.0, 1.5}); }, {x});
}

TEST(Threads, ElementwiseReductionLossSameBits) {
  manual_seed(19);
  const Tensor a = random({97, 1013}, kF32), b = random({1013}, kF32), c = random({97, 1013}, kF32);
  expect_op_same_bits([](const std::vector<Tensor>& t) { return gelu(add(mul(t[0], t[1]), t[0])); }, {a, b});
  // Sums over 98261 elements: several fixed chunks. In f64, where a different association
  // of the double accumulation shows (in f32 the final rounding would mostly hide it).
  const Tensor a64 = random({97, 1013}), c64 = random({97, 1013});
  for (const auto& [x, y] : {std::pair{a, c}, std::pair{a64, c64}}) {
    expect_same_bits_for_any_threads([&] { return Outputs{sum(x), mean(x, {0}), sum(x, {1}), mse_loss(x, y)}; });
    expect_same_bits_for_any_threads([&] {
      return Outputs{l1_loss(x, y), smooth_l1_loss(x, y), binary_cross_entropy_with_logits(x, affine(y, 0.5, 0.5)),
                     dropout(x, {.p = 0.3, .seed = 5}), x.permute({1, 0})};
    });
  }
  std::vector<int64_t> labels(97);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i * 7 % 1013);
  const Tensor target = from_vector(labels, {97});
  expect_op_same_bits([&](const std::vector<Tensor>& t) { return cross_entropy(t[0], target); }, {a});
}

// A training step of a small CNN (conv, group norm, SiLU, max pool, conv, mean, linear) with
// AdamW: every parameter after two steps, and the losses.
TEST(Threads, TrainingStepSameBits) {
  manual_seed(20);
  const Tensor x = random({8, 3, 40, 36}, kF32), target = random({8, 5}, kF32);
  expect_same_bits_for_any_threads([&] {
    manual_seed(21);  // the same initial parameters in every run
    auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 3, .out_channels = 16, .kernel_size = {3, 3},
                                                       .padding = {1}}),
        std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 4, .num_channels = 16}),
        std::make_shared<nn::SiLU>(),
        std::make_shared<nn::MaxPool2d>(nn::PoolOptions{.kernel_size = {2}}),
        std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 16, .out_channels = 24, .kernel_size = {3, 3}}),
        std::make_shared<nn::MeanPool>(),
        std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 24, .out_features = 5})});
    nn::AdamW opt(model->parameters(), {.lr = 0.01});
    Outputs out;
    for (int step = 0; step < 2; ++step) {
      Tape tape;
      Tensor loss = mse_loss(model->forward(x), target);
      out.push_back(loss.detach());
      tape.backward(loss);
      opt.step();
      opt.zero_grad();
    }
    for (const Tensor& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  });
}
