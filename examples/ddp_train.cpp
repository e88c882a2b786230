// Data-parallel training with tg::dist::DistributedDataParallel: one process per GPU (or per
// CPU slot), each training on its own shard of the data, the gradients averaged over the
// processes during backward. Launched by MPI:
//
//   mpirun -np 4 ddp_train --device cuda --batch 64 --size 64 --steps 50 --precision tf32
//   mpirun -np 4 ddp_train --device cuda --model conv_a --precision tf32
//   mpirun -np 2 ddp_train --device cpu --small          # the test: width 8, 16x16, 40 steps
//   mpirun -np 2 ddp_train --device cpu --small --model conv_a   # its test: x (2, 64, 16, 32)
//
// Two models (--model):
//   resnet  the ResNet-18-style GroupNorm network (examples/common/resnet.h), cross-entropy,
//           SGD with momentum 0.9 (or Adam). The data are the generated shapes, enlarged to
//           --size pixels and tinted per image (examples/common/color_shapes.h), served by a
//           tg::data::DataLoader whose shard option gives rank r shard r of each epoch: the
//           ranks draw the same permutation and take disjoint slices of it, so together they
//           see the whole dataset once per epoch. With --data fixed every rank reuses its
//           first batch, which leaves the loader out of the timings (the benchmark,
//           bench/ddp/run.sh, compares the training step alone).
//   conv_a  workload A's training step (examples/workload_a.cpp): Conv2d(64 -> 128, 3x3,
//           stride 1, pad 0, no bias) on x (--batch, 64, --size, 2 --size), default
//           8x64x512x1024 per rank, MSE against a fixed random target of the output's shape,
//           plain SGD at workload A's lr 16 (or Adam). x and the target are random on the
//           device, different on every rank, and the same at every step (no loader).
//
// --batch is per rank: the global batch is ranks x batch. Each rank prints its loss every
// --log-every steps; rank 0 prints the step time and global images/s measured over the steps
// after --warmup, between barriers with the device drained, so that every rank's work is in
// the window. --json prints that result as one JSON line on rank 0 instead of the text.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/color_shapes.h"
#include "common/example.h"
#include "common/resnet.h"
#include "common/training.h"
#include "dist/ddp.h"
#include "dist/process_group.h"
#include "tapegrad/tapegrad.h"

