// Data-parallel training of the ResNet-18-style GroupNorm network (examples/common/resnet.h)
// with tg::dist::DistributedDataParallel: one process per GPU (or per CPU slot), each
// training on its own shard of the data, the gradients averaged over the processes during
// backward. Launched by MPI:
//
//   mpirun -np 4 ddp_train --device cuda --batch 64 --size 64 --steps 50 --precision tf32
//   mpirun -np 2 ddp_train --device cpu --small          # the test: width 8, 16x16, 40 steps
//
// The data are the generated shapes of examples/common/shapes_dataset.h, enlarged to --size
// pixels and tinted per image (as examples/resnet.cpp), served by a tg::data::DataLoader
// whose shard option gives rank r shard r of each epoch: the ranks draw the same permutation
// and take disjoint slices of it, so together they see the whole dataset once per epoch.
// With --data fixed every rank reuses its first batch, which leaves the loader out of the
// timings (the benchmark, bench/ddp/run.sh, compares the training step alone).
//
// --batch is per rank: the global batch is ranks x batch. Each rank prints its loss every
// --log-every steps; rank 0 prints the step time and global images/s measured over the steps
// after --warmup, between barriers with the device drained, so that every rank's work is in
// the window. --json prints that result as one JSON line on rank 0 instead of the text.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "common/example.h"
#include "common/resnet.h"
#include "common/shapes_dataset.h"
#include "data/dataloader.h"
#include "dist/ddp.h"
#include "dist/process_group.h"
#include "tapegrad/tapegrad.h"

namespace {

// The shapes as a data::Dataset at `size` x `size` in three channels: example i is base image
// i (16x16, nearest-neighbour enlarged) times a tint per channel in [0.4, 1.6) drawn from
// (seed, i), so colour carries no label. Made on demand: a 64x64 dataset held in memory
// would take 48 KiB per image.
class ColorShapes : public tg::data::Dataset {
 public:
  ColorShapes(int64_t count, int64_t size, uint64_t seed)
      : base_(ex::make_shapes_dataset(count, seed)), size_(size), seed_(seed) {}
  int64_t size() const override { return base_.count; }
  tg::data::Example get(int64_t i) const override {
    constexpr int64_t S = ex::kShapeImageSize;
    std::mt19937_64 rng(seed_ * 7919 + static_cast<uint64_t>(i));
    std::uniform_real_distribution<float> tint(0.4f, 1.6f);
    std::vector<float> pixels(static_cast<size_t>(3 * size_ * size_));
    const float* src = base_.images.data() + i * S * S;
    for (int64_t c = 0; c < 3; ++c) {
      const float t = tint(rng);
      float* dst = pixels.data() + c * size_ * size_;
      for (int64_t y = 0; y < size_; ++y)
        for (int64_t x = 0; x < size_; ++x) dst[y * size_ + x] = t * src[(y * S / size_) * S + x * S / size_];
    }
    return {tg::from_vector(pixels, {3, size_, size_}),
            tg::from_vector(std::vector<int64_t>{base_.labels[static_cast<size_t>(i)]}, tg::Shape{})};
  }

