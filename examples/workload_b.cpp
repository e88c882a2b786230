// Workload B: a pointwise (1x1) convolution, Conv2d(64 -> 128, 1x1, no bias), on
// x (16, 64, 1024, 1024), in NCHW or channels-last NHWC layout. Its output holds exactly
// 2^31 floats (8 GiB): every index in the framework must be 64-bit, and the check below
// always includes the last element.
//
//   workload_b                          # full size on the GPU, NCHW
//   workload_b --layout nhwc            # channels-last: x (16, 1024, 1024, 64)
//   workload_b --device cpu             # small size (2, 64, 16, 24) on the CPU
//
// Steps: build, forward + check against the f64 definition, train (see workload_a.cpp).
#include <cstdio>
#include <stdexcept>

#include "common/example.h"
#include "common/reference.h"
#include "common/training.h"
#include "tapegrad/tapegrad.h"

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"small"});
    const ex::ExampleOptions opt = ex::parse_example_options(args);
    const std::string layout_name = args.get("layout", "nchw");
    args.finish(std::string(ex::kExampleUsage) + " [--layout nchw|nhwc]");
    if (layout_name != "nchw" && layout_name != "nhwc") throw std::invalid_argument("--layout must be nchw or nhwc");
    const bool channels_last = layout_name == "nhwc";
    tg::manual_seed(opt.seed);
    tg::set_precision(opt.precision);

    // ---- 1. the model and its input --------------------------------------------------
    const int64_t N = opt.small ? 2 : 16, H = opt.small ? 16 : 1024, W = opt.small ? 24 : 1024;
    // Layout is a parameter of the op, not of the tensor: the same layer reads (N, H, W, C)
    // when built with Layout::NHWC. The weight stays (K, C, 1, 1) either way.
    const tg::Shape x_shape = channels_last ? tg::Shape{N, H, W, 64} : tg::Shape{N, 64, H, W};
    tg::nn::Conv2d conv({.in_channels = 64,
                         .out_channels = 128,
                         .kernel_size = {1, 1},
                         .bias = false,
                         .layout = channels_last ? tg::Layout::NHWC : tg::Layout::NCHW},
                        {.device = opt.device});
    tg::Tensor x = tg::randn(x_shape, {.device = opt.device});
    std::printf("workload B: Conv2d(64 -> 128, 1x1, no bias), %s, on x %s, %s, %s, %s\n", layout_name.c_str(),
                x_shape.str().c_str(), opt.device.str().c_str(), opt.small ? "small" : "full size",
                ex::precision_name(opt.precision));

    // ---- 2. forward, checked against the f64 definition --------------------------------
    tg::Tensor y = conv(x);  // (N, 128, H, W) or (N, H, W, 128)
    const ex::ConvGeometry geometry =
        ex::ConvGeometry::make(x.shape(), conv.weight.shape(), {1}, {0}, {1}, channels_last);
    const auto indices = ex::sample_indices(y.numel(), opt.small ? y.numel() : opt.samples, opt.seed + 1);
    const auto want = ex::conv_forward_ref(geometry, ex::HostTensor::of(x), ex::HostTensor::of(conv.weight),
                                           /*bias=*/{}, indices);
    std::printf("forward: y %s (%lld elements)\n", y.shape().str().c_str(), static_cast<long long>(y.numel()));
    const bool ok = ex::report_check(opt.small ? "y vs f64 reference (every output)" : "y vs f64 reference (sampled)",
                                     ex::compare(ex::read_elements(y, indices), want), ex::tolerance(opt.precision));

    // ---- 3. training -------------------------------------------------------------------
    const tg::Tensor target = tg::randn(y.shape(), {.device = opt.device});
    y = tg::Tensor();  // free the 8 GiB output before training
    // Same reasoning as workload A: Hessian ~ (2 / out_channels) * I, so SGD takes a large lr.
    const double lr = opt.lr > 0 ? opt.lr : opt.optim == "sgd" ? 16.0 : 2e-3;
    auto optimizer = ex::make_optimizer(opt.optim, conv.parameters(), lr);
    std::printf("training %lld steps: %s lr %g, MSE against a fixed random target %s\n",
                static_cast<long long>(opt.steps), opt.optim.c_str(), lr, target.shape().str().c_str());

    tg::reset_peak_memory(opt.device);
    ex::TrainingLog log;
    ex::PhaseTimer timer(opt.device);
    for (int64_t step = 1; step <= opt.steps; ++step) {
      ex::StepTimes t;
      timer.start();
      tg::Tape tape;
      tg::Tensor loss = tg::mse_loss(conv(x), target);
      t.forward = timer.lap();
      tape.backward(loss);
      t.backward = timer.lap();
      optimizer->step();
      optimizer->zero_grad();
      t.optimizer = timer.lap();
      log.step(step, loss.item(), t);
    }
    log.summary(opt.device);
    return ok ? 0 : 1;
  });
}
