// Workload C: Conv3d(3 -> 24, k=3, pad 0, bias) -> GroupNorm(8 groups, 24 channels) ->
// mean over dims 1..4, on x (128, 3, 24, 32, 32): one scalar per sample, y (128).
//
//   workload_c                      # full size on the GPU, as the fused layer
//   workload_c --unfused            # the same layers as three ops: conv3d, group_norm, mean
//   workload_c --device cpu         # small size: x (2, 3, 6, 8, 8)
//
// The model is nn::Conv3dGroupNormMean: one op (conv3d_group_norm_mean, one tape entry) that
// needs only per-channel sums of the conv output, so on the GPU the (128, 24, 22, 30, 30)
// conv output never reaches memory. Its parameters are those of the layers it replaces
// (conv.weight, conv.bias, norm.weight, norm.bias); --unfused runs those same layers one op
// after the other, and additionally checks the conv and GroupNorm outputs stage by stage.
//
// A trap worth seeing once. With GroupNorm's default init (gamma = 1, beta = 0) each group
// is normalized to mean 0, so the mean over every normalized value is exactly mean(beta) = 0
// whatever the input: the output does not depend on the conv at all, and the conv's
// gradient at step 1 is zero (up to rounding). Step 1 does move gamma (its gradient is the
// per-channel mean of the normalized values, which is not zero: only the per-group mean is),
// and once gamma differs between the channels of a group the output depends on the conv,
// so from step 2 on the conv learns. The program prints the conv's gradient norm at steps 1
// and 2 to show it. For the same reason the forward check at default init tests nothing of
// the conv: it is repeated on a copy of the model with random gamma and beta.
#include <cstdio>

#include "common/example.h"
#include "common/reference.h"
#include "common/training.h"
#include "tapegrad/tapegrad.h"

namespace {

constexpr int64_t kGroups = 8;
constexpr double kEps = 1e-5;

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

// The f64 definition of the whole composition (conv, group norm, mean) on the host copy xs
// of some samples, with m's current parameters.
ex::ConvNormMeanReference reference(const ex::HostTensor& xs, tg::nn::Conv3dGroupNormMean& m) {
  const ex::ConvGeometry geometry = ex::ConvGeometry::make(xs.shape, m.conv->weight.shape(), {1}, {0}, {1}, false);
  return ex::conv_norm_mean_ref(geometry, xs, ex::HostTensor::of(m.conv->weight), m.conv->bias.to_vector<float>(),
                                m.norm->weight.to_vector<float>(), m.norm->bias.to_vector<float>(), kGroups, kEps,
                                /*dy=*/nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"small", "unfused"});
    const bool unfused = args.has("unfused");
    const ex::ExampleOptions opt = ex::start_example(args, " [--unfused]");

    // ---- 1. the model and its input --------------------------------------------------
    const tg::Shape x_shape = opt.small ? tg::Shape{2, 3, 6, 8, 8} : tg::Shape{128, 3, 24, 32, 32};
    const tg::nn::Conv3dGroupNormMeanOptions layers{
        .in_channels = 3, .out_channels = 24, .kernel_size = 3, .num_groups = kGroups, .eps = kEps};
    tg::nn::Conv3dGroupNormMean model(layers, {.device = opt.device});  // gamma = 1, beta = 0
    // x (N, C, D, H, W) -> (N): the fused op, or the layers it replaces one after the other.
    auto run = [unfused](tg::nn::Conv3dGroupNormMean& m, const tg::Tensor& in) {
      return unfused ? tg::mean((*m.norm)((*m.conv)(in)), {1, 2, 3, 4}) : m(in);
    };
    tg::Tensor x = tg::randn(x_shape, {.device = opt.device});  // (N, C, D, H, W)
    std::printf("workload C: Conv3d(3 -> 24, k=3, pad 0, bias) -> GroupNorm(8, 24) -> mean over dims 1..4 on x %s, "
                "%s, %s\n",
                x_shape.str().c_str(), unfused ? "unfused (three ops)" : "fused (one op)",
                ex::run_summary(opt).c_str());