namespace {

// Upper bounds that keep the image and weight sizes far from int64_t overflow (a run near
// them fails on memory, with a message, long before), and the DataLoader's own worker limit.
constexpr int64_t kMaxImageSize = 4096, kMaxWidth = 4096, kMaxLoaderWorkers = 256;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    // Everything is read and checked before MPI starts, so that --help and a bad option
    // behave as in the other examples, with or without a launcher.
    ex::Args args(argc, argv, {"small", "json", "no-sync"});
    const std::string device_name = args.get("device", tg::cuda_available() ? "cuda" : "cpu");
    const tg::Device wanted = tg::parse_device(device_name);
    const std::string model = args.get("model", "resnet");
    const bool conv_a = model == "conv_a";
    const bool small = args.has("small");
    const bool json = args.has("json");
    // A control for the scaling benchmark: every rank trains on its own, with no gradient
    // all-reduce, so the step time over N ranks shows what the slowest GPU alone costs.
    const bool no_sync = args.has("no-sync");
    const int64_t batch = args.get_positive_int("batch", conv_a ? (small ? 2 : 8) : (small ? 8 : 64));
    const int64_t size = args.get_positive_int("size", conv_a ? (small ? 16 : 512) : (small ? 16 : 64), kMaxImageSize);
    const int64_t steps = args.get_positive_int("steps", small ? 40 : 50);
    const int64_t warmup = args.get_nonnegative_int("warmup", small ? 2 : 10);
    const int64_t log_every = args.get_positive_int("log-every", 10);
    const std::string optim = args.get("optim", "sgd");
    const double lr =
        args.get_positive_double("lr", optim == "adam" ? (conv_a ? 2e-3 : 1e-3) : (conv_a ? 16.0 : 0.02));
    const std::string precision = args.get("precision", "fp32");
    const uint64_t seed = args.get_seed("seed", 0);
    const int64_t threads = args.get_nonnegative_int("threads", 0, tg::kMaxThreads);  // 0: the default
    // The ResNet's own options; conv_a rejects them rather than ignoring them.
    const bool resnet_option_given =
        args.has("width") || args.has("train") || args.has("data") || args.has("workers");
    const int64_t width = args.get_positive_int("width", small ? 8 : 64, kMaxWidth);
    const int64_t train_count = args.get_positive_int("train", small ? 256 : 8192);
    const std::string data = args.get("data", "shapes");
    const int64_t workers = args.get_nonnegative_int("workers", wanted.is_cuda() ? 2 : 0, kMaxLoaderWorkers);
    args.finish("[--device cpu|cuda] [--model resnet|conv_a] [--small] [--batch N (per rank)] [--size N] "
                "[--steps N] [--warmup N] [--log-every N] [--optim sgd|adam] [--lr X] [--precision fp32|tf32] "
                "[--seed N] [--threads N (CPU, per rank)] [--json] [--no-sync (no gradient all-reduce: a timing control)]\n"
                "  resnet only: [--width N] [--train N] [--data shapes|fixed] [--workers N]\n"
                "  resnet: --size N gives NxN images (default 64, --small 16); conv_a: x is "
                "(batch, 64, N, 2N) (default 512, --small 16)");
    TG_CHECK(model == "resnet" || conv_a, "--model: resnet or conv_a, got ", model);
    TG_CHECK(!conv_a || !resnet_option_given, "--width, --train, --data and --workers are options of --model resnet");
    TG_CHECK(precision == "fp32" || precision == "tf32", "--precision: fp32 or tf32, got ", precision);
    TG_CHECK(optim == "sgd" || optim == "adam", "--optim: sgd or adam, got ", optim);
    TG_CHECK(data == "shapes" || data == "fixed", "--data: shapes or fixed, got ", data);
    TG_CHECK(width >= 2 && width % 2 == 0, "--width must be even and at least 2, got ", width);
    TG_CHECK(!conv_a || size >= 3, "--size must be at least 3 for conv_a (a 3x3 conv without padding), got ", size);

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

    // The model, its optimizer, and `step_loss`: one forward of this rank's batch and its loss.
    // `about` describes the run (the text header) and `json_fields` the model's own part of
    // the JSON line.
    std::shared_ptr<tg::nn::Module> net;
    if (conv_a)
      net = std::make_shared<tg::nn::Conv2d>(
          tg::nn::Conv2dOptions{.in_channels = 64, .out_channels = 128, .kernel_size = {3, 3}, .bias = false},
          tg::TensorOptions{.device = device});
    else  // groups as examples/resnet.cpp: 32 at ResNet-18's width 64, width / 2 below that.
      net = std::make_shared<ex::ResNet18GN>(ex::ResNetOptions{.in_channels = 3,
                                                               .classes = ex::kShapeClasses,
                                                               .width = width,
                                                               .groups = std::min<int64_t>(32, width / 2)},
                                             tg::TensorOptions{.device = device});
    tg::dist::DistributedDataParallel ddp(pg, net);
    std::unique_ptr<tg::nn::Optimizer> opt;
    if (optim == "sgd" && !conv_a)
      opt = std::make_unique<tg::nn::SGD>(ddp.parameters(), tg::nn::SGDOptions{.lr = lr, .momentum = 0.9});
    else  // workload A's: plain SGD, or Adam
      opt = ex::make_optimizer(optim, ddp.parameters(), lr);

