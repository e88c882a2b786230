#include "zoo_model.h"

#include <cmath>
#include <sstream>
#include <string>

namespace zoo {
namespace {

std::shared_ptr<tg::nn::Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride, tg::TensorOptions t) {
  return std::make_shared<tg::nn::Conv2d>(tg::nn::Conv2dOptions{.in_channels = in,
                                                                .out_channels = out,
                                                                .kernel_size = {k, k},
                                                                .stride = {stride},
                                                                .padding = {k / 2},
                                                                .bias = false},  // a norm follows
                                          t);
}

std::shared_ptr<tg::nn::GroupNorm> norm(int64_t channels, tg::TensorOptions t) {
  return std::make_shared<tg::nn::GroupNorm>(tg::nn::GroupNormOptions{.num_groups = kGroups, .num_channels = channels},
                                             t);
}

}  // namespace

BasicBlock::BasicBlock(int64_t in, int64_t out, int64_t stride, tg::TensorOptions t) {
  conv1_ = conv(in, out, 3, stride, t);
  gn1_ = norm(out, t);
  conv2_ = conv(out, out, 3, 1, t);
  gn2_ = norm(out, t);
  register_module("conv1", conv1_);
  register_module("gn1", gn1_);
  register_module("conv2", conv2_);
  register_module("gn2", gn2_);
  if (stride != 1 || in != out) {
    downsample_ = std::make_shared<tg::nn::Sequential>();
    downsample_->add(conv(in, out, 1, stride, t));
    downsample_->add(norm(out, t));
    register_module("downsample", downsample_);
  }
}

tg::Tensor BasicBlock::forward(const tg::Tensor& x) {
  tg::Tensor y = (*gn2_)((*conv2_)(tg::relu((*gn1_)((*conv1_)(x)))));
  return tg::relu(tg::add(y, downsample_ ? (*downsample_)(x) : x));
}

ResNet18GN::ResNet18GN(tg::TensorOptions t) {
  conv1_ = conv(3, 64, 3, 1, t);
  gn1_ = norm(64, t);
  register_module("conv1", conv1_);
  register_module("gn1", gn1_);
  int64_t in = 64;
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int i = 0; i < 4; ++i) {
    layers_[i] = std::make_shared<tg::nn::Sequential>();
    layers_[i]->add(std::make_shared<BasicBlock>(in, widths[i], i == 0 ? 1 : 2, t));
    layers_[i]->add(std::make_shared<BasicBlock>(widths[i], widths[i], 1, t));
    register_module("layer" + std::to_string(i + 1), layers_[i]);
    in = widths[i];
  }
  fc_ = std::make_shared<tg::nn::Linear>(tg::nn::LinearOptions{.in_features = 512, .out_features = kClasses}, t);
  register_module("fc", fc_);
}

tg::Tensor ResNet18GN::forward(const tg::Tensor& x) {
  tg::Tensor h = tg::relu((*gn1_)((*conv1_)(x)));
  for (auto& layer : layers_) h = (*layer)(h);
  return (*fc_)(tg::nn::MeanPool()(h));
}

ModelRow::ModelRow(tg::Device d, int64_t batch, const std::string& prefix)
    : model({.device = d}), weights_path(prefix + ".weights.safetensors"), io_path(prefix + ".io.safetensors") {
  x = tg::randn({batch, 3, kImage, kImage}, {.device = d});
  std::vector<int64_t> l;
  for (int64_t i = 0; i < batch; ++i) l.push_back((7 * i + 3) % kClasses);
  labels = tg::from_vector(l, {batch}, {.dtype = tg::DType::i64, .device = d});
  dlogits_ = tg::randn({batch, kClasses}, {.device = d});
  rows_ = check_rows(batch, 1);
  tg::save(model, weights_path);
  tg::Tensor logits;
  {
    tg::PrecisionGuard fp32(tg::Precision::FP32);
    logits = model(x);
  }
  tg::safetensors::save_file({{"x", x}, {"labels", labels}, {"logits", logits}}, io_path);
}

void ModelRow::restore_weights() { tg::load(model, weights_path); }

ModelRow::Reference ModelRow::reference() const {
  ResNet18GN cpu({.dtype = tg::DType::f64});
  std::vector<tg::Tensor> dst = cpu.parameters();
  const std::vector<tg::Tensor> src = model.parameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i].detach().cpu().to(tg::DType::f64));
  Reference r;
  {
    tg::Tape tape;
    tg::Tensor y = cpu(rows_f64(x, rows_));
    tape.backward(y, rows_f64(dlogits_, rows_));
    r.logits = y.to_vector<double>();
  }
  for (const tg::Tensor& p : dst) r.grads.push_back(p.grad().to_vector<double>());
  return r;
}

Checks ModelRow::check() {
  if (!ref_) ref_ = reference();
  model.zero_grad();
  Checks c;
  tg::Tensor logits;
  {
    tg::Tape tape;
    logits = model(x);
    tape.backward(logits, keep_rows(dlogits_, rows_));
  }
  c.forward.push_back({"logits", ex::compare(read_rows(logits, rows_), ref_->logits)});
  // The loss kernel against an f64 log-sum-exp of the logits it was given.
  const std::vector<double> z = logits.to_vector<double>();
  const std::vector<int64_t> l = labels.to_vector<int64_t>();
  double ce = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    const double* row = &z[i * kClasses];
    double m = row[0], s = 0;
    for (int64_t k = 1; k < kClasses; ++k) m = std::max(m, row[k]);
    for (int64_t k = 0; k < kClasses; ++k) s += std::exp(row[k] - m);
    ce += m + std::log(s) - row[l[i]];
  }
  ce /= double(l.size());
  c.forward.push_back({"loss", ex::compare({tg::cross_entropy(logits.detach(), labels).item()}, {ce})});
  // The gradients as one vector (their worst tensor named, for diagnosis).
  const auto named = model.named_parameters();
  std::vector<double> got, want;
  std::string worst;
  double worst_err = -1;
  for (size_t i = 0; i < named.size(); ++i) {
    const std::vector<double> g = named[i].second.grad().to_vector<double>();
    const double err = ex::compare(g, ref_->grads[i]).rel_error;
    if (err > worst_err) worst_err = err, worst = named[i].first;
    got.insert(got.end(), g.begin(), g.end());
    want.insert(want.end(), ref_->grads[i].begin(), ref_->grads[i].end());
  }
  std::ostringstream what;
  what << "parameter grads (" << named.size() << " tensors; worst " << worst << ": " << worst_err << ")";
  c.backward.push_back({what.str(), ex::compare(got, want)});
  model.zero_grad();
  return c;
}

std::string ModelRow::shape() const {
  std::ostringstream os;
  os << "ResNet-18-style, GroupNorm(" << kGroups << "), x " << x.shape() << ", " << kClasses
     << " classes: forward, cross entropy, backward, SGD(lr " << kLr << ")";
  return os.str();
}

std::string ModelRow::json() const {
  std::ostringstream os;
  os << "{\"x\": [" << x.size(0) << ", 3, " << kImage << ", " << kImage << "], \"classes\": " << kClasses
     << ", \"groups\": " << kGroups << ", \"lr\": " << kLr << "}";
  return os.str();
}

}  // namespace zoo