    // ---- 2. forward, checked against the f64 definition of the whole composition ----------
    // The reference recomputes whole samples (GroupNorm needs every value of a group):
    // all of them at small size, 8 of them (the first and the last among them) at full size.
    const int64_t N = x_shape[0];
    const std::vector<int64_t> samples = ex::sample_indices(N, opt.small ? N : 8, opt.seed + 4);
    const ex::HostTensor xs = samples_of(x, samples);
    const ex::ConvNormMeanReference ref = reference(xs, model);
    const int64_t count = opt.small ? static_cast<int64_t>(ref.z.size()) : opt.samples;
    const double tol = ex::tolerance(opt.precision);
    bool ok = true;
    if (unfused) {  // the stages exist as tensors only here
      tg::Tensor z = (*model.conv)(x);  // (N, 24, D-2, H-2, W-2)
      tg::Tensor g = (*model.norm)(z);  // same shape
      std::printf("forward: z = conv(x) %s, g = group_norm(z), y = mean(g)\n", z.shape().str().c_str());
      ok &= ex::report_check("z vs f64 reference", compare_samples(z, samples, ref.z, count, opt.seed + 1), tol);
      ok &= ex::report_check("g vs f64 reference", compare_samples(g, samples, ref.normalized, count, opt.seed + 2),
                             tol);
    } else {
      std::printf("forward: y = conv3d_group_norm_mean(x, conv.weight, conv.bias, gamma, beta) (N)\n");
    }
    {
      // y is mean(beta) = 0 here, so a relative error means nothing: compare absolutely.
      const ex::Comparison c = compare_samples(run(model, x), samples, ref.y, count, opt.seed + 3);
      const bool y_ok = c.finite && c.max_abs_error < 1e-5;
      ok &= y_ok;
      std::printf("  %-52s max abs error %.2e (y is exactly mean(beta) = 0 here)  [%s]\n", "y vs f64 reference",
                  c.max_abs_error, y_ok ? "ok" : "FAILED");
    }
    {
      // The same conv with random gamma and beta: now y depends on the conv's output.
      tg::nn::Conv3dGroupNormMean probe(layers, {.device = opt.device});
      probe.conv->weight.copy_(model.conv->weight);
      probe.conv->bias.copy_(model.conv->bias);
      probe.norm->weight.copy_(tg::uniform({24}, 0.5, 1.5, {.device = opt.device}));
      probe.norm->bias.copy_(tg::uniform({24}, -0.5, 0.5, {.device = opt.device}));
      const ex::ConvNormMeanReference probe_ref = reference(xs, probe);
      ok &= ex::report_check("y vs f64 reference, random gamma and beta",
                             compare_samples(run(probe, x), samples, probe_ref.y, count, opt.seed + 3), tol);
    }

    // ---- 3. training -------------------------------------------------------------------
    double conv_grad = 0;
    ex::train_mse(
        opt,
        {.model = [&](const tg::Tensor& in) { return run(model, in); },
         .x = x,
         .target = tg::randn({N}, {.device = opt.device}),  // one scalar per sample
         .params = model.parameters(),                      // conv.weight, conv.bias, norm.weight, norm.bias
         .lr = ex::learning_rate(opt, 1.0, 1e-2),
         .note = "note: default init (gamma = 1, beta = 0) makes y = mean(beta) for any input, so the conv gets no\n"
                 "      gradient at step 1; step 1 makes gamma uneven within each group, and from step 2 on it does.",
         .after_backward = [&](int64_t) { conv_grad = ex::grad_norm(model.conv->weight); },
         .after_report =
             [&](int64_t step) {
               if (step <= 2)
                 std::printf("           conv.weight grad norm at step %lld: %.3e%s\n", static_cast<long long>(step),
                             conv_grad,
                             step == 1 ? "  (zero up to rounding: gamma is still uniform)" : "  (gamma is uneven now)");
             }});
    return ok ? 0 : 1;
  });
}