    std::function<tg::Tensor()> step_loss;
    std::unique_ptr<ex::EpochBatches> batches;
    tg::Tensor x, target;
    std::string about, json_fields;
    char buf[512];
    if (conv_a) {
      const tg::Shape x_shape{batch, 64, size, 2 * size};
      const tg::Shape y_shape{batch, 128, size - 2, 2 * size - 2};
      tg::manual_seed(1000 + seed * 7919 + static_cast<uint64_t>(rank));  // a different batch per rank
      x = tg::randn(x_shape, {.device = device});
      target = tg::randn(y_shape, {.device = device});
      step_loss = [&] { return tg::mse_loss(ddp(x), target); };
      std::snprintf(buf, sizeof buf,
                    "workload A's Conv2d(64 -> 128, 3x3, pad 0, no bias) on x %s per rank (global batch %lld), "
                    "MSE against a fixed random target %s",
                    x_shape.str().c_str(), static_cast<long long>(batch * ranks), y_shape.str().c_str());
      about = buf;
      std::snprintf(buf, sizeof buf, "\"input\":[%lld,64,%lld,%lld]", static_cast<long long>(batch),
                    static_cast<long long>(size), static_cast<long long>(2 * size));
      json_fields = buf;
    } else {
      batches = std::make_unique<ex::EpochBatches>(
          std::make_shared<ex::ColorShapes>(train_count, size, 1000 + seed),
          tg::data::DataLoaderOptions{.batch_size = batch,
                                      .shuffle = true,
                                      .seed = seed,
                                      .drop_last = true,  // every step a full batch on every rank
                                      .num_shards = ranks,
                                      .shard = rank,
                                      .num_workers = static_cast<int>(workers),
                                      .device = device},
          /*repeat_first=*/data == "fixed");
      TG_CHECK(batches->batches_per_epoch() >= 1, "ddp_train: --train ", train_count, " gives no full batch of ",
               batch, " per rank for ", ranks, " ranks");
      step_loss = [&] {
        const tg::data::Batch& b = batches->next();
        return tg::cross_entropy(ddp(b.input), b.target);
      };
      std::snprintf(buf, sizeof buf,
                    "ResNet-18-style GroupNorm net, width %lld, %lldx%lld images, batch %lld per rank (global "
                    "%lld), data %s (%lld batches per rank and epoch)",
                    static_cast<long long>(width), static_cast<long long>(size), static_cast<long long>(size),
                    static_cast<long long>(batch), static_cast<long long>(batch * ranks), data.c_str(),
                    static_cast<long long>(batches->batches_per_epoch()));
      about = buf;
      std::snprintf(buf, sizeof buf, "\"size\":%lld,\"width\":%lld", static_cast<long long>(size),
                    static_cast<long long>(width));
      json_fields = buf;
    }
    if (rank == 0 && !json) {
      std::printf("DDP over %d ranks (%s%s): %s, %zu parameter tensors, %s lr %g%s, %s\n", ranks,
                  device.str().c_str(), ranks > 1 && device.is_cuda() ? " + NCCL" : "", about.c_str(),
                  ddp.parameters().size(), optim.c_str(), lr, optim == "sgd" && !conv_a ? " momentum 0.9" : "",
                  precision.c_str());
      std::fflush(stdout);
    }

    double t0 = 0;
    for (int64_t step = 1; step <= steps; ++step) {
      if (step == warmup + 1) {  // the timed window starts with every rank's queue drained
        tg::synchronize(device);
        pg.barrier();
        t0 = now_s();
      }
      tg::Tape tape;
      std::optional<tg::dist::DistributedDataParallel::NoSync> local_only;
      if (no_sync) local_only.emplace(ddp);
      tg::Tensor loss = step_loss();
      tape.backward(loss);  // gradients averaged over the ranks when it returns (unless --no-sync)
      local_only.reset();
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
          std::printf("{\"framework\":\"tapegrad\",\"model\":\"%s\",\"gpus\":%d,\"device\":\"%s\","
                      "\"batch_per_rank\":%lld,%s,\"precision\":\"%s\",\"steps_timed\":%lld,\"step_ms\":%.3f,"
                      "\"images_per_s\":%.1f%s}\n",
                      model.c_str(), ranks, device.is_cuda() ? "cuda" : "cpu", static_cast<long long>(batch),
                      json_fields.c_str(), precision.c_str(), static_cast<long long>(timed), step_ms, images_per_s,
                      no_sync ? ",\"no_sync\":true" : "");
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
