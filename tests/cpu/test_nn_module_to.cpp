// Module::to keeping parameter identity (optimizers and tied weights follow), buffers (saved and
// moved, never trained), and module traversal (modules(), apply()).
#include <unistd.h>

#include <filesystem>
#include <map>

#include "common/nn_modules.h"
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

// ---- Module::to keeps identity, buffers, module traversal (issue 24) -------------------

namespace {

// One parameter (w), a member buffer (running: floating) and an owned one (count: i64).
class WithBuffers : public nn::Module {
 public:
  WithBuffers() {
    w = from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, {3});
    running = from_vector(std::vector<float>{1.0f, 2.0f, 3.0f}, {3});
    register_parameter("w", &w);
    register_buffer("running", &running);
    count = register_buffer("count", from_vector(std::vector<int64_t>{7}, {1}));
    register_module("lin", lin);
  }
  Tensor forward(const Tensor& x) override { return lin->forward(x * w); }
  void buffer(const std::string& name, Tensor value) { register_buffer(name, std::move(value)); }

  Tensor w, running, count;
  std::shared_ptr<nn::Linear> lin = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 3, .out_features = 2});
};

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()))).string();
}

}  // namespace

TEST(ModuleTo, KeepsParameterHandlesAndOptimizerTrains) {
  // An optimizer built before to() must keep training the module's parameters: the move
  // happens inside the same tensors (before, to() swapped in new tensors and the optimizer
  // went on updating the orphaned old ones, silently).
  manual_seed(3);
  auto model = small_cnn();
  const auto before = model->parameters();
  nn::SGD opt(before, {.lr = 0.1});
  model->to(f64);
  const auto after = model->parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(after[i].same(before[i])) << i;
    EXPECT_EQ(before[i].dtype(), f64);
    EXPECT_TRUE(after[i].is_leaf() && after[i].requires_grad());
  }
  model->to(Device::cpu());  // already there: still the same handles
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(model->parameters()[i].same(before[i]));

  const Tensor x = random({4, 3, 5, 5});
  auto loss_of = [&] {
    Tape tape;
    const Tensor y = model->forward(x);
    Tensor loss = mean(y * y);
    tape.backward(loss);
    return loss.item();
  };
  const std::vector<double> w0 = model->parameters()[0].to_vector<double>();
  const double first = loss_of();
  for (int t = 0; t < 5; ++t) {
    opt.step();
    opt.zero_grad();
    loss_of();
  }
  EXPECT_NE(model->parameters()[0].to_vector<double>(), w0);
  EXPECT_LT(loss_of(), first);
}

TEST(ModuleTo, TiedWeightStaysTied) {
  // The same tensor registered in two modules is moved once and stays one tensor.
  auto a = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 4});
  auto b = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 4});
  b->weight = a->weight;
  nn::Sequential seq{a, b};
  seq.to(f64);
  EXPECT_TRUE(a->weight.same(b->weight));
  EXPECT_EQ(b->weight.dtype(), f64);
}

TEST(ModuleTo, OptimizerStateFollowsItsParameter) {
  // SGD's momentum buffer was made in f32; after to(f64) the next step() converts it (values
  // kept) instead of mixing dtypes: p2 = p1 - lr (m buf1 + g2) with buf1 = g1.
  WithBuffers m;
  nn::SGD opt({m.w}, {.lr = 0.1, .momentum = 0.5});
  const std::vector<double> p0 = m.w.to_vector<double>(), g1 = {1, 2, 3}, g2 = {-1, 0.5, 0.25};
  m.w.set_grad(from_vector(std::vector<float>{1, 2, 3}, {3}));
  opt.step();
  ASSERT_EQ(opt.state().at(0).second.dtype(), f32);
  m.to(f64);
  ASSERT_TRUE(opt.params()[0].same(m.w));
  m.w.set_grad(from_vector(g2, {3}));
  opt.step();
  const Tensor buf = opt.state().at(0).second;
  EXPECT_EQ(buf.dtype(), f64);
  const std::vector<double> p2 = m.w.to_vector<double>(), b2 = buf.to_vector<double>();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(b2[i], 0.5 * g1[i] + g2[i], 1e-12);
    EXPECT_NEAR(p2[i], p0[i] - 0.1 * g1[i] - 0.1 * (0.5 * g1[i] + g2[i]), 1e-6);
  }
}

