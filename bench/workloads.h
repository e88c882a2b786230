// The benchmark's view of workloads A-D: the model, its inputs, the f64 checks of each pass
// (through the examples' references) and the work each pass does.
//
// Cost model: flops are those of the convolutions / products (GroupNorm and the loss are
// counted roughly where they matter, in C); bytes are the unfused traffic floor: every op
// reads its inputs and writes its outputs once, in f32.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/host.h"
#include "common/reference.h"
#include "tapegrad/tapegrad.h"

namespace bench {

enum class Pass { forward, backward, step };
inline const char* pass_name(Pass p) { return p == Pass::forward ? "forward" : p == Pass::backward ? "backward" : "step"; }

struct Cost {
  double flops = 0, bytes = 0;
};

struct NamedCheck {
  std::string what;
  ex::Comparison result;
};

class Workload {
 public:
  virtual ~Workload() = default;
  std::string name, layout = "nchw", description;
  tg::Tensor x, target, dy;  // input, MSE target (step), upstream gradient (backward)

  virtual tg::Tensor forward(const tg::Tensor& x) = 0;
  virtual std::vector<tg::Tensor> parameters() = 0;
  virtual Cost cost(Pass p) const = 0;
  // Sampled checks of an output, and of the gradients left by tape.backward(y, dy).
  virtual std::vector<NamedCheck> check_forward(const tg::Tensor& y) = 0;
  virtual std::vector<NamedCheck> check_backward(const tg::Tensor& dx) = 0;
  // Called when the parameters change (an optimizer step): cached references are stale.
  virtual void parameters_changed() {}
};

constexpr int64_t kSamples = 256;      // sampled outputs / input-gradient elements per check
constexpr int64_t kWeightSamples = 48; // weight-gradient elements (each a sum over the batch)

// ---- A and B: a 2-D convolution without bias ------------------------------------------------
class ConvWorkload : public Workload {
 public:
  ConvWorkload(const std::string& id, tg::Shape x_shape, int64_t k, bool channels_last, tg::Device d)
      : conv_({.in_channels = 64,
               .out_channels = 128,
               .kernel_size = {k, k},
               .bias = false,
               .layout = channels_last ? tg::Layout::NHWC : tg::Layout::NCHW},
              {.device = d}) {
    name = id;
    layout = channels_last ? "nhwc" : "nchw";
    x = tg::randn(x_shape, {.device = d});
    geometry_ = ex::ConvGeometry::make(x_shape, conv_.weight.shape(), {1}, {0}, {1}, channels_last);
    target = tg::randn(geometry_.y_shape(), {.device = d});
    dy = tg::randn(geometry_.y_shape(), {.device = d});
    description = "Conv2d(64->128, " + std::to_string(k) + "x" + std::to_string(k) + ", no bias) x " + x_shape.str();
  }
  tg::Tensor forward(const tg::Tensor& in) override { return conv_(in); }
  std::vector<tg::Tensor> parameters() override { return conv_.parameters(); }

  Cost cost(Pass p) const override {
    const double macs = geometry_.macs(), xb = 4.0 * x.numel(), yb = 4.0 * target.numel(),
                 wb = 4.0 * conv_.weight.numel();
    if (p == Pass::forward) return {2 * macs, xb + wb + yb};
    if (p == Pass::backward) return {4 * macs, yb + xb + wb + xb + wb};  // dx and dw from dy
    // forward, loss (reads y and target, writes dy), dw (reads dy and x), SGD (reads w and g, writes w)
    return {4 * macs, (xb + wb + yb) + 3 * yb + (yb + xb + wb) + 3 * wb};
  }

  std::vector<NamedCheck> check_forward(const tg::Tensor& y) override {
    auto idx = ex::sample_indices(y.numel(), kSamples, 11);
    auto want = ex::conv_forward_ref(geometry_, host_x(), ex::HostTensor::of(conv_.weight), {}, idx);
    return {{"y", ex::compare(ex::read_elements(y, idx), want)}};
  }

  std::vector<NamedCheck> check_backward(const tg::Tensor& dx) override {
    const ex::HostTensor w = ex::HostTensor::of(conv_.weight);
    if (!host_dy_) host_dy_ = ex::HostTensor::of(dy);
    auto xi = ex::sample_indices(dx.numel(), kSamples, 12);
    auto wi = ex::sample_indices(conv_.weight.numel(), kWeightSamples, 13);
    return {{"dx", ex::compare(ex::read_elements(dx, xi), ex::conv_input_grad_ref(geometry_, *host_dy_, w, xi))},
            {"dw", ex::compare(ex::read_elements(conv_.weight.grad(), wi),
                               ex::conv_weight_grad_ref(geometry_, host_x(), *host_dy_, wi))}};
  }

