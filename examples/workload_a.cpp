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
#include "common/training.h"
#include "tapegrad/tapegrad.h"

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"small"});
    const ex::ExampleOptions opt = ex::start_example(args);

    // ---- 1. the model and its input --------------------------------------------------
    const tg::Shape x_shape = opt.small ? tg::Shape{1, 64, 20, 36} : tg::Shape{8, 64, 512, 1024};
    tg::nn::Conv2d conv({.in_channels = 64, .out_channels = 128, .kernel_size = {3, 3}, .bias = false},
                        {.device = opt.device});
    tg::Tensor x = tg::randn(x_shape, {.device = opt.device});  // (N, C, H, W)
    std::printf("workload A: Conv2d(64 -> 128, 3x3, stride 1, pad 0, no bias) on x %s, %s\n",
                x_shape.str().c_str(), ex::run_summary(opt).c_str());

    // ---- 2. forward, checked against the f64 definition --------------------------------
    tg::Tensor y = conv(x);  // (N, 128, H - 2, W - 2)
    std::printf("forward: y %s\n", y.shape().str().c_str());
    const bool ok = ex::check_conv2d_output(opt, y, x, conv.weight, /*channels_last=*/false);

    // ---- 3. training (see ex::train_conv2d for the learning rate) ----------------------
    const tg::Shape y_shape = y.shape();
    y = tg::Tensor();  // free the 2 GiB output before training
    ex::train_conv2d(opt, conv, x, y_shape);
    return ok ? 0 : 1;
  });
}