TEST(ModuleTo, MoveBetweenForwardAndBackwardIsCaught) {
  // The tape saved the weight before the move; the move bumps its version past the saved one.
  nn::Linear lin({.in_features = 3, .out_features = 2});
  Tape tape;
  Tensor y = sum(lin.forward(random({2, 3}, f32)));
  lin.to(f64);
  TG_EXPECT_ERROR(tape.backward(y), "modified in place");
}

TEST(ModuleTo, SetDataChecks) {
  Tensor p = random({3}).requires_grad_();
  TG_EXPECT_ERROR(p.set_data_(random({4})), "set_data_", "shape");
  TG_EXPECT_ERROR(p.set_data_(arange(3, {.dtype = i64})), "set_data_", "floating");
  Tensor view = p.detach();
  p.set_data_(full({3}, 2.0));
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{2, 2, 2}));
  EXPECT_NE(view.to_vector<double>(), (std::vector<double>{2, 2, 2}));  // a detached view keeps the old data
}

TEST(Buffers, SavedMovedButNotTrained) {
  WithBuffers m;
  EXPECT_EQ(names_of(m), (std::vector<std::string>{"w", "lin.weight", "lin.bias"}));
  std::vector<std::string> buffers, state;
  for (const auto& [name, t] : m.named_buffers()) buffers.push_back(name);
  for (const auto& [name, t] : m.state_dict()) state.push_back(name);
  EXPECT_EQ(buffers, (std::vector<std::string>{"running", "count"}));
  EXPECT_EQ(state, (std::vector<std::string>{"w", "running", "count", "lin.weight", "lin.bias"}));
  EXPECT_FALSE(m.running.requires_grad());
  EXPECT_TRUE(m.buffers()[1].same(m.count));
  TG_EXPECT_ERROR(m.buffer("w", zeros({1})), "'w'", "already registered");
  TG_EXPECT_ERROR(m.buffer("z", Tensor()), "register_buffer", "undefined");

  // to(f64) casts the floating buffer in place and leaves the integer one alone.
  const Tensor running = m.running;
  m.to(f64);
  EXPECT_TRUE(m.running.same(running));
  EXPECT_EQ(m.running.dtype(), f64);
  EXPECT_EQ(m.count.dtype(), i64);

  // Checkpoints hold the buffers and restore them.
  const std::string path = temp_path("tg_buffers.safetensors");
  save(m, path);
  WithBuffers other;
  other.to(f64);
  other.running.fill_(0);
  other.count.fill_(0);
  load(other, path);
  std::filesystem::remove(path);
  EXPECT_EQ(other.running.to_vector<double>(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(other.count.to_vector<int64_t>(), (std::vector<int64_t>{7}));
}

TEST(Modules, NamesOrderAndApply) {
  Net net;
  std::vector<std::string> names;
  for (const auto& [name, m] : net.named_modules()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"", "features", "features.0", "features.1", "features.2", "head"}));
  auto mods = net.modules();
  ASSERT_EQ(mods.size(), 6u);
  EXPECT_EQ(mods[0], &net);
  EXPECT_EQ(mods[5], net.head.get());
  // A submodule registered twice is listed once, under its first name.
  Registrar r;
  auto relu = std::make_shared<nn::ReLU>();
  r.module("a", relu);
  r.module("b", relu);
  EXPECT_EQ(r.named_modules().size(), 2u);
  // apply: each child's subtree first, then the module itself (PyTorch's order).
  std::map<const nn::Module*, std::string> name_of;
  for (const auto& [name, m] : net.named_modules()) name_of[m] = name;
  std::vector<std::string> order;
  nn::Module& self = net.apply([&](nn::Module& m) { order.push_back(name_of.at(&m)); });
  EXPECT_EQ(&self, &net);
  EXPECT_EQ(order,
            (std::vector<std::string>{"features.0", "features.1", "features.2", "features", "head", ""}));
}
