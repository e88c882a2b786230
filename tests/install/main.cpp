// Uses an installed tapegrad end to end: the umbrella header, a model trained for a few
// steps, a checkpoint saved and loaded, anomaly mode and the error type. Exits non-zero on
// any failure (scripts/test-install runs it).
#include <tapegrad/tapegrad.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

// Headers keep their folders under include/tapegrad, reachable as <tapegrad/...> only.
#include <tapegrad/autograd/anomaly.h>
#include <tapegrad/core/safetensors.h>
#include <tapegrad/nn/checkpoint.h>

// This project's own headers, with the same paths as tapegrad's (its folder is on the include
// path): tapegrad's headers must never pick these up, and they must not hide tapegrad's.
#include "autograd/tape.h"
#include "core/error.h"
#include "nn/module.h"
#include "ops/conv.h"

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

std::shared_ptr<tg::nn::Sequential> make_model() {
  using namespace tg;
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Conv2d>(
      nn::Conv2dOptions{.in_channels = 2, .out_channels = 4, .kernel_size = 3, .padding = {1}}));
  m->add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 2, .num_channels = 4}));
  m->add(std::make_shared<nn::ReLU>());
  m->add(std::make_shared<nn::MeanPool>());
  m->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 3}));
  return m;
}

}  // namespace

int main() {
  check(consumer::core_error_h_marker() + consumer::nn_module_h_marker() + consumer::ops_conv_h_marker() +
                consumer::autograd_tape_h_marker() ==
            4,
        "the project's own core/, nn/, ops/, autograd/ headers coexist with tapegrad's");
  using namespace tg;
  try {
    manual_seed(0);
    auto model = make_model();
    nn::Adam opt(model->parameters(), {.lr = 0.05});
    Tensor x = randn({6, 2, 7, 9});
    Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2}, {6});
    double first = 0, last = 0;
    for (int step = 0; step < 8; ++step) {
      Tape tape;
      Tensor loss = cross_entropy((*model)(x), y);
      if (step == 0) first = loss.item();
      last = loss.item();
      tape.backward(loss);
      opt.step();
      opt.zero_grad();
    }
    check(last < first, "training lowers the loss");

    const std::string path =
        (std::filesystem::temp_directory_path() / ("tapegrad_consumer_" + std::to_string(::getpid()) + ".safetensors"))
            .string();
    save(*model, opt, path);
    auto copy = make_model();
    nn::Adam copy_opt(copy->parameters(), {.lr = 0.05});
    load(*copy, copy_opt, path);
    std::filesystem::remove(path);
    check(mse_loss((*model)(x), (*copy)(x)).item() == 0.0, "a checkpoint restores the model");
    check(copy_opt.step_count() == 8, "a checkpoint restores the optimizer");

    bool threw = false;
    try {
      DetectAnomalyGuard anomaly;
      Tape tape;
      div(x.clone().requires_grad_(), zeros(x.shape()));
    } catch (const Error& e) {
      threw = std::string(e.what()).find("anomaly: forward of 'div'") != std::string::npos;
    }
    check(threw, "anomaly mode names the op");

    threw = false;
    try {
      matmul(randn({2, 3}), randn({4, 5}));
    } catch (const Error&) {
      threw = true;
    }
    check(threw, "invalid shapes raise tg::Error");

    std::printf("built with CUDA: %s, GPUs visible: %d\n", TG_CUDA ? "yes" : "no", cuda_device_count());
    if (cuda_available()) {
      Tensor a = randn({5, 7}), b = randn({7, 3});
      double err = mse_loss(matmul(a.cuda(), b.cuda()).cpu(), matmul(a, b)).item();
      check(err < 1e-10, "a matmul on the GPU matches the CPU");
    }
  } catch (const std::exception& e) {
    std::printf("FAIL unexpected exception: %s\n", e.what());
    return 1;
  }
  std::printf("install consumer: %s\n", failures == 0 ? "all checks passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
