// The benchmark's view of workloads A-D: the model, its inputs, the f64 checks of each pass
// (through the examples' references) and the work each pass does.
//
// Cost model: flops are those of the convolutions / products (GroupNorm and the loss are
// counted roughly where they matter, in C); bytes are the traffic floor of the ops as the
// model runs them: every op reads its inputs and writes its outputs once, in f32. (C runs
// as one fused op, whose floor is reading x; its flops are the fused op's own, which
// recomputes the conv output in the backward pass.)
//
// Passes: forward; backward (the gradients a training step needs, plus the input gradient
// where that is the benchmark's custom: A, B, D -- see input_grad); backward_dx (C only: its
// backward with the input gradient as well); step (forward + MSE + backward + SGD, never
// with the input gradient: x is data).
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

enum class Pass { forward, backward, backward_dx, step };
inline const char* pass_name(Pass p) {
  switch (p) {
    case Pass::forward: return "forward";
    case Pass::backward: return "backward";
    case Pass::backward_dx: return "backward_dx";
    case Pass::step: return "step";
  }
  return "?";
}

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
  // Whether the workload has a row for this pass: backward_dx only where backward has no dx.
  virtual bool has_pass(Pass p) const { return p != Pass::backward_dx; }
  // Whether x requires grad in this pass. A, B, D: their backward rows time the input and
  // weight gradients together (B's conv tape entry then computes both in one call,
  // conv_backward_input_weight, which reads dy once); PyTorch's side does the same.
  virtual bool input_grad(Pass p) const { return p == Pass::backward; }
  // Sampled checks of an output, and of the gradients left by tape.backward(y, dy); dx is
  // undefined when x did not require grad.
  virtual std::vector<NamedCheck> check_forward(const tg::Tensor& y) = 0;
  virtual std::vector<NamedCheck> check_backward(const tg::Tensor& dx) = 0;
  // Called when the parameters change (an optimizer step): cached references are stale.
  virtual void parameters_changed() {}
  // Whether the workload has bf16 rows (under tg::Autocast): the convolutions A and B.
  virtual bool autocast_rows() const { return false; }
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
  bool autocast_rows() const override { return true; }

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

// ---- C: Conv3d -> GroupNorm -> mean over dims 1..4, as the fused layer ----------------------
class ConvNormMeanWorkload : public Workload {
 public:
  ConvNormMeanWorkload(tg::Shape x_shape, tg::Device d)
      : model_({.in_channels = 3, .out_channels = 24, .kernel_size = 3, .num_groups = 8}, {.device = d}) {
    name = "C";
    description = "Conv3dGroupNormMean (fused Conv3d(3->24, k3, bias) -> GroupNorm(8, 24) -> mean) x " +
                  x_shape.str();
    // Default gamma = 1, beta = 0 make y = mean(beta) for every input, which checks nothing:
    // the benchmark perturbs them (timing does not depend on their values).
    model_.norm->weight.copy_(tg::uniform({24}, 0.5, 1.5, {.device = d}));
    model_.norm->bias.copy_(tg::uniform({24}, -0.5, 0.5, {.device = d}));
    x = tg::randn(x_shape, {.device = d});
    target = tg::randn({x_shape[0]}, {.device = d});
    dy = tg::randn({x_shape[0]}, {.device = d});
    geometry_ = ex::ConvGeometry::make(x_shape, model_.conv->weight.shape(), {1}, {0}, {1}, false);
  }
  tg::Tensor forward(const tg::Tensor& in) override { return model_(in); }  // one op: conv3d_group_norm_mean
  std::vector<tg::Tensor> parameters() override { return model_.parameters(); }
  // backward: the gradients of a training step (w, b, gamma, beta); backward_dx adds x's.
  bool has_pass(Pass) const override { return true; }
  bool input_grad(Pass p) const override { return p == Pass::backward_dx; }

  Cost cost(Pass p) const override {
    const double macs = geometry_.macs(), z = double(geometry_.N) * 24 * geometry_.out_positions();
    const double xb = 4.0 * x.numel(), pb = 4.0 * (model_.conv->weight.numel() + 3 * 24), nb = 4.0 * geometry_.N;
    // forward: the conv, and per output element a sum and a sum of squares; reads x, writes (N)
    const Cost fwd{2 * macs + 3 * z, xb + pb + nb};
    // backward: the conv output recomputed (the fused op never stores it), dL/dy = A + B y,
    // dW; reads x and dy, writes the parameter gradients. With dx: a transposed conv more.
    const Cost bwd{4 * macs + 2 * z, xb + nb + pb};
    if (p == Pass::forward) return fwd;
    if (p == Pass::backward) return bwd;
    if (p == Pass::backward_dx) return {bwd.flops + 2 * macs, bwd.bytes + xb};
    return {fwd.flops + bwd.flops, fwd.bytes + bwd.bytes + 2 * pb};  // + loss (tiny) and SGD
  }
  void parameters_changed() override { ref_.reset(); }

  std::vector<NamedCheck> check_forward(const tg::Tensor& y) override {
    const auto& r = reference();
    auto idx = ex::sample_indices(y.numel(), y.numel(), 0);
    return {{"y", ex::compare(ex::read_elements(y, idx), r.y)}};
  }
  std::vector<NamedCheck> check_backward(const tg::Tensor& dx) override {
    const auto& r = reference();
    auto all = [](const tg::Tensor& t) { return ex::sample_indices(t.numel(), t.numel(), 0); };
    auto grad = [&](const tg::Tensor& p, const std::vector<double>& want) {
      return ex::compare(ex::read_elements(p.grad(), all(p)), want);
    };
    std::vector<NamedCheck> checks{{"conv.weight grad", grad(model_.conv->weight, r.dw)},
                                   {"conv.bias grad", grad(model_.conv->bias, r.db)},
                                   {"gamma grad", grad(model_.norm->weight, r.dgamma)},
                                   {"beta grad", grad(model_.norm->bias, r.dbeta)}};
    if (dx.defined()) {
      auto xi = ex::sample_indices(dx.numel(), kSamples, 12);
      checks.push_back({"dx", ex::compare(ex::read_elements(dx, xi), ex::gather(r.dx, xi))});
    }
    return checks;
  }

 private:
  // The whole f64 forward and backward of the unfused definition (conv, group norm, mean;
  // about 15 billion multiply-adds over the host's cores), computed once per parameter state.
  const ex::ConvNormMeanReference& reference() {
    if (!ref_) {
      if (!host_x_) host_x_ = ex::HostTensor::of(x);
      const std::vector<float> dyv = dy.to_vector<float>();
      ref_ = ex::conv_norm_mean_ref(geometry_, *host_x_, ex::HostTensor::of(model_.conv->weight),
                                    model_.conv->bias.to_vector<float>(), model_.norm->weight.to_vector<float>(),
                                    model_.norm->bias.to_vector<float>(), 8, 1e-5, &dyv);
    }
    return *ref_;
  }
  tg::nn::Conv3dGroupNormMean model_;  // conv.weight, conv.bias, norm.weight, norm.bias
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
            {"dw", ex::compare(ex::read_elements(linear_.weight.grad(), cols),
                               ex::linear_weight_grad_ref(x, dyv, cols))}};
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
