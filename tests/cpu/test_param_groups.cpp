// Parameter groups: each group updated with its own options exactly as a separate optimizer
// with those options would, defaults filling what a group leaves unset, lr setters and
// getters per group, state keyed by the global parameter index, checks that leave the
// optimizer unchanged, and checkpoints that restore every group's lr (a schedule's 0
// included).
#include <cmath>
#include <limits>

#include "common/fixtures.h"
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr int kSteps = 3;

// Fresh random grads (never zero) for each parameter at each step: grads[step][param].
std::vector<std::vector<Tensor>> make_grads(const std::vector<Tensor>& params) {
  std::vector<std::vector<Tensor>> out(kSteps);
  for (auto& step : out)
    for (const Tensor& p : params) step.push_back(uniform(p.shape(), -2.0, 2.0, {.dtype = p.dtype()}));
  return out;
}

std::vector<Tensor> copies(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Each step: parameter i of `params` gets grads[step][first + i], then every optimizer steps.
void run(const std::vector<nn::Optimizer*>& opts, const std::vector<Tensor>& params, size_t first,
         const std::vector<std::vector<Tensor>>& grads) {
  for (const auto& step : grads) {
    for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(step[first + i].clone());
    for (nn::Optimizer* o : opts) o->step();
  }
}

void expect_same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "parameter " << i;
}

}  // namespace

