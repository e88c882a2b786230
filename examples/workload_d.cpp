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
    const ex::ExampleOptions opt = ex::parse_example_options(args);
    args.finish(ex::kExampleUsage);
    tg::manual_seed(opt.seed);
    tg::set_precision(opt.precision);

    // ---- 1. the model and its input --------------------------------------------------
    const int64_t M = opt.small ? 32 : 2048, K = opt.small ? 4096 : 1048576;
    tg::nn::Linear linear({.in_features = K, .out_features = 1, .bias = false}, {.device = opt.device});
    tg::Tensor A = tg::randn({M, K}, {.device = opt.device});  // (M, K): each row is one sample
    std::printf("workload D: Linear(%lld -> 1, no bias) on A [%lld, %lld], %s, %s, %s\n", static_cast<long long>(K),
                static_cast<long long>(M), static_cast<long long>(K), opt.device.str().c_str(),
                opt.small ? "small" : "full size", ex::precision_name(opt.precision));

    // ---- 2. forward, checked against the f64 definition --------------------------------
    tg::Tensor y = linear(A);  // (M, 1)
    // Each checked output reads one row of A (4 MiB at full size) from the device.
    const auto rows = ex::sample_indices(M, opt.small ? M : opt.samples, opt.seed + 1);
    const auto want = ex::linear_forward_ref(A, linear.weight.to_vector<float>(), rows);
    std::printf("forward: y %s\n", y.shape().str().c_str());
    const bool ok = ex::report_check(opt.small ? "y vs f64 reference (every output)" : "y vs f64 reference (sampled)",
                                     ex::compare(ex::read_elements(y, rows), want), ex::tolerance(opt.precision));

    // ---- 3. training -------------------------------------------------------------------
    const tg::Tensor target = tg::randn(y.shape(), {.device = opt.device});
    // Least squares with a random Gaussian A: the Hessian 2 A^T A / M has its nonzero
    // eigenvalues near 2K/M, so SGD with lr = M / (4K) halves the residual every step.
    // Adam moves every weight by about lr at once, which shifts each output by about
    // lr * K / sqrt(M): lr = 0.1 sqrt(M) / K keeps that near 0.1.
    const double lr = opt.lr > 0                ? opt.lr
                      : opt.optim == "sgd"      ? double(M) / (4.0 * double(K))
                                                : 0.1 * std::sqrt(double(M)) / double(K);
    auto optimizer = ex::make_optimizer(opt.optim, linear.parameters(), lr);
    std::printf("training %lld steps: %s lr %g, MSE against a fixed random target %s\n",
                static_cast<long long>(opt.steps), opt.optim.c_str(), lr, target.shape().str().c_str());

    tg::reset_peak_memory(opt.device);
    ex::TrainingLog log;
    ex::PhaseTimer timer(opt.device);
    for (int64_t step = 1; step <= opt.steps; ++step) {
      ex::StepTimes t;
      timer.start();
      tg::Tape tape;
      tg::Tensor loss = tg::mse_loss(linear(A), target);
      t.forward = timer.lap();
      tape.backward(loss);  // A does not require grad: only w's gradient (one more pass over A)
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
