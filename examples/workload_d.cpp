// Workload D: a matrix-vector product as a layer: Linear(1048576 -> 1, no bias) applied to
// A (2048, 1048576), i.e. y = A w with A as the input data. A holds exactly 2^31 floats
// (8 GiB); the work is one pass over A (memory-bound), so the GPU's bandwidth is the limit.
//
//   workload_d                      # full size on the GPU
//   workload_d --device cpu         # small size: A (32, 4096)
//
// Steps: build, forward + check against the f64 definition, train (see workload_a.cpp).
#include <cmath>
#include <cstdio>

#include "common/example.h"
#include "common/reference.h"
#include "common/training.h"
#include "tapegrad/tapegrad.h"

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"small"});
    const ex::ExampleOptions opt = ex::start_example(args);

    // ---- 1. the model and its input --------------------------------------------------
    const int64_t M = opt.small ? 32 : 2048, K = opt.small ? 4096 : 1048576;
    tg::nn::Linear linear({.in_features = K, .out_features = 1, .bias = false}, {.device = opt.device});
    tg::Tensor A = tg::randn({M, K}, {.device = opt.device});  // (M, K): each row is one sample
    std::printf("workload D: Linear(%lld -> 1, no bias) on A [%lld, %lld], %s\n", static_cast<long long>(K),
                static_cast<long long>(M), static_cast<long long>(K), ex::run_summary(opt).c_str());

    // ---- 2. forward, checked against the f64 definition --------------------------------
    tg::Tensor y = linear(A);  // (M, 1)
    // Each checked output reads one row of A (4 MiB at full size) from the device.
    const auto rows = ex::sample_indices(M, opt.small ? M : opt.samples, opt.seed + 1);
    const auto want = ex::linear_forward_ref(A, linear.weight.to_vector<float>(), rows);
    std::printf("forward: y %s\n", y.shape().str().c_str());
    const bool ok = ex::check_output(opt, y, rows, want);  // y (M, 1): row i is element i

    // ---- 3. training -------------------------------------------------------------------
    // Least squares with a random Gaussian A: the Hessian 2 A^T A / M has its nonzero
    // eigenvalues near 2K/M, so SGD with lr = M / (4K) halves the residual every step.
    // Adam moves every weight by about lr at once, which shifts each output by about
    // lr * K / sqrt(M): lr = 0.1 sqrt(M) / K keeps that near 0.1.
    // A does not require grad: backward computes only w's gradient (one more pass over A).
    ex::train_mse(opt, {.model = [&](const tg::Tensor& in) { return linear(in); },
                        .x = A,
                        .target = tg::randn(y.shape(), {.device = opt.device}),
                        .params = linear.parameters(),
                        .lr = ex::learning_rate(opt, double(M) / (4.0 * double(K)),
                                                0.1 * std::sqrt(double(M)) / double(K))});
    return ok ? 0 : 1;
  });
}
