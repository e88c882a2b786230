// CUDA graphs (core/cuda_graph.h): a captured training step replays to exactly the
// parameters the eager step reaches, with the data refilled into static tensors each step,
// with SGD and AdamW, with dropout (module and process-wide generator), and with grads kept
// past the step; ops that need the host fail with tg::CaptureError naming them, and leave
// the stream usable; cross_entropy still reports a bad target under replay.
#include <cmath>
#include <random>

#include "common/expect_message.h"
#include "common/test_util.h"
#include "core/cuda_graph.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr int64_t kBatch = 6, kClasses = 5;

enum class DropoutKind { none, module, global };

struct Model {
  std::shared_ptr<nn::Sequential> features;  // conv -> GN -> ReLU (-> nn::Dropout) -> mean
  std::shared_ptr<nn::Linear> head;
  DropoutKind dropout = DropoutKind::none;

  Model(Device d, DropoutKind kind) : dropout(kind) {
    TensorOptions t{.device = d};
    features = std::make_shared<nn::Sequential>();
    features->add(std::make_shared<nn::Conv2d>(
        nn::Conv2dOptions{.in_channels = 3, .out_channels = 8, .kernel_size = {3, 3}, .padding = {1}}, t));
    features->add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 4, .num_channels = 8}, t));
    features->add(std::make_shared<nn::ReLU>());
    if (kind == DropoutKind::module) features->add(std::make_shared<nn::Dropout>(nn::DropoutOptions{.p = 0.25}));
    features->add(std::make_shared<nn::MeanPool>());
    head = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 8, .out_features = kClasses}, t);
  }
  Tensor forward(const Tensor& x) {
    Tensor h = features->forward(x);
    if (dropout == DropoutKind::global) h = tg::dropout(h, 0.3);  // the process-wide generator
    return head->forward(h);
  }
  std::vector<Tensor> parameters() {
    std::vector<Tensor> p = features->parameters();
    for (const Tensor& q : head->parameters()) p.push_back(q);
    return p;
  }
};

// Fresh random batches (never zeros), one per step, already on the GPU.
struct Batches {
  std::vector<Tensor> inputs, targets;
};
Batches make_batches(int steps, uint64_t seed) {
  Batches b;
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> label(0, kClasses - 1);
  manual_seed(seed);
  for (int k = 0; k < steps; ++k) {
    b.inputs.push_back(randn({kBatch, 3, 9, 13}, {.device = Device::cuda()}));
    std::vector<int64_t> t(kBatch);
    for (auto& v : t) v = label(gen);
    b.targets.push_back(from_vector(t, {kBatch}, {.dtype = DType::i64, .device = Device::cuda()}));
  }
  return b;
}

enum class Optim { sgd, adamw };

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> params, initial_params;
  uint64_t rng_offset_after = 0;  // where the process-wide generator ended
  int64_t optimizer_steps = 0;     // the optimizer's own count, advanced by replays too
};

struct RunOptions {
  Optim optim = Optim::sgd;
  DropoutKind dropout = DropoutKind::none;
  bool graphed = false;
  bool zero_grad_first = false;  // grads made in the step and kept past it
  int steps = 7;
};

Run train(const Batches& data, RunOptions o) {
  manual_seed(99);
  Model model(Device::cuda(), o.dropout);
  std::unique_ptr<nn::Optimizer> opt;
  if (o.optim == Optim::sgd)
    opt = std::make_unique<nn::SGD>(model.parameters(), nn::SGDOptions{.lr = 0.05, .momentum = 0.9});
  else
    opt = std::make_unique<nn::AdamW>(model.parameters(), nn::AdamWOptions{.lr = 1e-2});
  Tensor x = Tensor::empty({kBatch, 3, 9, 13}, {.device = Device::cuda()});
  Tensor y = Tensor::empty({kBatch}, {.dtype = DType::i64, .device = Device::cuda()});
  auto step = [&] {
    if (o.zero_grad_first) opt->zero_grad();
    Tape tape;
    Tensor loss = cross_entropy(model.forward(x), y);
    tape.backward(loss);
    opt->step();
    if (!o.zero_grad_first) opt->zero_grad();
    return loss;
  };
  cuda::GraphedStep graphed(step, {.warmup = 2});
  Run r;
  for (const Tensor& p : model.parameters()) r.initial_params.push_back(p.to_vector<float>());
  for (int k = 0; k < o.steps; ++k) {
    x.copy_(data.inputs[static_cast<size_t>(k)]);
    y.copy_(data.targets[static_cast<size_t>(k)]);
    Tensor loss = o.graphed ? graphed() : step();
    r.losses.push_back(loss.item());
  }
  if (o.graphed) {
    EXPECT_TRUE(graphed.graphed());
    EXPECT_EQ(graphed.graph()->replays(), o.steps - 2);
  }
  for (const Tensor& p : model.parameters()) r.params.push_back(p.to_vector<float>());
  r.rng_offset_after = next_random_draw(0).offset;
  r.optimizer_steps = opt->step_count();
  return r;
}

