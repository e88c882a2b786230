// A small U-Net trained to segment generated images: each 32x32 image holds two to four filled
// shapes, disks and squares of similar size and brightness, over a noisy, unevenly lit
// background; the target mask marks the disks only, so a threshold cannot solve it: the net
// must tell a disk's outline from a square's.
//
//   encoder  conv3x3(1->8) GN SiLU conv3x3(8->8) GN SiLU  ------------------ skip ----+
//            max-pool 2 -> conv3x3(8->16) GN SiLU conv3x3(16->16) GN SiLU  -- skip -+ |
//            max-pool 2 -> conv3x3(16->32) GN SiLU                                 | |
//   decoder  ConvTranspose 2x2 s2 (32->16), cat skip -> conv3x3(32->16) GN SiLU <--+ |
//            ConvTranspose 2x2 s2 (16->8),  cat skip -> conv3x3(16->8)  GN SiLU <----+
//            conv1x1(8->1): one logit per pixel, BCE-with-logits against the mask
//
// AdamW with a linear warmup and cosine decay (nn::WarmupCosineLR), gradients clipped to norm
// 1 (nn::clip_grad_norm_), batches from a tg::data::DataLoader. Prints loss and held-out IoU
// (intersection over union of the predicted and true disk pixels) per epoch; --svg PATH
// writes both curves.
//
//   unet                                   # CPU, about half a minute on 2 cores
//   unet --device cuda --epochs 20 --train 8000 --svg unet.svg
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "common/example.h"
#include "common/svg.h"
#include "data/dataloader.h"
#include "tapegrad/tapegrad.h"

namespace {

namespace nn = tg::nn;
constexpr int64_t kSize = 32;

// One image and its mask, drawn from `seed`: shapes at random positions (they may overlap; a
// later square covers an earlier disk's pixels in both image and mask).
void draw_example(uint64_t seed, std::vector<float>& image, std::vector<float>& mask) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  image.assign(kSize * kSize, 0.f);
  mask.assign(kSize * kSize, 0.f);
  // Uneven light: a gradient in a random direction, so absolute brightness says little.
  const double gx = u(rng) - 0.5, gy = u(rng) - 0.5, base = 0.2 * u(rng);
  for (int64_t y = 0; y < kSize; ++y)
    for (int64_t x = 0; x < kSize; ++x) image[y * kSize + x] = float(base + 0.4 * (gx * x + gy * y) / kSize);
  const int shapes = 2 + int(u(rng) * 3);
  for (int s = 0; s < shapes; ++s) {
    const bool disk = u(rng) < 0.5;
    const double r = 3.0 + 3.0 * u(rng);  // radius or half side, 3..6 pixels
    const double cx = r + u(rng) * (kSize - 2 * r), cy = r + u(rng) * (kSize - 2 * r);
    const double brightness = 0.6 + 0.3 * u(rng);
    for (int64_t y = 0; y < kSize; ++y)
      for (int64_t x = 0; x < kSize; ++x) {
        const double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
        const bool inside = disk ? dx * dx + dy * dy <= r * r : std::abs(dx) <= r * 0.9 && std::abs(dy) <= r * 0.9;
        if (!inside) continue;
        image[y * kSize + x] += float(brightness);
        mask[y * kSize + x] = disk ? 1.f : 0.f;
      }
  }
  std::normal_distribution<double> noise(0.0, 0.08);
  for (float& v : image) v += float(noise(rng));
}

class Shapes : public tg::data::Dataset {
 public:
  Shapes(int64_t count, uint64_t seed) : count_(count), seed_(seed) {}
  int64_t size() const override { return count_; }
  tg::data::Example get(int64_t i) const override {
    std::vector<float> image, mask;
    draw_example(seed_ * 1000003 + uint64_t(i), image, mask);
    return {tg::from_vector(image, {1, kSize, kSize}), tg::from_vector(mask, {1, kSize, kSize})};
  }

 private:
  int64_t count_;
  uint64_t seed_;
};

