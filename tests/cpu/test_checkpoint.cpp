// Checkpoints of modules and optimizers (tg::save / tg::load): PyTorch state-dict names, strict
// and all-or-nothing loading, f64 models, optimizer state named after parameters, and
// bit-identical resumption of training.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/checkpoint_util.h"
#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

// ---- module checkpoints -----------------------------------------------------------------

TEST(Checkpoint, UsesPyTorchStateDictNames) {
  TempDir dir;
  auto m = small_cnn(1);
  save(*m, dir.file("m.safetensors"));
  st::Header h = st::read_header(dir.file("m.safetensors"));
  std::vector<std::string> names;
  for (const auto& t : h.tensors) names.push_back(t.name);
  EXPECT_EQ(names, std::vector<std::string>({"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"}));
  EXPECT_EQ(h.find("0.weight")->shape, std::vector<int64_t>({6, 3, 3, 3}));
  EXPECT_EQ(h.find("0.weight")->dtype, "F32");
  ASSERT_NE(h.find_metadata("format"), nullptr);
  EXPECT_EQ(*h.find_metadata("format"), "pt");
}

TEST(Checkpoint, LoadRestoresParametersInPlace) {
  TempDir dir;
  auto a = small_cnn(1), b = small_cnn(2);
  save(*a, dir.file("m.safetensors"));
  std::vector<Tensor> handles = b->parameters();
  load(*b, dir.file("m.safetensors"));
  expect_same_parameters(*a, *b);
  auto after = b->parameters();
  for (size_t i = 0; i < handles.size(); ++i) {
    EXPECT_TRUE(handles[i].same(after[i])) << "load must write into the existing tensors";
    EXPECT_TRUE(after[i].requires_grad() && after[i].is_leaf());
  }
  Batch batch = make_batch(5);
  EXPECT_TRUE(bitwise_equal((*a)(batch.x), (*b)(batch.x)));
}

TEST(Checkpoint, DoubleModelsSaveF64) {
  TempDir dir;
  auto a = small_cnn(1), b = small_cnn(2);
  a->to(f64);
  b->to(f64);
  save(*a, dir.file("m.safetensors"));
  EXPECT_EQ(st::read_header(dir.file("m.safetensors")).find("4.bias")->dtype, "F64");
  load(*b, dir.file("m.safetensors"));
  expect_same_parameters(*a, *b);
  auto c = small_cnn(3);  // f32: the dtype is checked, never converted silently
  Snapshot s = snapshot(*c);
  TG_EXPECT_ERROR(load(*c, dir.file("m.safetensors")), "tensor '0.weight' is F64", "f32[6, 3, 3, 3]");
  expect_unchanged(*c, s);
}

// Each bad file is valid except for its last tensor: a loader that copied as it went would
// have changed the first parameters before failing.
TEST(Checkpoint, BadFilesFailAndLeaveTheModuleUnchanged) {
  TempDir dir;
  auto ref = small_cnn(1);
  auto target = small_cnn(2);
  const Snapshot s = snapshot(*target);
  const std::string p = dir.file("bad.safetensors");
  st::NamedTensors good = ref->named_parameters();

  st::NamedTensors missing(good.begin(), good.end() - 1);
  st::save_file(missing, p);
  TG_EXPECT_ERROR(load(*target, p), "has no tensor '4.bias'", "f32[5]");
  expect_unchanged(*target, s);

  st::NamedTensors extra = good;
  extra.emplace_back("5.weight", ones({2}));
  st::save_file(extra, p);
  TG_EXPECT_ERROR(load(*target, p), "holds tensor '5.weight' F32[2]", "no parameter");
  expect_unchanged(*target, s);

  st::NamedTensors misshaped = good;
  misshaped.back().second = ones({6});
  st::save_file(misshaped, p);
  TG_EXPECT_ERROR(load(*target, p), "tensor '4.bias' has shape [6]", "f32[5]");
  expect_unchanged(*target, s);

  st::NamedTensors wrong_dtype = good;
  wrong_dtype.back().second = ones({5}, {.dtype = f64});
  st::save_file(wrong_dtype, p);
  TG_EXPECT_ERROR(load(*target, p), "tensor '4.bias' is F64", "f32[5]");
  expect_unchanged(*target, s);

  save(*ref, p);
  std::string bytes = read_bytes(p);
  write_bytes(p, bytes.substr(0, bytes.size() - 3));
  TG_EXPECT_ERROR(load(*target, p), "tensor '4.bias'", "truncated");
  expect_unchanged(*target, s);

  bytes[20] = '\x01';  // a control character inside the JSON header
  write_bytes(p, bytes);
  TG_EXPECT_ERROR(load(*target, p), "corrupt header", "at byte 20");
  expect_unchanged(*target, s);
}