void expect_graphed_equals_eager(RunOptions o) {
  const Batches data = make_batches(o.steps, 5150);
  o.graphed = false;
  const Run eager = train(data, o);
  o.graphed = true;
  const Run graphed = train(data, o);
  ASSERT_EQ(graphed.losses.size(), eager.losses.size());
  for (size_t k = 0; k < eager.losses.size(); ++k) {
    ASSERT_TRUE(std::isfinite(eager.losses[k])) << "step " << k;
    EXPECT_EQ(graphed.losses[k], eager.losses[k]) << "step " << k;  // bit for bit
  }
  ASSERT_EQ(graphed.params.size(), eager.params.size());
  for (size_t i = 0; i < eager.params.size(); ++i) {
    EXPECT_EQ(graphed.params[i], eager.params[i]) << "parameter " << i;
    EXPECT_NE(eager.params[i], eager.initial_params[i]) << "parameter " << i << " did not train";
  }
  EXPECT_EQ(graphed.rng_offset_after, eager.rng_offset_after);
  EXPECT_EQ(graphed.optimizer_steps, eager.optimizer_steps);
}

}  // namespace

TEST(CudaGraph, SgdStepIsBitIdenticalToEager) {
  TG_REQUIRE_GPU();
  expect_graphed_equals_eager({.optim = Optim::sgd});
}

TEST(CudaGraph, AdamWStepIsBitIdenticalToEager) {
  TG_REQUIRE_GPU();
  expect_graphed_equals_eager({.optim = Optim::adamw});
}

TEST(CudaGraph, GradsKeptPastTheStepAreGraphOutputs) {
  TG_REQUIRE_GPU();
  // zero_grad at the start: the grads are made in the step and outlive it.
  expect_graphed_equals_eager({.optim = Optim::adamw, .zero_grad_first = true});
}

TEST(CudaGraph, DropoutModuleMasksAdvancePerReplay) {
  TG_REQUIRE_GPU();
  expect_graphed_equals_eager({.optim = Optim::sgd, .dropout = DropoutKind::module});
}

TEST(CudaGraph, DropoutFromTheGlobalGeneratorAdvancesPerReplay) {
  TG_REQUIRE_GPU();
  expect_graphed_equals_eager({.optim = Optim::adamw, .dropout = DropoutKind::global});
}

TEST(CudaGraph, ReplayingDropoutDrawsNewMasks) {
  TG_REQUIRE_GPU();
  manual_seed(3);
  Tensor x = rand({4096}, {.device = Device::cuda()}) + 1.0;  // no zeros: a zero marks a dropped element
  Tensor out = Tensor::empty({4096}, {.device = Device::cuda()});
  Tensor warm = tg::dropout(x, 0.5);
  cuda::Graph g;
  g.capture([&] { out.copy_(tg::dropout(x, 0.5)); });
  g.replay();
  const std::vector<float> first = out.to_vector<float>();
  g.replay();
  const std::vector<float> second = out.to_vector<float>();
  EXPECT_NE(first, second);
  EXPECT_NE(first, warm.to_vector<float>());
}

