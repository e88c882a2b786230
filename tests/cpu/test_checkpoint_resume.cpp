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
#include "nn/optim/scheduler.h"

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

namespace {

// AdamW over two groups with different lrs (the conv's 0.02, the rest 0.01).
std::unique_ptr<nn::AdamW> two_group_adamw(nn::Module& model) {
  std::vector<Tensor> conv, rest;
  for (auto& [name, p] : model.named_parameters()) (name.rfind("0.", 0) == 0 ? conv : rest).push_back(p);
  std::vector<nn::AdamParamGroup> groups;
  groups.push_back({conv, {.lr = 0.02}});
  groups.push_back({rest, {}});
  return std::make_unique<nn::AdamW>(std::move(groups), nn::AdamWOptions{.lr = 0.01});
}

using MakeScheduler = std::function<std::unique_ptr<nn::LRScheduler>(nn::Optimizer&)>;

struct ScheduledRun {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<nn::AdamW> opt = {};
  std::unique_ptr<nn::LRScheduler> sched = {};
  std::vector<std::vector<double>> lrs = {};  // after each scheduler step
};

// Steps [from, to): a training step at the current lr, then a scheduler step.
void run_scheduled(ScheduledRun& r, int from, int to) {
  for (int s = from; s < to; ++s) {
    train_step(*r.model, *r.opt, make_batch(100 + s), false);
    r.sched->step();
    r.lrs.push_back(r.sched->last_lr());
  }
}

// An uninterrupted run of `total` steps against one saved at step `cut`, loaded into a
// fresh model and optimizer, given a new scheduler as scheduler.h documents (same options,
// built after the load, set_last_step(cut)) and continued: bit-identical.
void expect_exact_scheduled_resume(const MakeScheduler& make, int cut, int total) {
  SCOPED_TRACE("cut " + std::to_string(cut));
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  ScheduledRun ref{small_cnn(1)};
  ref.opt = two_group_adamw(*ref.model);
  ref.sched = make(*ref.opt);
  run_scheduled(ref, 0, total);

  ScheduledRun part{small_cnn(1)};
  part.opt = two_group_adamw(*part.model);
  part.sched = make(*part.opt);
  run_scheduled(part, 0, cut);
  save(*part.model, *part.opt, path);

  ScheduledRun res{small_cnn(2)};
  res.opt = two_group_adamw(*res.model);
  load(*res.model, *res.opt, path);
  res.sched = make(*res.opt);
  res.sched->set_last_step(part.sched->last_step());
  EXPECT_EQ(res.sched->base_lrs(), ref.sched->base_lrs());
  EXPECT_EQ(res.sched->base_lrs(), (std::vector<double>{0.02, 0.01}));
  EXPECT_EQ(res.sched->last_lr(), part.sched->last_lr());
  run_scheduled(res, cut, total);
  EXPECT_EQ(res.lrs, std::vector<std::vector<double>>(ref.lrs.begin() + cut, ref.lrs.end()));
  expect_same_parameters(*ref.model, *res.model);
}

const MakeScheduler warmup_cosine = [](nn::Optimizer& o) {
  return std::make_unique<nn::WarmupCosineLR>(o, nn::WarmupCosineLROptions{.warmup_steps = 4, .cosine_steps = 10});
};

}  // namespace

// At step 0 the warmup from 0 has set every lr to 0: the base must come from the file.
TEST(CheckpointResume, WarmupCosineResumesExactly) {
  for (int cut : {0, 3, 6}) expect_exact_scheduled_resume(warmup_cosine, cut, 8);
}

TEST(CheckpointResume, StepLRAndOneCycleResumeExactly) {
  const MakeScheduler step_lr = [](nn::Optimizer& o) {
    return std::make_unique<nn::StepLR>(o, nn::StepLROptions{.step_size = 2, .gamma = 0.5});
  };
  const MakeScheduler one_cycle = [](nn::Optimizer& o) {
    return std::make_unique<nn::OneCycleLR>(o, nn::OneCycleLROptions{.total_steps = 10});
  };
  for (int cut : {0, 3}) {
    expect_exact_scheduled_resume(step_lr, cut, 7);
    expect_exact_scheduled_resume(one_cycle, cut, 7);
  }
}

// A file written before checkpoints held initial lrs: it loads, restores none, and a
// scheduler built after it takes the loaded lr as its base (the old behaviour), unless the
// initial lr is given by hand.
TEST(CheckpointResume, FilesWithoutInitialLrsLoad) {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  ScheduledRun part{small_cnn(1)};
  part.opt = two_group_adamw(*part.model);
  part.sched = warmup_cosine(*part.opt);
  run_scheduled(part, 0, 3);
  save(*part.model, *part.opt, path);
  EXPECT_EQ(*st::read_header(path).find_metadata("tapegrad.optimizer.param_group_initial_lrs"), "0.02,0.01");
  drop_metadata(path, "tapegrad.optimizer.param_group_initial_lrs");

  auto model = small_cnn(2);
  auto opt = two_group_adamw(*model);
  load(*model, *opt, path);
  EXPECT_FALSE(opt->initial_lr(0).has_value());
  EXPECT_EQ(opt->lr(0), 0.02 * 3 / 4);
  {
    nn::WarmupCosineLR s(*opt, {.warmup_steps = 4, .cosine_steps = 10});
    EXPECT_EQ(s.base_lrs(), (std::vector<double>{0.02 * 3 / 4, 0.01 * 3 / 4}));
  }
  auto fixed_model = small_cnn(2);
  auto fixed = two_group_adamw(*fixed_model);
  load(*fixed_model, *fixed, path);
  fixed->set_initial_lr(0, 0.02);
  fixed->set_initial_lr(1, 0.01);
  nn::WarmupCosineLR s(*fixed, {.warmup_steps = 4, .cosine_steps = 10});
  s.set_last_step(3);
  EXPECT_EQ(s.last_lr(), part.sched->last_lr());

  // A malformed key is refused before anything changes.
  st::Metadata meta;
  st::NamedTensors tensors = st::load_file(path, &meta);
  meta.emplace_back("tapegrad.optimizer.param_group_initial_lrs", "0.02,-1");
  st::save_file(tensors, path, meta);
  auto target = small_cnn(3);
  auto target_opt = two_group_adamw(*target);
  TG_EXPECT_ERROR(load(*target, *target_opt, path), "param_group_initial_lrs", "0.02,-1");
  EXPECT_TRUE(target_opt->state().empty());
  EXPECT_EQ(target_opt->lr(0), 0.02);
}