// conv3x3 -> GroupNorm -> SiLU.
class ConvBlock : public nn::Module {
 public:
  ConvBlock(int64_t in, int64_t out, const tg::TensorOptions& on)
      : conv_(std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in, .out_channels = out,
                                                             .kernel_size = 3, .padding = {1}},
                                           on)),
        norm_(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = out / 4, .num_channels = out}, on)) {
    register_module("conv", conv_);
    register_module("norm", norm_);
  }
  tg::Tensor forward(const tg::Tensor& x) override { return tg::silu((*norm_)((*conv_)(x))); }

 private:
  std::shared_ptr<nn::Conv2d> conv_;
  std::shared_ptr<nn::GroupNorm> norm_;
};

class UNet : public nn::Module {
 public:
  explicit UNet(const tg::TensorOptions& on) {
    auto up = [&](int64_t in, int64_t out) {
      return std::make_shared<nn::ConvTranspose2d>(
          nn::ConvTranspose2dOptions{.in_channels = in, .out_channels = out, .kernel_size = 2, .stride = 2}, on);
    };
    enc1a_ = add("enc1a", std::make_shared<ConvBlock>(1, 8, on));
    enc1b_ = add("enc1b", std::make_shared<ConvBlock>(8, 8, on));
    enc2a_ = add("enc2a", std::make_shared<ConvBlock>(8, 16, on));
    enc2b_ = add("enc2b", std::make_shared<ConvBlock>(16, 16, on));
    mid_ = add("mid", std::make_shared<ConvBlock>(16, 32, on));
    up2_ = add("up2", up(32, 16));
    dec2_ = add("dec2", std::make_shared<ConvBlock>(32, 16, on));
    up1_ = add("up1", up(16, 8));
    dec1_ = add("dec1", std::make_shared<ConvBlock>(16, 8, on));
    head_ = add("head", std::make_shared<nn::Conv2d>(
                            nn::Conv2dOptions{.in_channels = 8, .out_channels = 1, .kernel_size = 1}, on));
  }

  tg::Tensor forward(const tg::Tensor& x) override {
    const tg::PoolParams pool{.kernel_size = {2}};
    tg::Tensor e1 = (*enc1b_)((*enc1a_)(x));                                   // (N, 8, 32, 32)
    tg::Tensor e2 = (*enc2b_)((*enc2a_)(tg::max_pool2d(e1, pool)));            // (N, 16, 16, 16)
    tg::Tensor m = (*mid_)(tg::max_pool2d(e2, pool));                          // (N, 32, 8, 8)
    tg::Tensor d2 = (*dec2_)(tg::cat({(*up2_)(m), e2}, 1));                    // (N, 16, 16, 16)
    tg::Tensor d1 = (*dec1_)(tg::cat({(*up1_)(d2), e1}, 1));                   // (N, 8, 32, 32)
    return (*head_)(d1);                                                       // (N, 1, 32, 32)
  }

 private:
  template <class M>
  std::shared_ptr<M> add(const char* name, std::shared_ptr<M> m) {
    register_module(name, m);
    return m;
  }
  std::shared_ptr<ConvBlock> enc1a_, enc1b_, enc2a_, enc2b_, mid_, dec2_, dec1_;
  std::shared_ptr<nn::ConvTranspose2d> up2_, up1_;
  std::shared_ptr<nn::Conv2d> head_;
};