TEST(CudaGraph, HostOpsFailNamingTheOpAndTheStreamStaysUsable) {
  TG_REQUIRE_GPU();
  manual_seed(8);
  Model model(Device::cuda(), DropoutKind::none);
  nn::SGD opt(model.parameters(), {.lr = 0.05});
  Tensor x = randn({kBatch, 3, 9, 13}, {.device = Device::cuda()});
  Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0}, {kBatch}, {.dtype = DType::i64, .device = Device::cuda()});
  auto forward_backward = [&] {
    Tape tape;
    Tensor loss = cross_entropy(model.forward(x), y);
    tape.backward(loss);
    return loss;
  };
  forward_backward();  // eager warm-up
  opt.zero_grad();

  struct Case {
    const char* name;
    std::function<void()> body;
  };
  const std::vector<Case> cases = {
      {"clip_grad_norm_", [&] { forward_backward(); nn::clip_grad_norm_(model.parameters(), 1.0); }},
      {"clip_grad_value_", [&] { forward_backward(); nn::clip_grad_value_(model.parameters(), 1.0); }},
      {"item", [&] { forward_backward().item(); }},
      {"to(device)", [&] { forward_backward().to(Device::cpu()); }},
      {"to_vector", [&] { forward_backward().to_vector<float>(); }},
      {"synchronize", [&] { forward_backward(); synchronize(Device::cuda()); }},
  };
  for (const Case& c : cases) {
    cuda::Graph g;
    const std::string msg = message_of<CaptureError>([&] { g.capture(c.body); });
    EXPECT_TRUE(contains(msg, c.name)) << msg;
    EXPECT_TRUE(contains(msg, "cannot be captured")) << msg;
    EXPECT_FALSE(g.captured());
    EXPECT_FALSE(cuda::capturing(0));
    // The grads made inside the failed capture are invalid: drop them, then train eagerly.
    opt.zero_grad();
    Tensor loss = forward_backward();
    opt.step();
    opt.zero_grad();
    EXPECT_TRUE(std::isfinite(loss.item())) << c.name;
  }
  // And a good step still captures and replays.
  Tensor static_loss = Tensor::empty({}, {.device = Device::cuda()});
  cuda::Graph good;
  good.capture([&] {
    static_loss.copy_(forward_backward());
    opt.step();
    opt.zero_grad();
  });
  good.replay();
  good.replay();
  EXPECT_TRUE(std::isfinite(static_loss.item()));
  EXPECT_GT(good.num_nodes(), 10u);
}

TEST(CudaGraph, RandomFillsAndProfilingAreRefused) {
  TG_REQUIRE_GPU();
  {
    cuda::Graph g;
    const std::string msg =
        message_of<CaptureError>([&] { g.capture([] { randn({16}, {.device = Device::cuda()}); }); });
    EXPECT_TRUE(contains(msg, "random")) << msg;
  }
  {
    Profiler prof;
    cuda::Graph g;
    const std::string msg = message_of<CaptureError>([&] { g.capture([] {}); });
    EXPECT_TRUE(contains(msg, "Profiler")) << msg;
  }
  {
    cuda::Graph g;
    const std::string msg = message_of<CaptureError>([&] { g.capture([] { Profiler inner; }); });
    EXPECT_TRUE(contains(msg, "Profiler")) << msg;
  }
  // Eager work after the refusals.
  Tensor a = randn({32}, {.device = Device::cuda()});
  EXPECT_TRUE(std::isfinite(sum(a).item()));
}

TEST(CudaGraph, CrossEntropyReportsABadTargetUnderReplay) {
  TG_REQUIRE_GPU();
  manual_seed(21);
  Model model(Device::cuda(), DropoutKind::none);
  nn::SGD opt(model.parameters(), {.lr = 0.01});
  Tensor x = randn({kBatch, 3, 9, 13}, {.device = Device::cuda()});
  Tensor good = from_vector(std::vector<int64_t>{4, 3, 2, 1, 0, 2}, {kBatch}, {.dtype = DType::i64, .device = Device::cuda()});
  Tensor bad = from_vector(std::vector<int64_t>{4, 3, 7, 1, 0, 2}, {kBatch}, {.dtype = DType::i64, .device = Device::cuda()});
  Tensor y = good.clone();
  cuda::GraphedStep step(
      [&] {
        Tape tape;
        Tensor loss = cross_entropy(model.forward(x), y);
        tape.backward(loss);
        opt.step();
        opt.zero_grad();
        return loss;
      },
      {.warmup = 1});
  step();
  step();  // captured and replayed
  ASSERT_TRUE(step.graphed());
  EXPECT_TRUE(std::isfinite(step().item()));
  check_errors(Device::cuda());  // nothing to report

  y.copy_(bad);
  EXPECT_TRUE(std::isnan(step().item()));
  TG_EXPECT_ERROR(check_errors(Device::cuda()), "cross_entropy", "target 7", "row 2");

  // Reported by the next replay as well, when nobody asked in between.
  y.copy_(bad);
  step();
  synchronize(Device::cuda());
  y.copy_(good);
  TG_EXPECT_ERROR(step(), "cross_entropy", "target 7");
}

TEST(CudaGraph, MisuseIsRejected) {
  TG_REQUIRE_GPU();
  cuda::Graph g;
  TG_EXPECT_ERROR(g.replay(), "nothing was captured");
  Tensor z = Tensor::empty({8}, {.device = Device::cuda()});
  z.fill_(1.0);  // eagerly first, as a warm-up would
  g.capture([&] { z.fill_(2.0); });
  g.replay();
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(8, 2.0f));
  TG_EXPECT_ERROR(g.capture([] {}), "already holds a capture");
  TG_EXPECT_ERROR(cuda::Graph(Device::cpu()), "GPU device");
  TG_EXPECT_ERROR(cuda::GraphedStep([] { return Tensor(); }, {.warmup = 0}), "warmup");
}
