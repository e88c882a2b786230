#include "common/example.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <stdexcept>

#include "common/reference.h"
#include "core/random.h"
#include "core/storage.h"

namespace ex {

ExampleOptions parse_example_options(Args& args) {
  ExampleOptions o;
  o.device = tg::parse_device(args.get("device", tg::cuda_available() ? "cuda" : "cpu"));
  // Full size needs a GPU: B's output and D's matrix are 8 GiB each.
  o.small = args.has("small") || o.device.is_cpu();
  o.steps = args.get_nonnegative_int("steps", 5);
  o.optim = args.get("optim", "sgd");
  if (o.optim != "sgd" && o.optim != "adam") throw std::invalid_argument("--optim must be sgd or adam");
  if (args.has("lr")) o.lr = args.get_positive_double("lr", 0);
  std::string p = args.get("precision", "fp32");
  if (p != "fp32" && p != "tf32") throw std::invalid_argument("--precision must be fp32 or tf32");
  o.precision = p == "tf32" ? tg::Precision::TF32 : tg::Precision::FP32;
  o.samples = args.get_int_in("samples", 256, 2, Args::kMaxCount);
  o.seed = args.get_seed("seed", 0);
  return o;
}

ExampleOptions start_example(Args& args, const std::string& extra_usage) {
  const ExampleOptions o = parse_example_options(args);
  args.finish(std::string(kExampleUsage) + extra_usage);
  tg::manual_seed(o.seed);
  tg::set_precision(o.precision);
  return o;
}

std::string run_summary(const ExampleOptions& o) {
  return o.device.str() + ", " + (o.small ? "small" : "full size") + ", " + precision_name(o.precision);
}

double learning_rate(const ExampleOptions& o, double sgd_default, double adam_default) {
  return o.lr.value_or(o.optim == "sgd" ? sgd_default : adam_default);
}

double tolerance(tg::Precision p) { return p == tg::Precision::FP32 ? 1e-4 : 5e-3; }
const char* precision_name(tg::Precision p) { return p == tg::Precision::FP32 ? "fp32" : "tf32"; }

bool report_check(const std::string& what, const Comparison& c, double tol) {
  const bool ok = c.ok(tol);
  std::printf("  %-52s rel error %.2e, max abs %.2e over %lld elements  [%s]\n", what.c_str(), c.rel_error,
              c.max_abs_error, static_cast<long long>(c.count), ok ? "ok" : "FAILED");
  return ok;
}

bool check_output(const ExampleOptions& o, const tg::Tensor& y, const std::vector<int64_t>& indices,
                  const std::vector<double>& want) {
  return report_check(o.small ? "y vs f64 reference (every output)" : "y vs f64 reference (sampled)",
                      compare(read_elements(y, indices), want), tolerance(o.precision));
}

bool check_conv2d_output(const ExampleOptions& o, const tg::Tensor& y, const tg::Tensor& x, const tg::Tensor& w,
                         bool channels_last) {
  const ConvGeometry geometry = ConvGeometry::make(x.shape(), w.shape(), {1}, {0}, {1}, channels_last);
  const auto indices = sample_indices(y.numel(), o.small ? y.numel() : o.samples, o.seed + 1);
  const auto want = conv_forward_ref(geometry, HostTensor::of(x), HostTensor::of(w), /*bias=*/{}, indices);
  return check_output(o, y, indices, want);
}

namespace {
double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void PhaseTimer::start() {
  tg::synchronize(device_);
  last_ = now_ms();
}

double PhaseTimer::lap() {
  tg::synchronize(device_);
  double t = now_ms(), d = t - last_;
  last_ = t;
  return d;
}

void TrainingLog::step(int64_t index, double loss, const StepTimes& t) {
  losses_.push_back(loss);
  times_.push_back(t);
  std::printf("  step %3lld  loss %10.6f  forward %8.2f ms  backward %8.2f ms  optimizer %7.2f ms  total %8.2f ms\n",
              static_cast<long long>(index), loss, t.forward, t.backward, t.optimizer, t.total());
  std::fflush(stdout);
}

void TrainingLog::summary(tg::Device d) const {
  if (times_.empty()) return;
  const size_t first = times_.size() > 1 ? 1 : 0;
  StepTimes mean;
  for (size_t i = first; i < times_.size(); ++i) {
    mean.forward += times_[i].forward;
    mean.backward += times_[i].backward;
    mean.optimizer += times_[i].optimizer;
  }
  const double n = static_cast<double>(times_.size() - first);
  std::printf("summary (mean of steps %zu..%zu): forward %.2f ms, backward %.2f ms, optimizer %.2f ms, "
              "whole step %.2f ms\n",
              first + 1, times_.size(), mean.forward / n, mean.backward / n, mean.optimizer / n,
              mean.total() / n);
  if (d.is_cuda())
    std::printf("peak GPU memory: %s\n", format_bytes(static_cast<double>(tg::memory_stats(d).peak)).c_str());
}

std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1 << 30) std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1 << 30));
  else if (bytes >= 1 << 20) std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1 << 20));
  else std::snprintf(buf, sizeof buf, "%.0f KiB", bytes / 1024);
  return buf;
}

int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ex
