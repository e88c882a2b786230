#include "zoo_model.h"

#include <cmath>
#include <sstream>
#include <string>

namespace zoo {

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

tg::Tensor ModelRow::logits() {
  if (!bf16) return model(x);
  tg::Autocast ac(tg::DType::bf16);
  return model(x);
}

tg::Tensor ModelRow::loss() {
  if (!bf16) return tg::cross_entropy(model(x), labels);
  tg::Autocast ac(tg::DType::bf16);
  return tg::cross_entropy(model(x), labels);
}

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
    logits = this->logits();
    tg::Tensor seed = keep_rows(dlogits_, rows_);
    if (seed.dtype() != logits.dtype()) {
      tg::NoGradGuard no_grad;
      seed = seed.to(logits.dtype());
    }
    tape.backward(logits, seed);
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
  c.forward.push_back({"loss", ex::compare({tg::cross_entropy(logits.detach().to(tg::DType::f32), labels).item()}, {ce})});
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