 private:
  ex::ShapesDataset base_;
  int64_t size_;
  uint64_t seed_;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    // Everything is read and checked before MPI starts, so that --help and a bad option
    // behave as in the other examples, with or without a launcher.
    ex::Args args(argc, argv, {"small", "json"});
    const std::string device_name = args.get("device", tg::cuda_available() ? "cuda" : "cpu");
    const tg::Device wanted = tg::parse_device(device_name);
    const bool small = args.has("small");
    const bool json = args.has("json");
    const int64_t batch = args.get_int("batch", small ? 8 : 64);
    const int64_t size = args.get_int("size", small ? 16 : 64);
    const int64_t width = args.get_int("width", small ? 8 : 64);
    const int64_t steps = args.get_int("steps", small ? 40 : 50);
    const int64_t warmup = args.get_int("warmup", small ? 2 : 10);
    const int64_t log_every = args.get_int("log-every", 10);
    const int64_t train_count = args.get_int("train", small ? 256 : 8192);
    const std::string data = args.get("data", "shapes");
    const std::string optim = args.get("optim", "sgd");
    const double lr = args.get_double("lr", optim == "adam" ? 1e-3 : 0.02);
    const std::string precision = args.get("precision", "fp32");
    const uint64_t seed = static_cast<uint64_t>(args.get_int("seed", 0));
    const int64_t workers = args.get_int("workers", wanted.is_cuda() ? 2 : 0);
    const int64_t threads = args.get_int("threads", 0);
    args.finish("[--device cpu|cuda] [--small] [--batch N (per rank)] [--size N] [--width N] [--steps N] "
                "[--warmup N] [--log-every N] [--train N] [--data shapes|fixed] [--optim sgd|adam] [--lr X] "
                "[--precision fp32|tf32] [--seed N] [--workers N] [--threads N (CPU, per rank)] [--json]");
    TG_CHECK(precision == "fp32" || precision == "tf32", "--precision: fp32 or tf32, got ", precision);
    TG_CHECK(optim == "sgd" || optim == "adam", "--optim: sgd or adam, got ", optim);
    TG_CHECK(data == "shapes" || data == "fixed", "--data: shapes or fixed, got ", data);
    TG_CHECK(batch >= 1 && size >= 1 && steps >= 1 && warmup >= 0 && log_every >= 1 && workers >= 0 && threads >= 0,
             "--batch, --size, --steps and --log-every must be positive, --warmup, --workers and --threads >= 0");
    TG_CHECK(width >= 2 && width % 2 == 0, "--width must be even and at least 2, got ", width);

    // The CPU run is MPI only; on GPUs each rank binds to GPU local_rank and NCCL averages.
    tg::dist::ProcessGroup pg({.use_gpu = wanted.is_cuda()});
    const int rank = pg.rank(), ranks = pg.size();
    const tg::Device device = pg.device();
    TG_CHECK_AS(DeviceError, device.is_cuda() == wanted.is_cuda(), "ddp_train: --device ", device_name,
                " asked for, but the process group runs on ", device.str(),
                tg::dist::nccl_built() ? " (no GPU visible to this rank)" : " (tapegrad was built without NCCL)");
    if (device.is_cpu())  // the ranks of one host share its cores
      tg::set_num_threads(threads > 0 ? static_cast<int>(threads)
                                      : std::max(1, tg::default_num_threads() / std::max(1, pg.local_size())));
    tg::set_precision(precision == "tf32" ? tg::Precision::TF32 : tg::Precision::FP32);
    tg::manual_seed(seed);  // the same initial weights everywhere (DDP broadcasts rank 0's anyway)

    // groups as examples/resnet.cpp: 32 at ResNet-18's width 64, width / 2 below that.
    const int64_t groups = std::min<int64_t>(32, width / 2);
    auto net = std::make_shared<ex::ResNet18GN>(
        ex::ResNetOptions{.in_channels = 3, .classes = ex::kShapeClasses, .width = width, .groups = groups},
        tg::TensorOptions{.device = device});
    tg::dist::DistributedDataParallel ddp(pg, net);
    std::unique_ptr<tg::nn::Optimizer> opt;
    if (optim == "sgd")
      opt = std::make_unique<tg::nn::SGD>(ddp.parameters(), tg::nn::SGDOptions{.lr = lr, .momentum = 0.9});
    else
      opt = std::make_unique<tg::nn::Adam>(ddp.parameters(), tg::nn::AdamOptions{.lr = lr});