struct Score {
  double loss = 0, iou = 0;
};
// Mean loss and the IoU of all held-out disk pixels (logit > 0 predicts "disk").
Score evaluate(UNet& net, const Shapes& data, tg::Device device) {
  tg::data::DataLoader loader(data, {.batch_size = 128, .device = device});
  double loss = 0, intersection = 0, union_ = 0;
  for (tg::data::Batch& b : loader) {
    tg::Tensor logits = net(b.input);
    loss += tg::binary_cross_entropy_with_logits(logits, b.target).item() * double(b.target.size(0));
    const auto p = logits.to_vector<double>(), t = b.target.to_vector<double>();
    for (size_t i = 0; i < p.size(); ++i) {
      const bool pred = p[i] > 0, truth = t[i] > 0.5;
      intersection += pred && truth;
      union_ += pred || truth;
    }
  }
  return {loss / double(data.size()), union_ > 0 ? intersection / union_ : 1.0};
}

}  // namespace

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {});
    const tg::Device device = tg::parse_device(args.get("device", "cpu"));
    const int64_t epochs = args.get_positive_int("epochs", 6), batch = args.get_positive_int("batch", 32);
    const int64_t train_count = args.get_positive_int("train", 1536);
    const int64_t test_count = args.get_positive_int("test", 256);
    const double lr = args.get_positive_double("lr", 1e-2);
    const uint64_t seed = args.get_seed("seed", 0);
    const std::string svg_path = args.get("svg", "");  // empty: no file
    // --require-iou 0.8: exit with status 1 unless the last epoch's held-out IoU reaches it.
    const double required_iou = args.get_fraction("require-iou", 0.0);
    args.finish("[--device cpu|cuda] [--epochs N] [--batch N] [--train N] [--test N] [--lr X] [--seed N] "
                "[--svg PATH] [--require-iou F]");
    // Training drops the last partial batch, so a smaller set would train on nothing.
    TG_CHECK(train_count >= batch, "--train ", train_count, " gives no full batch of --batch ", batch,
             " (the last partial batch is dropped)");

    tg::manual_seed(seed);
    const Shapes train(train_count, 2 * seed + 1), test(test_count, 2 * seed + 2);
    UNet net({.device = device});
    nn::AdamW opt(net.parameters(), {.lr = lr, .weight_decay = 1e-4});
    const int64_t steps_per_epoch = train_count / batch;
    nn::WarmupCosineLR schedule(opt, {.warmup_steps = steps_per_epoch / 2,
                                      .cosine_steps = std::max<int64_t>(1, epochs * steps_per_epoch - steps_per_epoch / 2)});
    std::printf("U-Net on %lld generated %lldx%lld images (segment the disks, not the squares), %zu parameter "
                "tensors, AdamW lr %g with warmup + cosine, grad norm clipped to 1, batch %lld, %s\n",
                static_cast<long long>(train_count), static_cast<long long>(kSize), static_cast<long long>(kSize),
                net.parameters().size(), lr, static_cast<long long>(batch), device.str().c_str());

    tg::data::DataLoader loader(train, {.batch_size = batch, .shuffle = true, .seed = seed, .drop_last = true,
                                        .num_workers = 1, .device = device});
    std::vector<double> axis, train_loss, test_loss, test_iou;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
      double loss_sum = 0, clipped_norm = 0;
      int64_t steps = 0;
      for (tg::data::Batch& b : loader) {
        tg::Tape tape;
        tg::Tensor loss = tg::binary_cross_entropy_with_logits(net(b.input), b.target);
        tape.backward(loss);
        clipped_norm = nn::clip_grad_norm_(net.parameters(), 1.0);
        opt.step();
        opt.zero_grad();
        schedule.step();
        loss_sum += loss.item();
        ++steps;
      }
      const Score held_out = evaluate(net, test, device);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      axis.push_back(double(epoch));
      train_loss.push_back(loss_sum / double(std::max<int64_t>(1, steps)));
      test_loss.push_back(held_out.loss);
      test_iou.push_back(held_out.iou);
      std::printf("epoch %2lld  train loss %.4f  held-out loss %.4f  held-out IoU %.3f  lr %.2e  grad norm %.3f  (%.1f s)\n",
                  static_cast<long long>(epoch), train_loss.back(), held_out.loss, held_out.iou, opt.lr(),
                  clipped_norm, seconds);
      std::fflush(stdout);
    }
    if (!svg_path.empty()) {
      ex::svg::write(svg_path, {{.title = "loss (BCE with logits)",
                                 .x_label = "epoch",
                                 .y_label = "loss",
                                 .series = {{"train", axis, train_loss, "#1f77b4"}, {"held-out", axis, test_loss, "#d62728"}},
                                 .y_from_zero = true},
                                {.title = "held-out IoU of the disk pixels",
                                 .x_label = "epoch",
                                 .y_label = "IoU",
                                 .series = {{"held-out", axis, test_iou, "#d62728"}},
                                 .y_from_zero = true}});
      std::printf("wrote %s\n", svg_path.c_str());
    }
    if (test_iou.empty() || test_iou.back() < required_iou) {
      std::printf("held-out IoU %.3f is below the required %.3f\n", test_iou.empty() ? 0.0 : test_iou.back(),
                  required_iou);
      return 1;
    }
    return 0;
  });
}
