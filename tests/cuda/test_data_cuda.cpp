// The DataLoader with a GPU target: batches staged in pinned buffers and copied on the
// loader's copy stream must equal the CPU loader's batches, for work queued on tapegrad's
// stream right after the hand-out (clone() is a device copy on that stream: without the
// event wait it would read the batch before its copy landed). Shutdown mid-epoch and
// exceptions behave as on the CPU.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "data/dataloader.h"

using tg::Tensor;
using namespace tg::data;

namespace {

// Example i: `width` floats i*width + k (large, so a copy takes long enough to race),
// target i.
class Wide : public Dataset {
 public:
  Wide(int64_t n, int64_t width) : n_(n), width_(width) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    if (i == throw_at) throw std::runtime_error("boom at " + std::to_string(i));
    std::vector<float> v(static_cast<std::size_t>(width_));
    for (int64_t k = 0; k < width_; ++k) v[static_cast<std::size_t>(k)] = static_cast<float>(i * width_ + k);
    return {tg::from_vector(v, {width_}), tg::from_vector(std::vector<int64_t>{i}, tg::Shape{})};
  }
  int64_t n_, width_;
  std::atomic<int64_t> throw_at{-1};
};

#define SKIP_WITHOUT_GPU() \
  if (!tg::cuda_available()) GTEST_SKIP() << "no usable CUDA device"

TEST(data_loader_cuda, BatchesMatchTheCpuLoader) {
  SKIP_WITHOUT_GPU();
  auto ds = std::make_shared<Wide>(37, 1 << 16);  // 256 KiB per example, 2 MiB per batch
  for (int workers : {0, 3}) {
    DataLoader cpu(ds, {.batch_size = 8, .shuffle = true, .seed = 3});
    DataLoader gpu(ds, {.batch_size = 8, .shuffle = true, .seed = 3, .num_workers = workers,
                        .device = tg::Device::cuda()});
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<Tensor> inputs, targets;  // clones, queued on tapegrad's stream at once
      for (Batch& b : gpu) {
        EXPECT_TRUE(b.input.device().is_cuda());
        EXPECT_TRUE(b.target.device().is_cuda());
        inputs.push_back(b.input.clone());
        targets.push_back(b.target.clone());
      }
      std::size_t k = 0;
      for (Batch& b : cpu) {
        ASSERT_LT(k, inputs.size());
        EXPECT_EQ(inputs[k].shape(), b.input.shape());
        EXPECT_EQ(inputs[k].to_vector<float>(), b.input.to_vector<float>()) << "workers " << workers << " batch " << k;
        EXPECT_EQ(targets[k].to_vector<int64_t>(), b.target.to_vector<int64_t>());
        ++k;
      }
      EXPECT_EQ(k, inputs.size());
    }
  }
}

TEST(data_loader_cuda, DestroyMidEpochAndExceptions) {
  SKIP_WITHOUT_GPU();
  auto ds = std::make_shared<Wide>(64, 1 << 14);
  {
    DataLoader loader(ds, {.batch_size = 4, .num_workers = 4, .device = tg::Device::cuda()});
    auto it = loader.begin();
    ++it;  // batch 2 is probably uploaded ahead: its copy is in flight when the loader goes
  }
  ds->throw_at = 21;
  DataLoader loader(ds, {.batch_size = 4, .num_workers = 2, .device = tg::Device::cuda()});
  int seen = 0;
  try {
    for (Batch& b : loader) {
      (void)b;
      ++seen;
    }
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom at 21");
  }
  EXPECT_EQ(seen, 5);
  ds->throw_at = -1;
  int batches = 0;
  for (Batch& b : loader) batches += b.input.size(0) == 4;
  EXPECT_EQ(batches, 16);
  tg::synchronize(tg::Device::cuda());
}

}  // namespace