 private:
  const ex::HostTensor& host_x() {
    if (!host_x_) host_x_ = ex::HostTensor::of(x);  // once per workload: 1 GiB (A) or 4 GiB (B)
    return *host_x_;
  }
  tg::nn::Conv2d conv_;
  ex::ConvGeometry geometry_;
  std::optional<ex::HostTensor> host_x_, host_dy_;
};

// ---- C: Conv3d -> GroupNorm -> mean over dims 1..4 --------------------------------------------
class ConvNormMeanWorkload : public Workload {
 public:
  ConvNormMeanWorkload(tg::Shape x_shape, tg::Device d)
      : conv_({.in_channels = 3, .out_channels = 24, .kernel_size = {3, 3, 3}, .bias = true}, {.device = d}),
        norm_({.num_groups = 8, .num_channels = 24}, {.device = d}) {
    name = "C";
    description = "Conv3d(3->24, k3, bias) -> GroupNorm(8, 24) -> mean x " + x_shape.str();
    // Default gamma = 1, beta = 0 make y = mean(beta) for every input, which checks nothing:
    // the benchmark perturbs them (timing does not depend on their values).
    norm_.weight.copy_(tg::uniform({24}, 0.5, 1.5, {.device = d}));
    norm_.bias.copy_(tg::uniform({24}, -0.5, 0.5, {.device = d}));
    x = tg::randn(x_shape, {.device = d});
    target = tg::randn({x_shape[0]}, {.device = d});
    dy = tg::randn({x_shape[0]}, {.device = d});
    geometry_ = ex::ConvGeometry::make(x_shape, conv_.weight.shape(), {1}, {0}, {1}, false);
  }
  tg::Tensor forward(const tg::Tensor& in) override { return tg::mean(norm_(conv_(in)), {1, 2, 3, 4}); }
  std::vector<tg::Tensor> parameters() override {
    auto p = conv_.parameters();
    for (const tg::Tensor& t : norm_.parameters()) p.push_back(t);
    return p;
  }
  Cost cost(Pass p) const override {
    const double macs = geometry_.macs(), z = double(geometry_.N) * 24 * geometry_.out_positions();
    const double xb = 4.0 * x.numel(), zb = 4.0 * z;
    // forward: conv (x -> z), GroupNorm (reads z twice: statistics, then normalize; writes g), mean (reads g)
    const Cost fwd{2 * macs + 10 * z, xb + zb + 3 * zb + zb};
    // backward: mean (writes dg), GroupNorm (reads dg and z twice, writes dz), conv (reads dz and x
    // for dw, dz for dx, writes dx)
    const Cost bwd{4 * macs + 15 * z, zb + 5 * zb + 2 * zb + 2 * xb};
    if (p == Pass::forward) return fwd;
    if (p == Pass::backward) return bwd;
    return {fwd.flops + bwd.flops - 2 * macs, fwd.bytes + bwd.bytes - zb - xb};  // no dx in a step
  }
  void parameters_changed() override { ref_.reset(); }

  std::vector<NamedCheck> check_forward(const tg::Tensor& y) override {
    const auto& r = reference();
    auto idx = ex::sample_indices(y.numel(), y.numel(), 0);
    return {{"y", ex::compare(ex::read_elements(y, idx), r.y)}};
  }
  std::vector<NamedCheck> check_backward(const tg::Tensor& dx) override {
    const auto& r = reference();
    auto xi = ex::sample_indices(dx.numel(), kSamples, 12);
    auto all = [](const tg::Tensor& t) { return ex::sample_indices(t.numel(), t.numel(), 0); };
    auto grad = [&](const tg::Tensor& p, const std::vector<double>& want) {
      return ex::compare(ex::read_elements(p.grad(), all(p)), want);
    };
    return {{"dx", ex::compare(ex::read_elements(dx, xi), ex::gather(r.dx, xi))},
            {"conv.weight grad", grad(conv_.weight, r.dw)},
            {"conv.bias grad", grad(conv_.bias, r.db)},
            {"gamma grad", grad(norm_.weight, r.dgamma)},
            {"beta grad", grad(norm_.bias, r.dbeta)}};
  }