// ---- optimizer state and resumption -----------------------------------------------------

// Train 3 steps, save, train 3 more (losses L). A fresh model and optimizer loaded from the
// checkpoint must produce exactly L: every bit of parameters and state was restored.
template <class MakeOptimizer>
void expect_bit_identical_resume(MakeOptimizer make_optimizer) {
  TempDir dir;
  const std::string p = dir.file("ckpt.safetensors");
  Batch batch = make_batch(11);
  auto model = small_cnn(1);
  auto opt = make_optimizer(model->parameters());
  train(*model, *opt, batch, 3);
  save(*model, *opt, p);
  std::vector<double> expected = train(*model, *opt, batch, 3);

  auto fresh = small_cnn(99);  // different weights: the checkpoint must overwrite all of them
  auto fresh_opt = make_optimizer(fresh->parameters());
  fresh_opt->set_lr(123.0);    // restored from the checkpoint too
  load(*fresh, *fresh_opt, p);
  EXPECT_EQ(fresh_opt->step_count(), 3);
  EXPECT_EQ(fresh_opt->lr(), opt->lr());
  std::vector<double> resumed = train(*fresh, *fresh_opt, batch, 3);
  ASSERT_EQ(resumed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(resumed[i], expected[i]) << "step " << i + 3;
  expect_same_parameters(*model, *fresh);
  EXPECT_EQ(fresh_opt->step_count(), 6);
}

TEST(Checkpoint, AdamResumesBitIdentically) {
  expect_bit_identical_resume([](std::vector<Tensor> p) {
    return std::make_unique<nn::Adam>(std::move(p), nn::AdamOptions{.lr = 0.01, .weight_decay = 1e-3});
  });
}

TEST(Checkpoint, AdamWResumesBitIdentically) {
  expect_bit_identical_resume([](std::vector<Tensor> p) {
    return std::make_unique<nn::AdamW>(std::move(p), nn::AdamWOptions{.lr = 0.01});
  });
}

TEST(Checkpoint, SgdMomentumResumesBitIdentically) {
  expect_bit_identical_resume([](std::vector<Tensor> p) {
    return std::make_unique<nn::SGD>(std::move(p), nn::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
  });
}

TEST(Checkpoint, OptimizerStateIsNamedAfterParameters) {
  TempDir dir;
  auto model = small_cnn(1);
  nn::Adam opt(model->parameters(), {.lr = 0.01});
  train(*model, opt, make_batch(1), 2);
  save(*model, opt, dir.file("c.safetensors"));
  st::Header h = st::read_header(dir.file("c.safetensors"));
  ASSERT_NE(h.find("optim.0.weight.exp_avg"), nullptr);
  ASSERT_NE(h.find("optim.4.bias.exp_avg_sq"), nullptr);
  const st::TensorInfo* step = h.find("optim.1.weight.step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->dtype, "F64");
  EXPECT_EQ(*h.find_metadata("tapegrad.optimizer"), "Adam");
  EXPECT_EQ(*h.find_metadata("tapegrad.optimizer.step_count"), "2");
  EXPECT_EQ(*h.find_metadata("tapegrad.optimizer.lr"), "0.01");
  // A module-only load of a training checkpoint ignores the optimizer state.
  auto other = small_cnn(2);
  load(*other, dir.file("c.safetensors"));
  expect_same_parameters(*model, *other);
}

TEST(Checkpoint, OptimizerMismatchesFailAndChangeNothing) {
  TempDir dir;
  auto model = small_cnn(1);
  nn::Adam adam(model->parameters(), {.lr = 0.01});
  train(*model, adam, make_batch(1), 2);
  const std::string p = dir.file("c.safetensors");
  save(*model, adam, p);

  auto target = small_cnn(2);
  const Snapshot s = snapshot(*target);
  nn::SGD sgd(target->parameters(), {.lr = 0.1, .momentum = 0.9});
  TG_EXPECT_ERROR(load(*target, sgd, p), "holds Adam state but the optimizer is SGD");
  expect_unchanged(*target, s);
  nn::AdamW adamw(target->parameters());
  TG_EXPECT_ERROR(load(*target, adamw, p), "holds Adam state but the optimizer is AdamW");

  // An optimizer over parameters of another module cannot be named.
  auto stranger = small_cnn(3);
  nn::Adam foreign(stranger->parameters());
  TG_EXPECT_ERROR(load(*target, foreign, p), "optimizer parameter 0", "is not a parameter of the module");
  TG_EXPECT_ERROR(save(*target, foreign, p), "optimizer parameter 0", "is not a parameter of the module");

  // A weights-only file has no optimizer state to restore.
  save(*model, dir.file("w.safetensors"));
  nn::Adam fresh(target->parameters());
  TG_EXPECT_ERROR(load(*target, fresh, dir.file("w.safetensors")), "holds no optimizer state");

  // A mis-shaped state tensor is caught before anything is written.
  st::NamedTensors all = st::load_file(p);
  st::Metadata meta;
  st::load_file(p, &meta);
  for (auto& [name, t] : all)
    if (name == "optim.4.bias.exp_avg") t = zeros({4});
  st::save_file(all, p, meta);
  TG_EXPECT_ERROR(load(*target, fresh, p), "optim.4.bias.exp_avg", "f32[5]");
  expect_unchanged(*target, s);
  EXPECT_TRUE(fresh.state().empty());
  // State for a parameter the optimizer does not have.
  for (auto& [name, t] : all)
    if (name == "optim.4.bias.exp_avg") t = zeros({5});
  all.emplace_back("optim.9.weight.exp_avg", zeros({5}));
  st::save_file(all, p, meta);
  TG_EXPECT_ERROR(load(*target, fresh, p), "'optim.9.weight.exp_avg'", "not a parameter of this optimizer");
  expect_unchanged(*target, s);
}

TEST(Checkpoint, StaleOptimizerStateIsRefused) {
  TempDir dir;
  auto model = small_cnn(1);
  nn::Adam opt(model->parameters(), {.lr = 0.01});
  save(*model, opt, dir.file("c.safetensors"));  // before any step: no state at all
  train(*model, opt, make_batch(1), 1);
  const Snapshot s = snapshot(*model);
  TG_EXPECT_ERROR(load(*model, opt, dir.file("c.safetensors")), "already holds state", "freshly built");
  expect_unchanged(*model, s);
}

// A checkpoint whose optimizer values are corrupt (each would turn the weights into NaN at
// the next step, or is undefined to convert) is refused before anything changes: module,
// optimizer state, step count and lr.
TEST(Checkpoint, CorruptOptimizerValuesAreRefusedBeforeAnyChange) {
  TempDir dir;
  const std::string good = dir.file("good.safetensors"), p = dir.file("bad.safetensors");
  auto model = small_cnn(1);
  nn::Adam adam(model->parameters(), {.lr = 0.01});
  train(*model, adam, make_batch(1), 2);
  save(*model, adam, good);
  st::Metadata meta;
  const st::NamedTensors all = st::load_file(good, &meta);
  const double nan = std::nan(""), inf = INFINITY;

  // Rewrites the good checkpoint with tensor `name` replaced, or metadata `key` set.
  auto with_tensor = [&](const std::string& name, Tensor value) {
    st::NamedTensors t = all;
    for (auto& [n, v] : t)
      if (n == name) v = value;
    st::save_file(t, p, meta);
  };
  auto with_meta = [&](const std::string& key, const std::string& value) {
    st::Metadata m = meta;
    for (auto& [k, v] : m)
      if (k == key) v = value;
    st::save_file(all, p, m);
  };
  auto expect_refused = [&](std::initializer_list<const char*> fragments, const std::string& what) {
    SCOPED_TRACE(what);
    auto target = small_cnn(2);
    const Snapshot s = snapshot(*target);
    nn::Adam fresh(target->parameters(), {.lr = 0.5});
    try {
      load(*target, fresh, p);
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
    expect_unchanged(*target, s);
    EXPECT_TRUE(fresh.state().empty());
    EXPECT_EQ(fresh.step_count(), 0);
    EXPECT_EQ(fresh.lr(), 0.5);
  };

  const std::string step = "optim.0.weight.step";
  for (double v : {nan, inf, -1.0, 2.5, 9007199254740994.0 /* 2^53 + 2 */}) {
    with_tensor(step, full({}, v, {.dtype = f64}));
    expect_refused({step.c_str(), "step count", "[0, 2^53]"}, "step " + std::to_string(v));
  }
  with_tensor(step, full({}, -3.0, {.dtype = f32}));
  expect_refused({step.c_str(), "step count"}, "f32 step");
  with_tensor(step, from_vector(std::vector<int64_t>{(int64_t{1} << 53) + 1}, {}));
  expect_refused({step.c_str(), "9007199254740993"}, "i64 step past 2^53");

  Tensor sq;
  for (const auto& [n, v] : all)
    if (n == "optim.0.weight.exp_avg_sq") sq = v.clone();
  Tensor neg = sq.clone();
  neg.data<float>()[5] = -1e-3f;
  with_tensor("optim.0.weight.exp_avg_sq", neg);
  expect_refused({"exp_avg_sq", "-0.001", "element 5", ">= 0"}, "negative exp_avg_sq");
  Tensor inf_sq = sq.clone();
  inf_sq.data<float>()[0] = inf;
  with_tensor("optim.0.weight.exp_avg_sq", inf_sq);
  expect_refused({"exp_avg_sq", "inf", "element 0"}, "infinite exp_avg_sq");
  Tensor nan_avg = sq.clone();
  nan_avg.data<float>()[7] = nan;
  with_tensor("optim.0.weight.exp_avg", nan_avg);
  expect_refused({"exp_avg", "nan", "must be finite"}, "NaN exp_avg");

  // The lr follows the optimizer's own rule (that of its constructor and set_lr).
  for (const char* lr : {"0", "-0.1", "inf", "nan", "-inf"}) {
    with_meta("tapegrad.optimizer.lr", lr);
    expect_refused({"tapegrad.optimizer.lr", "Adam", "invalid learning rate"}, std::string("lr ") + lr);
  }
  for (const char* lr : {"1e400", "0.1x", ""}) {
    with_meta("tapegrad.optimizer.lr", lr);
    expect_refused({"tapegrad.optimizer.lr", "not a number"}, std::string("lr ") + lr);
  }
  for (const char* steps : {"-1", "9007199254740993", "1.5", "1e3"}) {
    with_meta("tapegrad.optimizer.step_count", steps);
    expect_refused({"tapegrad.optimizer.step_count"}, std::string("step_count ") + steps);
  }

  // A partial state (a buffer without the step count) would restart bias correction.
  st::NamedTensors partial;
  for (const auto& [n, v] : all)
    if (n != step) partial.emplace_back(n, v);
  st::save_file(partial, p, meta);
  expect_refused({"lacks '0.step'"}, "missing step");

  // The good file still loads, and the edges of the ranges are accepted (the metadata's
  // per-parameter step counts must agree with the step tensor).
  with_tensor(step, from_vector(std::vector<int64_t>{int64_t{1} << 53}, {}));
  st::Metadata edge = meta;
  for (auto& [k, v] : edge)
    if (k == "tapegrad.optimizer.param_step_counts") v = "9007199254740992" + v.substr(v.find(','));
  st::save_file(st::load_file(p), p, edge);
  auto target = small_cnn(2);
  nn::Adam fresh(target->parameters());
  load(*target, fresh, p);
  EXPECT_EQ(fresh.step_count(0), int64_t{1} << 53);
  EXPECT_EQ(fresh.lr(), 0.01);
}

// SGD's momentum buffer: finite values only.
TEST(Checkpoint, NonFiniteMomentumIsRefused) {
  TempDir dir;
  const std::string p = dir.file("sgd.safetensors");
  auto model = small_cnn(1);
  nn::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  train(*model, sgd, make_batch(1), 1);
  save(*model, sgd, p);
  st::Metadata meta;
  st::NamedTensors all = st::load_file(p, &meta);
  for (auto& [n, v] : all)
    if (n == "optim.4.bias.momentum_buffer") v = full(v.shape(), -INFINITY);
  st::save_file(all, p, meta);
  auto target = small_cnn(2);
  const Snapshot s = snapshot(*target);
  nn::SGD fresh(target->parameters(), {.lr = 0.1, .momentum = 0.9});
  TG_EXPECT_ERROR(load(*target, fresh, p), "optim.4.bias.momentum_buffer", "-inf", "must be finite");
  expect_unchanged(*target, s);
  EXPECT_TRUE(fresh.state().empty());
}
