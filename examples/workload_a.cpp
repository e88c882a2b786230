// Workload A: a 3x3 convolution, Conv2d(64 -> 128, 3x3, stride 1, pad 0, no bias),
// on x (8, 64, 512, 1024) NCHW: 4.4 TFLOP-scale work per training step at full size.
//
//   workload_a                      # full size on the GPU (small on a machine without one)
//   workload_a --device cpu         # small size (1, 64, 20, 36) on the CPU
//   workload_a --steps 10 --optim adam --precision tf32
//
// What it does:
//   1. builds the layer and a random input (full size, or --small / on the CPU),
//   2. runs the forward pass and checks it against an f64 reference computed from the
//      definition of convolution (every output at small size, sampled ones at full size),
//   3. trains for --steps steps: MSE against a fixed random target of the output's shape,
//      one line per step, then the mean time of each phase and the peak GPU memory.
#include <cstdio>

#include "common/example.h"
#include "common/reference.h"
#include "common/training.h"
#include "tapegrad/tapegrad.h"

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"small"});
    const ex::ExampleOptions opt = ex::parse_example_options(args);
    args.finish(ex::kExampleUsage);
    tg::manual_seed(opt.seed);
    tg::set_precision(opt.precision);

    // ---- 1. the model and its input --------------------------------------------------
    const tg::Shape x_shape = opt.small ? tg::Shape{1, 64, 20, 36} : tg::Shape{8, 64, 512, 1024};
    tg::nn::Conv2d conv({.in_channels = 64, .out_channels = 128, .kernel_size = {3, 3}, .bias = false},
                        {.device = opt.device});
    tg::Tensor x = tg::randn(x_shape, {.device = opt.device});  // (N, C, H, W)
    std::printf("workload A: Conv2d(64 -> 128, 3x3, stride 1, pad 0, no bias) on x %s, %s, %s, %s\n",
                x_shape.str().c_str(), opt.device.str().c_str(), opt.small ? "small" : "full size",
                ex::precision_name(opt.precision));

    // ---- 2. forward, checked against the f64 definition --------------------------------
    tg::Tensor y = conv(x);  // (N, 128, H - 2, W - 2)
    const ex::ConvGeometry geometry =
        ex::ConvGeometry::make(x.shape(), conv.weight.shape(), {1}, {0}, {1}, /*channels_last=*/false);
    const auto indices = ex::sample_indices(y.numel(), opt.small ? y.numel() : opt.samples, opt.seed + 1);
    const auto want = ex::conv_forward_ref(geometry, ex::HostTensor::of(x), ex::HostTensor::of(conv.weight),
                                           /*bias=*/{}, indices);
    std::printf("forward: y %s\n", y.shape().str().c_str());
    const bool ok = ex::report_check(opt.small ? "y vs f64 reference (every output)" : "y vs f64 reference (sampled)",
                                     ex::compare(ex::read_elements(y, indices), want), ex::tolerance(opt.precision));

    // ---- 3. training -------------------------------------------------------------------
    const tg::Tensor target = tg::randn(y.shape(), {.device = opt.device});
    y = tg::Tensor();  // free the 2 GiB output before training
    // The loss is quadratic in the weight with Hessian ~ (2 / out_channels) * I for unit-variance
    // inputs, so plain SGD takes a large step: lr = 16 removes about a quarter of the error per step.
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
      tg::Tape tape;  // records this step's ops; freed (with what it saved) at the end of the step
      tg::Tensor loss = tg::mse_loss(conv(x), target);
      t.forward = timer.lap();
      tape.backward(loss);  // fills conv.weight.grad()
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
