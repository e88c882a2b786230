#include "data/dataloader.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "data/device_stage.h"

namespace tg::data {
namespace {

// splitmix64: a tiny generator with a fixed definition, so a seed gives the same
// permutation on every platform.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, n) without modulo bias: draws below 2^64 mod n are redrawn.
uint64_t uniform_below(uint64_t& state, uint64_t n) {
  const uint64_t reject_below = (0 - n) % n;
  uint64_t x;
  do x = splitmix64(state);
  while (x < reject_below);
  return x % n;
}

// A made batch, before it reaches the consumer: its tensors (CPU target) or the pinned
// slot holding it (CUDA target), or the exception that stopped it.
struct Produced {
  std::exception_ptr error;
  std::vector<int64_t> indices;
  Tensor input, target;
  int slot = -1;
  Shape input_shape, target_shape;
  DType input_dtype = DType::f32, target_dtype = DType::f32;
};

constexpr int kMaxWorkers = 256;

}  // namespace

// One epoch: its order, its workers, and the batches made but not yet handed out.
struct DataLoader::Run {
  Run(const DataLoader& loader, int64_t epoch);
  ~Run();
  Produced make(int64_t k, int slot) const;
  void work();
  Produced take(int64_t k);
  Batch hand_out(int64_t k);
  Batch finish(int64_t k, Produced&& p, int& slot);
  void release_slot(int slot);

  const Dataset& dataset;
  const DataLoaderOptions& opt;
  detail::DeviceStage* stage;  // null for a CPU target
  std::vector<int64_t> order;
  int64_t num_batches;
  int64_t capacity;  // batches claimed by workers but not yet taken by the consumer
  bool failed = false;  // a batch threw: the epoch is over
  int64_t next_hand_out = 0;  // batches are handed out once each, in order

  std::mutex m;
  std::condition_variable work_cv;   // workers wait for room in the queue (or a slot)
  std::condition_variable ready_cv;  // the consumer waits for its next batch
  int64_t next_claim = 0;            // the next batch a worker makes
  int64_t next_consume = 0;          // the next batch the consumer takes
  std::map<int64_t, Produced> done;  // at most `capacity` entries
  std::vector<int> free_slots;
  bool stop = false;
  std::vector<std::thread> workers;

