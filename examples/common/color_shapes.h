// The data of examples/ddp_train's ResNet model: the generated shapes of shapes_dataset.h
// enlarged and tinted as a data::Dataset, and the batches of a (sharded) DataLoader served
// epoch after epoch.
#pragma once
#include <cstdint>
#include <memory>

#include "common/shapes_dataset.h"
#include "data/dataloader.h"

namespace ex {

// The shapes at `size` x `size` in three channels: example i is base image i (16x16,
// nearest-neighbour enlarged) times a tint per channel in [0.4, 1.6) drawn from (seed, i),
// so colour carries no label. Made on demand: a 64x64 dataset held in memory would take
// 48 KiB per image.
class ColorShapes : public tg::data::Dataset {
 public:
  ColorShapes(int64_t count, int64_t size, uint64_t seed);
  int64_t size() const override { return base_.count; }
  tg::data::Example get(int64_t i) const override;

 private:
  ShapesDataset base_;
  int64_t size_;
  uint64_t seed_;
};

// The batches of a DataLoader, epoch after epoch (with drop_last and shards every rank has
// the same number of batches per epoch, so the ranks stay in step), or with `repeat_first`
// its first batch again at every call: that leaves the loader out of a benchmark's timings.
class EpochBatches {
 public:
  EpochBatches(std::shared_ptr<const tg::data::Dataset> dataset, tg::data::DataLoaderOptions options,
               bool repeat_first);
  const tg::data::Batch& next();
  int64_t batches_per_epoch() const { return loader_.num_batches(); }

 private:
  tg::data::DataLoader loader_;
  bool repeat_first_;
  std::unique_ptr<tg::data::DataLoader::Iterator> it_;  // the current epoch's position
  tg::data::Batch first_;                               // with repeat_first, once fetched
};

}  // namespace ex
