// DataLoader: batches of a Dataset, in a seeded order, made ahead of time by worker threads.
//
//   auto train = std::make_shared<tg::data::MnistDataset>("train-images-idx3-ubyte",
//                                                         "train-labels-idx1-ubyte");
//   tg::data::DataLoader loader(train, {.batch_size = 64, .shuffle = true, .seed = 1,
//                                       .num_workers = 2, .device = tg::Device::cuda()});
//   for (int epoch = 0; epoch < 10; ++epoch)
//     for (tg::data::Batch& b : loader) {    // each range-for is the next epoch
//       tg::Tape tape;
//       tg::Tensor loss = tg::cross_entropy(model(b.input), b.target);
//       ...
//     }
//
// Order. Epoch e visits the dataset in order(e): 0, 1, ..., n-1 without shuffle, else a
// permutation drawn from (seed, e) by the loader's own generator (not std::shuffle, whose
// algorithm differs between standard libraries), so the same seed gives the same batches
// on every machine, and every epoch a new order. Batch k holds order[k*B .. k*B + B): the
// batches do not depend on the number of workers. With drop_last the final short batch is
// left out.
//
// Shards (data-parallel training, PyTorch's DistributedSampler). With num_shards = S > 1
// each rank builds its loader with the same dataset, seed and epoch and its own shard r.
// Every rank draws the same epoch permutation from (seed, epoch); it is padded by repeating
// its start until its length divides by S (with drop_last the tail is cut instead, so that
// no example is seen twice), and shard r takes elements r, r + S, r + 2S, ... of it. The
// shards of an epoch are then disjoint except for the padding, cover the whole dataset
// (less the cut tail with drop_last), and have equal lengths, so every rank makes the same
// number of batches and the ranks' collectives stay matched. Batches are made from the
// shard as from a whole epoch, and drop_last also keeps its batch meaning there. order(e)
// and num_batches() are the shard's. set_epoch must be called alike on every rank.
//
//   tg::data::DataLoader loader(train, {.batch_size = 64, .shuffle = true, .seed = 1,
//                                       .num_shards = pg.size(), .shard = pg.rank()});
//
// Workers. With num_workers = 0 a batch is made on the consumer's thread when it is asked
// for. With N workers, N threads make batches ahead of the consumer, at most
// N * prefetch_factor of them waiting (a bounded queue: memory stays bounded however slow
// the training step is); batches are handed out in order. An exception thrown while
// making a batch (by Dataset::get, or stacking examples of different shapes) is rethrown
// to the consumer when it reaches that batch, and the workers stop. Destroying the loader,
// or starting the next epoch, in the middle of an epoch stops and joins the workers: each
// finishes the example it is reading, none waits for the consumer.
//
// Device. With a CUDA device, workers stack batches into pinned host buffers, and each
// batch is copied on a copy stream of the loader's own, which tapegrad's stream waits for
// (an event, no host wait) when the batch is handed out; batch k+1's copy is started when
// batch k is handed out, so it runs beside the step on batch k (see device_stage.h).
//
// One iteration at a time: begin() ends the previous epoch, and an iterator of an ended
// epoch (or of a destroyed loader) throws when used. An iterator is move-only: batches
// are handed out once each, in order, so a copy could only re-ask for batches its
// original already took. A moved-from iterator throws when used.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dataset.h"

namespace tg::data {

namespace detail {
class DeviceStage;
}

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;   // leave out the final batch when it is short (and cut, not
                            // pad, an epoch to a multiple of num_shards)
  int64_t num_shards = 1;   // the epoch is split into this many shards (ranks)...
  int64_t shard = 0;        // ...and this loader hands out shard `shard` in [0, num_shards)
  int num_workers = 0;      // threads making batches ahead; 0: on the consumer's thread
  int prefetch_factor = 2;  // batches waiting per worker (the queue's bound)
  Device device = Device::cpu();  // where batches are handed out
};

struct Batch {
  Tensor input;                  // (B, ...example input shape), on the loader's device
  Tensor target;                 // (B, ...example target shape)
  std::vector<int64_t> indices;  // the dataset indices of its B examples, in order
  int64_t index = 0;             // the batch's position in its epoch
};

class DataLoader {
 public:
  // Throws tg::Error for batch_size < 1, num_workers < 0, prefetch_factor < 1,
  // num_shards < 1 or shard outside [0, num_shards), and
  // DeviceError for a device this build or machine cannot use.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  // Borrows the dataset: it must outlive the loader.
  DataLoader(const Dataset& dataset, DataLoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch (of this loader's shard).
  int64_t num_batches() const;
  // Examples per epoch in this loader's shard (the dataset's size without shards).
  int64_t shard_size() const;
  int64_t size() const { return num_batches(); }
  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

  // The epoch the next begin() runs (0 first); each begin() counts one up. set_epoch
  // repeats or skips epochs (e.g. when resuming training).
  int64_t epoch() const { return epoch_; }
  void set_epoch(int64_t epoch);
  // The dataset indices of epoch `epoch`, in the order its batches hold them (this
  // loader's shard only, with its padding).
  std::vector<int64_t> order(int64_t epoch) const;

 private:
  struct Run;  // one epoch's order, workers and queue (dataloader.cpp)

 public:
  struct End {};
  // A C++20 input iterator (std::input_iterator, with End as its sentinel).
  class Iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;

    Iterator(Iterator&& other) noexcept;
    Iterator& operator=(Iterator&& other) noexcept;
    Iterator(const Iterator&) = delete;
    Iterator& operator=(const Iterator&) = delete;

    // const, as std::indirectly_readable asks: the batch is the iterator's own, and a
    // const iterator hands it out mutable, as a const pointer does.
    Batch& operator*() const;
    Batch* operator->() const { return &**this; }
    Iterator& operator++();
    void operator++(int) { ++*this; }
    bool operator==(End) const { return done_; }

   private:
    friend class DataLoader;
    explicit Iterator(std::weak_ptr<Run> run) : run_(std::move(run)) {}
    std::shared_ptr<Run> live_run() const;
    void fetch();
    std::weak_ptr<Run> run_;  // expires when a later begin() or the loader's end stops it
    bool moved_from_ = false;
    int64_t next_ = 0;  // the batch fetch() makes current
    bool done_ = false;
    mutable Batch batch_;
  };
  // Starts the next epoch (stopping the previous one's workers) and makes its first batch.
  Iterator begin();
  End end() const { return {}; }

 private:
  DataLoaderOptions options_;
  std::shared_ptr<const Dataset> dataset_;
  int64_t epoch_ = 0;
  std::unique_ptr<detail::DeviceStage> stage_;  // CUDA target only; kept across epochs
  // The epoch in progress. Its only owner: iterators hold weak references, so that ending
  // the epoch (begin(), the destructor) stops it at once and its iterators see that.
  std::shared_ptr<Run> run_;
};

}  // namespace tg::data