    auto dataset = std::make_shared<ColorShapes>(train_count, size, 1000 + seed);
    tg::data::DataLoader loader(dataset, {.batch_size = batch,
                                          .shuffle = true,
                                          .seed = seed,
                                          .drop_last = true,  // every step a full batch on every rank
                                          .num_shards = ranks,
                                          .shard = rank,
                                          .num_workers = static_cast<int>(workers),
                                          .device = device});
    TG_CHECK(loader.num_batches() >= 1, "ddp_train: --train ", train_count, " gives no full batch of ", batch,
             " per rank for ", ranks, " ranks");
    if (rank == 0 && !json) {
      std::printf("DDP over %d ranks (%s%s): ResNet-18-style GroupNorm net, width %lld, %zu parameter tensors, "
                  "%lldx%lld images, batch %lld per rank (global %lld), %s lr %g, %s, data %s (%lld batches per "
                  "rank and epoch)\n",
                  ranks, device.str().c_str(), ranks > 1 && device.is_cuda() ? " + NCCL" : "",
                  static_cast<long long>(width), ddp.parameters().size(), static_cast<long long>(size),
                  static_cast<long long>(size), static_cast<long long>(batch), static_cast<long long>(batch * ranks),
                  optim.c_str(), lr, precision.c_str(), data.c_str(), static_cast<long long>(loader.num_batches()));
      std::fflush(stdout);
    }

    // The batches: the loader's, epoch after epoch (every rank has the same number of batches
    // per epoch, so the ranks stay in step), or with --data fixed the first one again.
    std::unique_ptr<tg::data::DataLoader::Iterator> it;
    tg::data::Batch fixed;
    auto next_batch = [&]() -> const tg::data::Batch& {
      if (data == "fixed" && fixed.input.defined()) return fixed;
      if (!it || *it == loader.end()) {
        it = std::make_unique<tg::data::DataLoader::Iterator>(loader.begin());
      } else {
        ++*it;
        if (*it == loader.end()) it = std::make_unique<tg::data::DataLoader::Iterator>(loader.begin());
      }
      if (data == "fixed") {
        fixed = **it;
        return fixed;
      }
      return **it;
    };

    double t0 = 0;
    for (int64_t step = 1; step <= steps; ++step) {
      if (step == warmup + 1) {  // the timed window starts with every rank's queue drained
        tg::synchronize(device);
        pg.barrier();
        t0 = now_s();
      }
      const tg::data::Batch& b = next_batch();
      tg::Tape tape;
      tg::Tensor loss = tg::cross_entropy(ddp(b.input), b.target);
      tape.backward(loss);  // gradients averaged over the ranks when it returns
      opt->step();
      ddp.zero_grad();
      if (step % log_every == 0 || step == steps) {
        std::printf("[rank %d] step %4lld  loss %.4f\n", rank, static_cast<long long>(step), loss.item());
        std::fflush(stdout);
      }
    }
    tg::synchronize(device);
    pg.barrier();
    const double seconds = now_s() - t0;
    const int64_t timed = steps - warmup;
    if (rank == 0) {
      if (timed < 1) {
        std::printf("no timing: --steps %lld does not exceed --warmup %lld\n", static_cast<long long>(steps),
                    static_cast<long long>(warmup));
      } else {
        const double step_ms = 1e3 * seconds / static_cast<double>(timed);
        const double images_per_s = static_cast<double>(timed * batch * ranks) / seconds;
        if (json)
          std::printf("{\"framework\":\"tapegrad\",\"gpus\":%d,\"device\":\"%s\",\"batch_per_rank\":%lld,"
                      "\"size\":%lld,\"width\":%lld,\"precision\":\"%s\",\"steps_timed\":%lld,\"step_ms\":%.3f,"
                      "\"images_per_s\":%.1f}\n",
                      ranks, device.is_cuda() ? "cuda" : "cpu", static_cast<long long>(batch),
                      static_cast<long long>(size), static_cast<long long>(width), precision.c_str(),
                      static_cast<long long>(timed), step_ms, images_per_s);
        else
          std::printf("%d ranks: %.2f ms per step, %.0f images/s (global batch %lld, steps %lld-%lld)\n", ranks,
                      step_ms, images_per_s, static_cast<long long>(batch * ranks),
                      static_cast<long long>(warmup + 1), static_cast<long long>(steps));
      }
      std::fflush(stdout);
    }
    return 0;
  });
}
