// Workload C: Conv3d(3 -> 24, k=3, pad 0, bias) -> GroupNorm(8 groups, 24 channels) ->
// mean over dims 1..4, on x (128, 3, 24, 32, 32): one scalar per sample, y (128).
//
//   workload_c                      # full size on the GPU
//   workload_c --device cpu         # small size: x (2, 3, 6, 8, 8)
//
// A trap worth seeing once. With GroupNorm's default init (gamma = 1, beta = 0) each group
// is normalized to mean 0, so the mean over every normalized value is exactly mean(beta) = 0
// whatever the input: the output does not depend on the conv at all, and the conv's
// gradient at step 1 is zero (up to rounding). Step 1 does move gamma (its gradient is the
// per-channel mean of the normalized values, which is not zero: only the per-group mean is),
// and once gamma differs between the channels of a group the output depends on the conv,
// so from step 2 on the conv learns. The program prints the conv's gradient norm at steps 1
// and 2 to show it. (Tests of C must therefore perturb gamma, or they test nothing.)
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/example.h"
#include "common/reference.h"
#include "common/training.h"
#include "tapegrad/tapegrad.h"

namespace {

// The host copy of a few samples of x (N, ...): the reference only recomputes those.
ex::HostTensor samples_of(const tg::Tensor& x, const std::vector<int64_t>& samples) {
  const int64_t per_sample = x.numel() / x.size(0);
  ex::HostTensor h;
  std::vector<int64_t> dims = x.shape().dims();
  dims[0] = static_cast<int64_t>(samples.size());
  h.shape = tg::Shape(dims);
  for (int64_t n : samples) {
    std::vector<float> part = ex::read_range(x, n * per_sample, per_sample);
    h.data.insert(h.data.end(), part.begin(), part.end());
  }
  return h;
}

// Compares a device tensor (N, ...) on the given samples with a reference over those samples.
ex::Comparison compare_samples(const tg::Tensor& t, const std::vector<int64_t>& samples,
                               const std::vector<double>& ref, int64_t max_count, uint64_t seed) {
  const int64_t per_sample = t.numel() / t.size(0);
  std::vector<int64_t> local = ex::sample_indices(static_cast<int64_t>(ref.size()), max_count, seed), device;
  for (int64_t i : local) device.push_back(samples[i / per_sample] * per_sample + i % per_sample);
  return ex::compare(ex::read_elements(t, device), ex::gather(ref, local));
}

}  // namespace

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"small"});
    const ex::ExampleOptions opt = ex::parse_example_options(args);
    args.finish(ex::kExampleUsage);
    tg::manual_seed(opt.seed);
    tg::set_precision(opt.precision);

    // ---- 1. the model and its input --------------------------------------------------
    const tg::Shape x_shape = opt.small ? tg::Shape{2, 3, 6, 8, 8} : tg::Shape{128, 3, 24, 32, 32};
    tg::nn::Conv3d conv({.in_channels = 3, .out_channels = 24, .kernel_size = {3, 3, 3}, .bias = true},
                        {.device = opt.device});
    tg::nn::GroupNorm norm({.num_groups = 8, .num_channels = 24}, {.device = opt.device});  // gamma = 1, beta = 0
    auto model = [&](const tg::Tensor& x) { return tg::mean(norm(conv(x)), {1, 2, 3, 4}); };  // (N)
    tg::Tensor x = tg::randn(x_shape, {.device = opt.device});  // (N, C, D, H, W)
    std::printf("workload C: Conv3d(3 -> 24, k=3, pad 0, bias) -> GroupNorm(8, 24) -> mean over dims 1..4 on x %s, "
                "%s, %s, %s\n",
                x_shape.str().c_str(), opt.device.str().c_str(), opt.small ? "small" : "full size",
                ex::precision_name(opt.precision));

    // ---- 2. forward, each stage checked against the f64 definition ------------------------
    tg::Tensor z = conv(x);       // (N, 24, D-2, H-2, W-2)
    tg::Tensor g = norm(z);       // same shape
    tg::Tensor y = tg::mean(g, {1, 2, 3, 4});  // (N)
    // The reference recomputes whole samples (GroupNorm needs every value of a group):
    // all of them at small size, the first, middle and last at full size.
    const int64_t N = x_shape[0];
    const std::vector<int64_t> samples =
        opt.small ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0, N / 2, N - 1};
    const ex::HostTensor xs = samples_of(x, samples);
    const ex::ConvGeometry geometry = ex::ConvGeometry::make(xs.shape, conv.weight.shape(), {1}, {0}, {1}, false);
    const auto ref = ex::conv_norm_mean_ref(geometry, xs, ex::HostTensor::of(conv.weight), conv.bias.to_vector<float>(),
                                            norm.weight.to_vector<float>(), norm.bias.to_vector<float>(),
                                            /*groups=*/8, /*eps=*/1e-5, /*dy=*/nullptr);
    const int64_t count = opt.small ? z.numel() : opt.samples;
    const double tol = ex::tolerance(opt.precision);
    std::printf("forward: z = conv(x) %s, g = group_norm(z), y = mean(g) %s\n", z.shape().str().c_str(),
                y.shape().str().c_str());
    bool ok = ex::report_check("z vs f64 reference", compare_samples(z, samples, ref.z, count, opt.seed + 1), tol);
    ok &= ex::report_check("g vs f64 reference", compare_samples(g, samples, ref.normalized, count, opt.seed + 2),
                           tol);
    // y is mean(beta) = 0 here, so a relative error means nothing: compare absolutely.
    const ex::Comparison yc = compare_samples(y, samples, ref.y, count, opt.seed + 3);
    ok &= yc.finite && yc.max_abs_error < 1e-5;
    std::printf("  %-52s max abs error %.2e (y is exactly mean(beta) = 0 here)  [%s]\n", "y vs f64 reference",
                yc.max_abs_error, yc.finite && yc.max_abs_error < 1e-5 ? "ok" : "FAILED");
    z = g = y = tg::Tensor();

    // ---- 3. training -------------------------------------------------------------------
    const tg::Tensor target = tg::randn({N}, {.device = opt.device});  // one scalar per sample
    std::vector<tg::Tensor> params = conv.parameters();
    for (const tg::Tensor& p : norm.parameters()) params.push_back(p);
    const double lr = opt.lr > 0 ? opt.lr : opt.optim == "sgd" ? 1.0 : 1e-2;
    auto optimizer = ex::make_optimizer(opt.optim, params, lr);
    std::printf("training %lld steps: %s lr %g, MSE against a fixed random target %s\n",
                static_cast<long long>(opt.steps), opt.optim.c_str(), lr, target.shape().str().c_str());
    std::printf("note: default init (gamma = 1, beta = 0) makes y = mean(beta) for any input, so the conv gets no\n"
                "      gradient at step 1; step 1 makes gamma uneven within each group, and from step 2 on it does.\n");

    tg::reset_peak_memory(opt.device);
    ex::TrainingLog log;
    ex::PhaseTimer timer(opt.device);
    for (int64_t step = 1; step <= opt.steps; ++step) {
      ex::StepTimes t;
      timer.start();
      tg::Tape tape;
      tg::Tensor loss = tg::mse_loss(model(x), target);
      t.forward = timer.lap();
      tape.backward(loss);
      t.backward = timer.lap();
      const double conv_grad = ex::grad_norm(conv.weight);  // read before the optimizer drops it
      timer.start();
      optimizer->step();
      optimizer->zero_grad();
      t.optimizer = timer.lap();
      log.step(step, loss.item(), t);
      if (step <= 2)
        std::printf("           conv.weight grad norm at step %lld: %.3e%s\n", static_cast<long long>(step), conv_grad,
                    step == 1 ? "  (zero up to rounding: gamma is still uniform)" : "  (gamma is uneven now)");
    }
    log.summary(opt.device);
    return ok ? 0 : 1;
  });
}