// Two groups with different options give, bit for bit, what two optimizers give.
TEST(ParamGroups, SGDGroupsUpdateAsSeparateOptimizers) {
  const std::vector<Tensor> a = {random({7, 3}).requires_grad_(), random({13}).requires_grad_()};
  const std::vector<Tensor> b = {random({5}).requires_grad_()};
  std::vector<Tensor> all = a;
  all.push_back(b[0]);
  const auto grads = make_grads(all);
  const std::vector<Tensor> g_all = copies(all), sa = copies(a), sb = copies(b);

  nn::SGD grouped({{.params = {g_all[0], g_all[1]}},
                   {.params = {g_all[2]},
                    .options = {.lr = 0.3, .momentum = 0.5, .weight_decay = 0.1, .nesterov = false}}},
                  {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  nn::SGD opt_a(sa, {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  nn::SGD opt_b(sb, {.lr = 0.3, .momentum = 0.5, .weight_decay = 0.1});
  run({&grouped}, g_all, 0, grads);
  run({&opt_a}, sa, 0, grads);
  run({&opt_b}, sb, 2, grads);
  expect_same({g_all[0], g_all[1]}, sa);
  expect_same({g_all[2]}, sb);
  // The groups did differ: one optimizer with group 0's options for all gives another b.
  const std::vector<Tensor> one = copies(all);
  nn::SGD single(one, {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  run({&single}, one, 0, grads);
  EXPECT_FALSE(bitwise_equal(one[2], g_all[2]));
  EXPECT_TRUE(bitwise_equal(one[0], g_all[0]));
}

TEST(ParamGroups, AdamGroupsUpdateAsSeparateOptimizers) {
  const std::vector<Tensor> a = {random({9}, f32).requires_grad_()};
  const std::vector<Tensor> b = {random({4, 3}, f32).requires_grad_(), random({2}, f32).requires_grad_()};
  std::vector<Tensor> all = a;
  for (const Tensor& t : b) all.push_back(t);
  const auto grads = make_grads(all);
  for (bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    const std::vector<Tensor> g_all = copies(all), sa = copies(a), sb = copies(b);
    const nn::AdamGroupOptions bo{.lr = 0.02, .beta1 = 0.5, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.2};
    std::unique_ptr<nn::Optimizer> grouped, opt_a, opt_b;
    if (decoupled) {
      auto g = std::make_unique<nn::AdamW>(std::vector<Tensor>{g_all[0]}, nn::AdamWOptions{.lr = 0.01});
      g->add_param_group({g_all[1], g_all[2]}, bo);
      grouped = std::move(g);
      opt_a = std::make_unique<nn::AdamW>(sa, nn::AdamWOptions{.lr = 0.01});
      opt_b = std::make_unique<nn::AdamW>(sb, nn::AdamWOptions{.lr = 0.02, .beta1 = 0.5, .beta2 = 0.9, .eps = 1e-6,
                                                               .weight_decay = 0.2});
    } else {
      auto g = std::make_unique<nn::Adam>(std::vector<Tensor>{g_all[0]}, nn::AdamOptions{.lr = 0.01});
      g->add_param_group({g_all[1], g_all[2]}, bo);
      grouped = std::move(g);
      opt_a = std::make_unique<nn::Adam>(sa, nn::AdamOptions{.lr = 0.01});
      opt_b = std::make_unique<nn::Adam>(sb, nn::AdamOptions{.lr = 0.02, .beta1 = 0.5, .beta2 = 0.9, .eps = 1e-6,
                                                             .weight_decay = 0.2});
    }
    run({grouped.get()}, g_all, 0, grads);
    run({opt_a.get()}, sa, 0, grads);
    run({opt_b.get()}, sb, 1, grads);
    expect_same({g_all[0]}, sa);
    expect_same({g_all[1], g_all[2]}, sb);
    EXPECT_FALSE(bitwise_equal(g_all[1], all[1]));  // it moved
  }
}

TEST(ParamGroups, UnsetOptionsComeFromTheDefaults) {
  Tensor p = random({3}).requires_grad_(), q = random({4}).requires_grad_(), r = random({2}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 0.1, .momentum = 0.8, .dampening = 0.2, .weight_decay = 0.01});
  sgd.add_param_group({q}, {.lr = 0.5});
  EXPECT_EQ(sgd.options(1).lr, 0.5);
  EXPECT_EQ(sgd.options(1).momentum, 0.8);
  EXPECT_EQ(sgd.options(1).dampening, 0.2);
  EXPECT_EQ(sgd.options(1).weight_decay, 0.01);
  nn::AdamW adamw({p}, {.lr = 0.1, .beta1 = 0.7, .weight_decay = 0.3});
  adamw.add_param_group({q, r}, {.eps = 1e-4});
  EXPECT_EQ(adamw.options(1).lr, 0.1);
  EXPECT_EQ(adamw.options(1).beta1, 0.7);
  EXPECT_EQ(adamw.options(1).eps, 1e-4);
  EXPECT_EQ(adamw.weight_decay(1), 0.3);
  EXPECT_EQ(adamw.num_param_groups(), 2u);
  EXPECT_EQ(adamw.param_group_begin(1), 1u);
  EXPECT_EQ(adamw.param_group_end(1), 3u);
  EXPECT_EQ(adamw.param_group_of(2), 1u);
  EXPECT_EQ(adamw.params().size(), 3u);
  // In the group constructor the defaults' lr may be left at 0 when every group sets one.
  nn::SGD g({{.params = {p}, .options = {.lr = 0.2}}, {.params = {q}, .options = {.lr = 0.3}}}, {.momentum = 0.9});
  EXPECT_EQ(g.lr(0), 0.2);
  EXPECT_EQ(g.lr(1), 0.3);
  EXPECT_EQ(g.options(1).momentum, 0.9);
  TG_EXPECT_ERROR(nn::SGD(std::vector<nn::SGDParamGroup>{{.params = {p}}}, {.momentum = 0.9}), "SGD", "invalid learning rate 0");
}

TEST(ParamGroups, LrSettersAndGetters) {
  Tensor p = random({3}).requires_grad_(), q = random({4}).requires_grad_();
  nn::Adam adam({p}, {.lr = 0.1});
  adam.add_param_group({q}, {.lr = 0.01, .weight_decay = 0.5});
  EXPECT_EQ(adam.lr(), 0.1);  // group 0's
  EXPECT_EQ(adam.lr(1), 0.01);
  EXPECT_EQ(adam.weight_decay(0), 0.0);
  EXPECT_EQ(adam.weight_decay(1), 0.5);
  adam.set_lr(1, 0.02);
  EXPECT_EQ(adam.lr(0), 0.1);
  EXPECT_EQ(adam.lr(1), 0.02);
  adam.set_lr(0.004);  // every group
  EXPECT_EQ(adam.lr(0), 0.004);
  EXPECT_EQ(adam.lr(1), 0.004);
  TG_EXPECT_ERROR(adam.set_lr(1, 0.0), "Adam param group 1", "invalid learning rate");
  TG_EXPECT_ERROR(adam.set_lr(-1.0), "Adam", "invalid learning rate");
  TG_EXPECT_ERROR(adam.set_lr(2, 0.1), "param group 2 out of range (2 groups)");
  TG_EXPECT_ERROR(adam.lr(5), "param group 5 out of range");
  TG_EXPECT_ERROR(adam.options(2), "param group 2 out of range");
  EXPECT_EQ(adam.lr(1), 0.004);
  // A schedule may set 0, never a negative or non-finite lr.
  adam.set_scheduled_lr(1, 0.0);
  EXPECT_EQ(adam.lr(1), 0.0);
  for (double bad : {-1e-3, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    TG_EXPECT_ERROR(adam.set_scheduled_lr(0, bad), "Adam", "scheduled learning rate");
  // An lr of 0 leaves that group's parameters unchanged (AdamW's decay too).
  nn::AdamW w({p}, {.lr = 0.1});
  w.add_param_group({q});
  w.set_scheduled_lr(1, 0.0);
  const std::vector<double> q0 = q.to_vector<double>(), p0 = p.to_vector<double>();
  p.set_grad(random({3}));
  q.set_grad(random({4}));
  w.step();
  EXPECT_EQ(q.to_vector<double>(), q0);
  EXPECT_NE(p.to_vector<double>(), p0);
}

TEST(ParamGroups, RefusedGroupsChangeNothing) {
  Tensor p = random({3}).requires_grad_(), q = random({4}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 0.1});
  TG_EXPECT_ERROR(sgd.add_param_group({q, p}), "parameter 2 is the same tensor as parameter 0", "param group 0");
  TG_EXPECT_ERROR(sgd.add_param_group({q, q}), "parameter 2 is the same tensor as parameter 1");
  TG_EXPECT_ERROR(sgd.add_param_group({q}, {.momentum = 1.5}), "SGD param group 1", "momentum");
  TG_EXPECT_ERROR(sgd.add_param_group({q}, {.lr = -2.0}), "SGD param group 1", "learning rate");
  TG_EXPECT_ERROR(sgd.add_param_group({q}, {.nesterov = true}), "SGD param group 1", "nesterov");
  TG_EXPECT_ERROR(sgd.add_param_group({Tensor()}), "parameter 1 is an undefined tensor");
  nn::Adam adam({p});
  TG_EXPECT_ERROR(adam.add_param_group({q}, {.beta2 = 1.0}), "Adam param group 1", "beta2");
  TG_EXPECT_ERROR(nn::AdamW(std::vector<nn::AdamParamGroup>{}), "AdamW", "no parameter groups");
  EXPECT_EQ(sgd.num_param_groups(), 1u);
  EXPECT_EQ(sgd.params().size(), 1u);
  EXPECT_EQ(adam.num_param_groups(), 1u);
  sgd.add_param_group({q}, {.lr = 0.2});
  EXPECT_EQ(sgd.num_param_groups(), 2u);
}

// State keys name the global parameter index (PyTorch's packed state_dict), and a group
// without momentum keeps no momentum buffer.
TEST(ParamGroups, StateIsKeyedByGlobalIndex) {
  Tensor p = random({3}).requires_grad_(), q = random({4}).requires_grad_();
  nn::SGD sgd({p}, {.lr = 0.1});
  sgd.add_param_group({q}, {.momentum = 0.9});
  p.set_grad(random({3}));
  q.set_grad(random({4}));
  sgd.step();
  auto st = sgd.state();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].first, "1.momentum_buffer");
  EXPECT_EQ(st[0].second.to_vector<double>(), q.grad().to_vector<double>());
  TG_EXPECT_ERROR(sgd.load_state({{"0.momentum_buffer", random({3})}}), "unknown state '0.momentum_buffer'");
  Tensor p2 = random({3}).requires_grad_(), q2 = random({4}).requires_grad_();
  nn::SGD other({p2}, {.lr = 0.1});
  other.add_param_group({q2}, {.momentum = 0.9});
  other.load_state(st);
  EXPECT_EQ(other.step_count(1), 1);
  EXPECT_EQ(other.step_count(0), 0);
}

// A checkpoint restores each group's lr, including a 0 that a schedule set.
TEST(ParamGroups, CheckpointRestoresEveryGroupsLr) {
  TempDir dir;
  const std::string path = dir.file("groups.safetensors");
  auto make = [](nn::Module& m) {
    const std::vector<Tensor> ps = m.parameters();
    auto opt = std::make_unique<nn::Adam>(std::vector<Tensor>(ps.begin(), ps.begin() + 2), nn::AdamOptions{.lr = 0.01});
    opt->add_param_group(std::vector<Tensor>(ps.begin() + 2, ps.end()), {.lr = 0.002, .weight_decay = 0.1});
    return opt;
  };
  auto model = small_cnn(1);
  auto opt = make(*model);
  Tensor x = randn({2, 3, 7, 9});
  Tensor y = from_vector(std::vector<int64_t>{1, 4}, {2});
  {
    Tape tape;
    tape.backward(cross_entropy((*model)(x), y));
  }
  opt->step();
  opt->set_lr(1, 0.003);
  save(*model, *opt, path);
  auto target = small_cnn(2);
  auto fresh = make(*target);
  load(*target, *fresh, path);
  EXPECT_EQ(fresh->lr(0), 0.01);
  EXPECT_EQ(fresh->lr(1), 0.003);
  EXPECT_EQ(fresh->step_count(3), 1);

  // Group 0 at 0 (a warmup's first step): saved without the single lr, loaded as 0.
  opt->set_scheduled_lr(0, 0.0);
  save(*model, *opt, path);
  const safetensors::Header h = safetensors::read_header(path);
  EXPECT_EQ(h.find_metadata("tapegrad.optimizer.lr"), nullptr);
  ASSERT_NE(h.find_metadata("tapegrad.optimizer.param_group_lrs"), nullptr);
  EXPECT_EQ(*h.find_metadata("tapegrad.optimizer.param_group_lrs"), "0,0.003");
  auto fresh2 = make(*target);
  load(*target, *fresh2, path);
  EXPECT_EQ(fresh2->lr(0), 0.0);
  EXPECT_EQ(fresh2->lr(1), 0.003);

  // Another number of groups is refused before anything changes.
  nn::Adam one_group(target->parameters(), {.lr = 0.5});
  TG_EXPECT_ERROR(load(*target, one_group, path), "lrs of 2 param groups but the optimizer has 1");
  EXPECT_EQ(one_group.lr(), 0.5);
  EXPECT_TRUE(one_group.state().empty());
}