 private:
  // The whole f64 forward and backward (about 15 billion multiply-adds over the host's cores),
  // computed once per parameter state.
  const ex::ConvNormMeanReference& reference() {
    if (!ref_) {
      if (!host_x_) host_x_ = ex::HostTensor::of(x);
      const std::vector<float> dyv = dy.to_vector<float>();
      ref_ = ex::conv_norm_mean_ref(geometry_, *host_x_, ex::HostTensor::of(conv_.weight),
                                    conv_.bias.to_vector<float>(), norm_.weight.to_vector<float>(),
                                    norm_.bias.to_vector<float>(), 8, 1e-5, &dyv);
    }
    return *ref_;
  }
  tg::nn::Conv3d conv_;
  tg::nn::GroupNorm norm_;
  ex::ConvGeometry geometry_;
  std::optional<ex::HostTensor> host_x_;
  std::optional<ex::ConvNormMeanReference> ref_;
};

// ---- D: Linear(1048576 -> 1, no bias) on A (2048, 1048576) --------------------------------------
class MatVecWorkload : public Workload {
 public:
  MatVecWorkload(int64_t M, int64_t K, tg::Device d)
      : kM(M), kK(K), linear_({.in_features = K, .out_features = 1, .bias = false}, {.device = d}) {
    name = "D";
    description = "Linear(" + std::to_string(K) + "->1, no bias) x A" + tg::Shape{M, K}.str();
    x = tg::randn({kM, kK}, {.device = d});
    target = tg::randn({kM, 1}, {.device = d});
    dy = tg::randn({kM, 1}, {.device = d});
  }
  tg::Tensor forward(const tg::Tensor& in) override { return linear_(in); }
  std::vector<tg::Tensor> parameters() override { return linear_.parameters(); }
  Cost cost(Pass p) const override {
    const double mk = double(kM) * kK;
    if (p == Pass::forward) return {2 * mk, 4 * (mk + kK + kM)};
    if (p == Pass::backward) return {4 * mk, 4 * (2 * mk + 2 * kK + kM)};  // dA = dy w (written), dw = dy^T A (A read)
    return {4 * mk, 4 * (2 * mk + 3 * kK + 4 * kM)};                         // A read twice: forward and dw
  }
  std::vector<NamedCheck> check_forward(const tg::Tensor& y) override {
    auto rows = ex::sample_indices(kM, kSamples, 11);
    return {{"y", ex::compare(ex::read_elements(y, rows),
                              ex::linear_forward_ref(x, linear_.weight.to_vector<float>(), rows))}};
  }
  std::vector<NamedCheck> check_backward(const tg::Tensor& dx) override {
    const std::vector<float> dyv = dy.to_vector<float>(), w = linear_.weight.to_vector<float>();
    auto ai = ex::sample_indices(dx.numel(), kSamples, 12);
    std::vector<double> want_da;
    for (int64_t i : ai) want_da.push_back(double(dyv[i / kK]) * w[i % kK]);
    // dw columns: two runs of 64 consecutive columns (one at each end) read 2048 short rows each.
    std::vector<int64_t> cols;
    for (int64_t j = 0; j < std::min<int64_t>(64, kK); ++j) cols.push_back(j);
    for (int64_t j = std::max<int64_t>(64, kK - 64); j < kK; ++j) cols.push_back(j);
    return {{"dA", ex::compare(ex::read_elements(dx, ai), want_da)},
            {"dw", ex::compare(ex::read_elements(linear_.weight.grad(), cols), ex::linear_weight_grad_ref(x, dyv, cols))}};
  }

 private:
  const int64_t kM, kK;  // A (kM, kK)
  tg::nn::Linear linear_;
};

// `small`: the examples' small sizes, for a quick run (and for checking the checks on a CPU).
inline std::unique_ptr<Workload> make_workload(const std::string& id, const std::string& layout, tg::Device d,
                                               bool small) {
  if (id == "A")
    return std::make_unique<ConvWorkload>("A", small ? tg::Shape{1, 64, 20, 36} : tg::Shape{8, 64, 512, 1024}, 3,
                                          false, d);
  if (id == "B") {
    const bool nhwc = layout == "nhwc";
    const int64_t N = small ? 2 : 16, H = small ? 16 : 1024, W = small ? 24 : 1024;
    return std::make_unique<ConvWorkload>("B", nhwc ? tg::Shape{N, H, W, 64} : tg::Shape{N, 64, H, W}, 1, nhwc, d);
  }
  if (id == "C")
    return std::make_unique<ConvNormMeanWorkload>(small ? tg::Shape{2, 3, 6, 8, 8} : tg::Shape{128, 3, 24, 32, 32}, d);
  TG_CHECK(id == "D", "unknown workload '", id, "' (A, B, C or D)");
  return small ? std::make_unique<MatVecWorkload>(32, 4096, d) : std::make_unique<MatVecWorkload>(2048, 1048576, d);
}

}  // namespace bench