  // CUDA target: batch k+1, uploaded when batch k was handed out.
  bool staged = false;
  int64_t staged_index = -1;
  int staged_slot = -1;
  Batch staged_batch;
};

DataLoader::Run::Run(const DataLoader& loader, int64_t epoch)
    : dataset(*loader.dataset_),
      opt(loader.options_),
      stage(loader.stage_.get()),
      order(loader.order(epoch)),
      num_batches(loader.num_batches()),
      capacity(std::max<int64_t>(1, int64_t{opt.num_workers} * opt.prefetch_factor)) {
  if (stage)
    for (int s = 0; s < stage->slots(); ++s) free_slots.push_back(s);
  try {
    for (int w = 0; w < opt.num_workers; ++w) workers.emplace_back([this] { work(); });
  } catch (...) {  // a thread that could not start: stop the ones that did
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    work_cv.notify_all();
    for (auto& t : workers) t.join();
    throw;
  }
}

DataLoader::Run::~Run() {
  {
    std::lock_guard<std::mutex> lock(m);
    stop = true;
  }
  work_cv.notify_all();
  for (auto& t : workers) t.join();
  // The staged batch's memory is freed on tapegrad's stream: order that after its copy.
  if (staged) {
    try {
      stage->ready(staged_slot);
    } catch (...) {  // a destructor must not throw; a failed wait leaves nothing to recover
    }
  }
}

Produced DataLoader::Run::make(int64_t k, int slot) const {
  Produced p;
  try {
    const int64_t first = k * opt.batch_size;
    const int64_t last = std::min<int64_t>(first + opt.batch_size, static_cast<int64_t>(order.size()));
    p.indices.assign(order.begin() + first, order.begin() + last);
    std::vector<Tensor> inputs, targets;
    inputs.reserve(p.indices.size());
    targets.reserve(p.indices.size());
    for (int64_t i : p.indices) {
      Example e = dataset.get(i);
      inputs.push_back(std::move(e.input));
      targets.push_back(std::move(e.target));
    }
    p.input_shape = stacked_shape(inputs, p.indices, "input");
    p.target_shape = stacked_shape(targets, p.indices, "target");
    p.input_dtype = inputs[0].dtype();
    p.target_dtype = targets[0].dtype();
    if (stage) {
      const auto in_bytes = static_cast<std::size_t>(checked_tensor_bytes("DataLoader", p.input_shape, p.input_dtype));
      const auto tg_bytes = static_cast<std::size_t>(checked_tensor_bytes("DataLoader", p.target_shape, p.target_dtype));
      const std::size_t offset = detail::DeviceStage::target_offset(in_bytes);
      char* host = static_cast<char*>(stage->host_buffer(slot, offset + tg_bytes));
      stack_into(host, inputs);
      stack_into(host + offset, targets);
      p.slot = slot;
    } else {
      p.input = Tensor::empty(p.input_shape, {.dtype = p.input_dtype});
      p.target = Tensor::empty(p.target_shape, {.dtype = p.target_dtype});
      stack_into(p.input.raw_data(), inputs);
      stack_into(p.target.raw_data(), targets);
    }
  } catch (...) {
    p.error = std::current_exception();
    p.slot = -1;
  }
  return p;
}

void DataLoader::Run::work() {
  for (;;) {
    int64_t k;
    int slot = -1;
    {
      std::unique_lock<std::mutex> lock(m);
      work_cv.wait(lock, [&] {
        return stop || next_claim >= num_batches ||
               (next_claim < next_consume + capacity && (!stage || !free_slots.empty()));
      });
      if (stop || next_claim >= num_batches) return;
      k = next_claim++;
      if (stage) {
        slot = free_slots.back();
        free_slots.pop_back();
      }
    }
    Produced p = make(k, slot);
    const bool slot_back = p.slot < 0 && slot >= 0;  // it failed before filling the slot
    {
      std::lock_guard<std::mutex> lock(m);
      if (slot_back) free_slots.push_back(slot);
      done.emplace(k, std::move(p));
    }
    ready_cv.notify_all();
    if (slot_back) work_cv.notify_all();
  }
}

void DataLoader::Run::release_slot(int slot) {
  {
    std::lock_guard<std::mutex> lock(m);
    free_slots.push_back(slot);
  }
  work_cv.notify_all();
}

Produced DataLoader::Run::take(int64_t k) {
  if (workers.empty()) {  // made here, on the consumer's thread
    int slot = -1;
    if (stage) {
      std::lock_guard<std::mutex> lock(m);
      slot = free_slots.back();  // never empty: without workers only the consumer holds slots
      free_slots.pop_back();
    }
    Produced p = make(k, slot);
    if (p.slot < 0 && slot >= 0) release_slot(slot);
    next_consume = k + 1;
    return p;
  }
  Produced p;
  {
    std::unique_lock<std::mutex> lock(m);
    // Batch k was claimed or will be: the claim rule leaves room for it whatever the
    // consumer holds, and a worker stores every batch it claims, failed or not.
    ready_cv.wait(lock, [&] { return done.count(k) > 0; });
    auto it = done.find(k);
    p = std::move(it->second);
    done.erase(it);
    next_consume = k + 1;
  }
  work_cv.notify_all();
  return p;
}

Batch DataLoader::Run::finish(int64_t k, Produced&& p, int& slot) {
  if (p.error) {
    failed = true;
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    work_cv.notify_all();
    std::rethrow_exception(p.error);
  }
  Batch b;
  b.index = k;
  b.indices = std::move(p.indices);
  slot = p.slot;
  if (!stage) {
    b.input = std::move(p.input);
    b.target = std::move(p.target);
    return b;
  }
  try {
    stage->upload(p.slot, p.input_shape, p.input_dtype, p.target_shape, p.target_dtype, b.input, b.target);
  } catch (...) {
    failed = true;
    release_slot(p.slot);
    throw;
  }
  // The copy is queued and records the slot's event: a worker may refill the slot now
  // (host_buffer waits for that event first).
  release_slot(p.slot);
  return b;
}

Batch DataLoader::Run::hand_out(int64_t k) {
  TG_CHECK(!failed, "DataLoader: this epoch ended with an error; begin() starts the next one");
  // A batch asked for twice would never arrive: whoever took it first removed it.
  TG_CHECK(k == next_hand_out, "DataLoader: batch ", k, " asked for, but the next batch of this epoch is ",
           next_hand_out, "; each batch is handed out once, in order");
  ++next_hand_out;
  Batch b;
  int slot = -1;
  if (staged && staged_index == k) {
    b = std::move(staged_batch);
    slot = staged_slot;
    staged = false;
  } else {
    b = finish(k, take(k), slot);
  }
  if (!stage) return b;
  // Before any later upload into this slot re-records its event.
  stage->ready(slot);
  // Start batch k+1's copy now, before the caller queues its step on batch k, if a worker
  // has it (waiting for it here would delay batch k). A failed batch stays in `done` and
  // is rethrown when its turn comes.
  if (!workers.empty() && k + 1 < num_batches) {
    bool available = false;
    {
      std::lock_guard<std::mutex> lock(m);
      auto it = done.find(k + 1);
      available = it != done.end() && !it->second.error;
    }
    if (available) {
      staged_batch = finish(k + 1, take(k + 1), staged_slot);
      staged_index = k + 1;
      staged = true;
    }
  }
  return b;
}

// ---- DataLoader -------------------------------------------------------------------------

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : options_(options), dataset_(std::move(dataset)) {
  TG_CHECK(dataset_ != nullptr, "DataLoader: null dataset");
  TG_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be at least 1, got ", options_.batch_size);
  TG_CHECK(options_.num_workers >= 0 && options_.num_workers <= kMaxWorkers, "DataLoader: num_workers must be in [0, ",
           kMaxWorkers, "], got ", options_.num_workers);
  TG_CHECK(options_.prefetch_factor >= 1 && options_.prefetch_factor <= 1024,
           "DataLoader: prefetch_factor must be in [1, 1024], got ", options_.prefetch_factor);
  TG_CHECK(dataset_->size() >= 0, "DataLoader: the dataset reports a negative size ", dataset_->size());
  TG_CHECK(options_.num_shards >= 1, "DataLoader: num_shards must be at least 1, got ", options_.num_shards);
  TG_CHECK(options_.shard >= 0 && options_.shard < options_.num_shards, "DataLoader: shard must be in [0, ",
           options_.num_shards, ") for num_shards ", options_.num_shards, ", got ", options_.shard);
  const Device d = options_.device;
  if (d.is_cuda()) {
    const int count = cuda_device_count();
    TG_CHECK_AS(DeviceError, d.index < count, "DataLoader: batches for ", d.str(), " requested, but ",
                TG_CUDA ? "this machine has " + std::to_string(count) + " usable GPUs"
                        : std::string("tapegrad was built without CUDA"));
    const int slots = static_cast<int>(std::max<int64_t>(1, int64_t{options_.num_workers} * options_.prefetch_factor)) + 1;
    stage_ = std::make_unique<detail::DeviceStage>(d, slots);
  } else {
    TG_CHECK_AS(DeviceError, d.index == 0, "DataLoader: the CPU device has index 0, got ", d.index);
  }
}

DataLoader::DataLoader(const Dataset& dataset, DataLoaderOptions options)
    : DataLoader(std::shared_ptr<const Dataset>(&dataset, [](const Dataset*) {}), options) {}

DataLoader::~DataLoader() {
  run_.reset();  // joins the workers, who may still be writing into the stage's buffers
  stage_.reset();
}

int64_t DataLoader::shard_size() const {
  const int64_t n = dataset_->size(), s = options_.num_shards;
  // Padded up to a multiple of s, or with drop_last cut down to one.
  return options_.drop_last ? n / s : n / s + (n % s != 0);
}

int64_t DataLoader::num_batches() const {
  const int64_t n = shard_size(), b = options_.batch_size;
  return options_.drop_last ? n / b : n / b + (n % b != 0);
}

void DataLoader::set_epoch(int64_t epoch) {
  TG_CHECK(epoch >= 0, "DataLoader::set_epoch: epoch must be >= 0, got ", epoch);
  epoch_ = epoch;
}

std::vector<int64_t> DataLoader::order(int64_t epoch) const {
  TG_CHECK(epoch >= 0, "DataLoader::order: epoch must be >= 0, got ", epoch);
  std::vector<int64_t> v(static_cast<std::size_t>(dataset_->size()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i);
  if (options_.shuffle) {
    // One stream per (seed, epoch): the seed is mixed first, so seeds s and s+1 do not give
    // shifted copies of each other's epochs.
    uint64_t mix = options_.seed;
    uint64_t state = splitmix64(mix) ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull);
    for (std::size_t i = v.size(); i > 1; --i) {  // Fisher-Yates
      const auto j = static_cast<std::size_t>(uniform_below(state, i));
      std::swap(v[i - 1], v[j]);
    }
  }
  const int64_t shards = options_.num_shards;
  if (shards == 1) return v;
  // Every shard sees the same permutation v: element k of the padded (or cut) epoch,
  // v[k mod n], goes to shard k mod shards. Padding wraps around v as many times as needed
  // (more than once only when the dataset is smaller than the number of shards).
  const int64_t n = static_cast<int64_t>(v.size()), per_shard = shard_size();
  std::vector<int64_t> mine(static_cast<std::size_t>(per_shard));
  for (int64_t i = 0; i < per_shard; ++i)
    mine[static_cast<std::size_t>(i)] = v[static_cast<std::size_t>((options_.shard + i * shards) % n)];
  return mine;
}

DataLoader::Iterator DataLoader::begin() {
  run_.reset();  // stops the previous epoch's workers first
  run_ = std::make_shared<Run>(*this, epoch_);
  ++epoch_;
  Iterator it(run_);
  it.fetch();
  return it;
}

DataLoader::Iterator::Iterator(Iterator&& other) noexcept
    : run_(std::move(other.run_)),
      moved_from_(other.moved_from_),
      next_(other.next_),
      done_(other.done_),
      batch_(std::move(other.batch_)) {
  other.moved_from_ = true;
}

DataLoader::Iterator& DataLoader::Iterator::operator=(Iterator&& other) noexcept {
  if (this != &other) {
    run_ = std::move(other.run_);
    moved_from_ = other.moved_from_;
    next_ = other.next_;
    done_ = other.done_;
    batch_ = std::move(other.batch_);
    other.moved_from_ = true;
  }
  return *this;
}

std::shared_ptr<DataLoader::Run> DataLoader::Iterator::live_run() const {
  TG_CHECK(!moved_from_, "DataLoader: using a moved-from iterator");
  std::shared_ptr<Run> run = run_.lock();
  TG_CHECK(run != nullptr, "DataLoader: this iterator's epoch was ended by a later begin() or by the "
                           "DataLoader's destruction (one iteration at a time)");
  return run;
}

void DataLoader::Iterator::fetch() {
  const std::shared_ptr<Run> run = live_run();
  if (next_ >= run->num_batches) {
    done_ = true;
    batch_ = Batch{};
    return;
  }
  batch_ = run->hand_out(next_);
  ++next_;
}

Batch& DataLoader::Iterator::operator*() const {
  live_run();
  TG_CHECK(!done_, "DataLoader: dereferencing the end of an epoch");
  return batch_;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  TG_CHECK(!done_, "DataLoader: incrementing past the end of an epoch");
  fetch();
  return *this;
}

}  // namespace tg::data
