#include "autograd/anomaly.h"

#include <atomic>
#include <cmath>
#include <sstream>

namespace tg {
namespace {

std::atomic<bool> g_detect_anomaly{false};

template <class T>
int64_t scan(const T* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return -1;
}

// " (element 4 is inf)": where to look, and which of the two it is.
std::string offender(const Tensor& t, int64_t index) {
  const double v = t.to_vector<double>()[static_cast<size_t>(index)];  // only on the error path
  std::ostringstream os;
  os << " (element " << index << " is " << (std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf") << ")";
  return os.str();
}

}  // namespace

void set_detect_anomaly(bool on) { g_detect_anomaly.store(on, std::memory_order_relaxed); }
bool detect_anomaly() { return g_detect_anomaly.load(std::memory_order_relaxed); }

DetectAnomalyGuard::DetectAnomalyGuard(bool on) : previous_(detect_anomaly()) { set_detect_anomaly(on); }
DetectAnomalyGuard::~DetectAnomalyGuard() { set_detect_anomaly(previous_); }

int64_t first_non_finite(const Tensor& t) {
  if (!t.defined() || !(is_floating(t.dtype()) || is_half(t.dtype())) || t.numel() == 0) return -1;
  // bf16 / f16 (Autocast's products, and their gradients): every half value, inf and NaN
  // included, is exact in f32.
  if (is_half(t.dtype())) {
    std::vector<float> host = t.to_vector<float>();
    return scan(host.data(), t.numel());
  }
  if (t.device().is_cpu()) {
    return t.dtype() == DType::f32 ? scan(t.data<float>(), t.numel()) : scan(t.data<double>(), t.numel());
  }
  // A debug mode: the plain host copy is the simplest correct scan.
  if (t.dtype() == DType::f32) {
    std::vector<float> host = t.to_vector<float>();
    return scan(host.data(), t.numel());
  }
  std::vector<double> host = t.to_vector<double>();
  return scan(host.data(), t.numel());
}

void check_forward_anomaly(const std::string& op, const std::vector<Tensor>& inputs,
                           const std::vector<Tensor>& outputs, uint64_t tape_id) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    if (!in.defined() || (!in.is_leaf() && in.producer_tape() == tape_id)) continue;
    int64_t bad = first_non_finite(in);
    TG_CHECK(bad < 0, "anomaly: ", in.is_leaf() ? "leaf input " : "input ", i, " of '", op, "' ", describe(in),
             " already held NaN/Inf", offender(in, bad), "; it is an input, not the output of an op on this tape (",
             in.is_leaf() ? "data, a parameter or a result computed outside the tape" : "it was recorded on another tape",
             "): the NaN/Inf came from outside, not from '", op, "'");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    int64_t bad = first_non_finite(outputs[i]);
    TG_CHECK(bad < 0, "anomaly: forward of '", op, "' produced NaN/Inf in output ", i, " ", describe(outputs[i]),
             offender(outputs[i], bad));
  }
}

void check_backward_anomaly(const std::string& op, std::size_t input_index, const Tensor& grad) {
  int64_t bad = first_non_finite(grad);
  TG_CHECK(bad < 0, "anomaly: backward of '", op, "' produced NaN/Inf in the gradient of input ", input_index, " ",
           describe(grad), offender(grad, bad));
}

}  // namespace tg
