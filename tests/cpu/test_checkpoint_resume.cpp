// Resuming training from a checkpoint restores everything a continued run depends on:
// every parameter's step count (SGD's state, as PyTorch's, has no step entries: the file's
// metadata carries them), and, for learning-rate schedules, each param group's initial lr.
// An uninterrupted run and a run saved at step k, loaded into fresh objects and continued
// must agree bit for bit. Files written before those keys existed still load.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint_util.h"
#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

namespace {

// One training step; with `skip_head`, the last layer ("4.*") gets no grad (as a frozen or
// unused branch), so the parameters' step counts differ.
void train_step(nn::Module& model, nn::Optimizer& opt, const Batch& b, bool skip_head) {
  {
    Tape tape;
    tape.backward(cross_entropy(model(b.x), b.y));
  }
  if (skip_head)
    for (auto& [name, p] : model.named_parameters())
      if (name.rfind("4.", 0) == 0) p.zero_grad();
  opt.step();
  opt.zero_grad();
}

// Steps [from, to) of a run: step s uses batch s and skips the head on steps 0 and 1.
void run_steps(nn::Module& model, nn::Optimizer& opt, int from, int to) {
  for (int s = from; s < to; ++s) train_step(model, opt, make_batch(100 + s), s < 2);
}

// SGD with a group without momentum (the conv: no state at all) and one with momentum.
std::unique_ptr<nn::SGD> mixed_sgd(nn::Module& model) {
  std::vector<Tensor> conv, rest;
  for (auto& [name, p] : model.named_parameters()) (name.rfind("0.", 0) == 0 ? conv : rest).push_back(p);
  std::vector<nn::SGDParamGroup> groups;
  groups.push_back({conv, {.momentum = 0.0}});
  groups.push_back({rest, {.momentum = 0.9}});
  return std::make_unique<nn::SGD>(std::move(groups), nn::SGDOptions{.lr = 0.05});
}

std::vector<int64_t> step_counts(const nn::Optimizer& opt) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < opt.params().size(); ++i) out.push_back(opt.step_count(i));
  return out;
}

// Rewrites a checkpoint without the metadata `key`, as a file written before it existed.
void drop_metadata(const std::string& path, const std::string& key) {
  st::Metadata meta;
  st::NamedTensors tensors = st::load_file(path, &meta);
  std::erase_if(meta, [&](const auto& kv) { return kv.first == key; });
  st::save_file(tensors, path, meta);
}

}  // namespace

TEST(CheckpointResume, SgdRestoresEveryParametersStepCount) {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  auto ref = small_cnn(1);
  auto ref_opt = mixed_sgd(*ref);
  run_steps(*ref, *ref_opt, 0, 6);
  EXPECT_EQ(step_counts(*ref_opt), (std::vector<int64_t>{6, 6, 6, 6, 4, 4}));

  auto part = small_cnn(1);
  auto part_opt = mixed_sgd(*part);
  run_steps(*part, *part_opt, 0, 3);
  save(*part, *part_opt, path);
  auto res = small_cnn(2);
  auto res_opt = mixed_sgd(*res);
  load(*res, *res_opt, path);
  EXPECT_EQ(step_counts(*res_opt), step_counts(*part_opt));
  run_steps(*res, *res_opt, 3, 6);
  EXPECT_EQ(step_counts(*res_opt), step_counts(*ref_opt));
  EXPECT_EQ(res_opt->step_count(), ref_opt->step_count());
  expect_same_parameters(*ref, *res);
}

TEST(CheckpointResume, StepCountsMustAgreeWithTheState) {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  auto model = small_cnn(1);
  auto opt = mixed_sgd(*model);
  run_steps(*model, *opt, 0, 3);
  save(*model, *opt, path);
  EXPECT_EQ(*st::read_header(path).find_metadata("tapegrad.optimizer.param_step_counts"), "3,3,3,3,1,1");

  // A file written before the key: the old fallback (1 where a momentum buffer is, else as
  // it was: 0 in a fresh optimizer).
  drop_metadata(path, "tapegrad.optimizer.param_step_counts");
  auto old = small_cnn(2);
  auto old_opt = mixed_sgd(*old);
  load(*old, *old_opt, path);
  EXPECT_EQ(step_counts(*old_opt), (std::vector<int64_t>{0, 0, 1, 1, 1, 1}));
  expect_same_parameters(*model, *old);

  // Counts that contradict the file's state, or of the wrong number, change nothing.
  for (const auto& [counts, fragments] : std::vector<std::pair<std::string, std::vector<const char*>>>{
           {"3,3,3,3,1", {"5 step counts", "6 parameters"}},
           {"3,3,0,3,1,1", {"parameter 2", "step count of 0"}},
           {"3,3,3,3,1,-1", {"parameter 5", "-1"}},
           {"3,3,3,3,1,x", {"param_step_counts", "not a list of integers"}}}) {
    st::Metadata meta;
    st::NamedTensors tensors = st::load_file(path, &meta);
    meta.emplace_back("tapegrad.optimizer.param_step_counts", counts);
    st::save_file(tensors, dir.file("bad.safetensors"), meta);
    auto target = small_cnn(3);
    auto target_opt = mixed_sgd(*target);
    const Snapshot before = snapshot(*target);
    try {
      load(*target, *target_opt, dir.file("bad.safetensors"));
      ADD_FAILURE() << "expected tg::Error for counts " << counts;
    } catch (const Error& e) {
      for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
    expect_unchanged(*target, before);
    EXPECT_EQ(step_counts(*target_opt), std::vector<int64_t>(6, 0));
    EXPECT_TRUE(target_opt->state().empty());
  }
}

// Adam's counts are in its state ("i.step") too: the two must agree.
TEST(CheckpointResume, AdamStepCountsMatchItsStepState) {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  auto model = small_cnn(1);
  nn::Adam opt(model->parameters(), {.lr = 0.01});
  run_steps(*model, opt, 0, 3);
  save(*model, opt, path);
  auto res = small_cnn(2);
  nn::Adam res_opt(res->parameters(), {.lr = 0.01});
  load(*res, res_opt, path);
  EXPECT_EQ(step_counts(res_opt), (std::vector<int64_t>{3, 3, 3, 3, 1, 1}));

  st::Metadata meta;
  st::NamedTensors tensors = st::load_file(path, &meta);
  for (auto& [key, value] : meta)
    if (key == "tapegrad.optimizer.param_step_counts") value = "3,3,3,3,2,1";
  st::save_file(tensors, path, meta);
  nn::Adam fresh(res->parameters(), {.lr = 0.01});
  TG_EXPECT_ERROR(load(*res, fresh, path), "'4.step' is 1", "step count of parameter 4 is 2");
  EXPECT_TRUE(fresh.state().empty());
}
