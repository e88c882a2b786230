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
#include "common/training.h"
#include "tapegrad/tapegrad.h"

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"small"});
    const std::string layout_name = args.get("layout", "nchw");
    const ex::ExampleOptions opt = ex::start_example(args, " [--layout nchw|nhwc]");
    if (layout_name != "nchw" && layout_name != "nhwc") throw std::invalid_argument("--layout must be nchw or nhwc");
    const bool channels_last = layout_name == "nhwc";

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
    std::printf("workload B: Conv2d(64 -> 128, 1x1, no bias), %s, on x %s, %s\n", layout_name.c_str(),
                x_shape.str().c_str(), ex::run_summary(opt).c_str());

    // ---- 2. forward, checked against the f64 definition --------------------------------
    tg::Tensor y = conv(x);  // (N, 128, H, W) or (N, H, W, 128)
    std::printf("forward: y %s (%lld elements)\n", y.shape().str().c_str(), static_cast<long long>(y.numel()));
    const bool ok = ex::check_conv2d_output(opt, y, x, conv.weight, channels_last);

    // ---- 3. training (see ex::train_conv2d for the learning rate) ----------------------
    const tg::Shape y_shape = y.shape();
    y = tg::Tensor();  // free the 8 GiB output before training
    ex::train_conv2d(opt, conv, x, y_shape);
    return ok ? 0 : 1;
  });
}
