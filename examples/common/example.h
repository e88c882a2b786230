// What the workload examples share: their command-line options and start-up, a per-phase
// step timer, the progress and summary lines, and the pass/fail line of a reference check.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/host.h"
#include "core/device.h"
#include "core/tensor.h"
#include "core/precision.h"

namespace ex {

struct ExampleOptions {
  tg::Device device = tg::Device::cpu();
  bool small = true;          // tiny batch/spatial sizes; always on the CPU
  int64_t steps = 5;          // training steps
  std::string optim = "sgd";  // sgd | adam
  std::optional<double> lr;   // unset: the workload's default for the optimizer
  tg::Precision precision = tg::Precision::FP32;
  int64_t samples = 256;      // outputs checked against the f64 reference at full size
  uint64_t seed = 0;
};

// Reads --device cpu|cuda[:N] (default: cuda when a GPU is usable), --small, --steps,
// --optim sgd|adam, --lr, --precision fp32|tf32, --samples, --seed.
ExampleOptions parse_example_options(Args& args);
inline const char* kExampleUsage =
    "[--device cpu|cuda] [--small] [--steps N] [--optim sgd|adam] [--lr X] [--precision fp32|tf32] "
    "[--samples N] [--seed N]";

// The start of every workload example: `args` was built with the switch "small" (plus the
// program's own), and the program has already read its own options from it. Reads the
// common options, rejects anything unread (usage: kExampleUsage + `extra_usage`), then
// seeds the generator and sets the precision.
ExampleOptions start_example(Args& args, const std::string& extra_usage = "");

// "cpu, small, fp32": the end of each example's header line.
std::string run_summary(const ExampleOptions& o);

// --lr when given, otherwise the workload's default for the chosen optimizer.
double learning_rate(const ExampleOptions& o, double sgd_default, double adam_default);

// Relative error a check accepts: FP32 results must be FP32-accurate; TF32 rounds the
// operands of every product to 10 mantissa bits.
double tolerance(tg::Precision p);
const char* precision_name(tg::Precision p);

// Prints "<what>: rel error 3.1e-07, max abs 2.4e-06 over 256 elements  [ok]"; returns ok.
bool report_check(const std::string& what, const Comparison& c, double tolerance);

// The forward check of an output: y at the flat `indices` against the f64 values `want`,
// labelled "every output" at small size (where the indices are all of them) or "sampled".
bool check_output(const ExampleOptions& o, const tg::Tensor& y, const std::vector<int64_t>& indices,
                  const std::vector<double>& want);
// The forward check of A and B: y = conv2d(x, w) (stride 1, no padding, no bias) against
// the f64 definition at every output (small) or --samples of them.
bool check_conv2d_output(const ExampleOptions& o, const tg::Tensor& y, const tg::Tensor& x, const tg::Tensor& w,
                         bool channels_last);

// Wall-clock milliseconds between marks, with the device drained before each reading so
// that queued GPU work is counted where it was issued.
class PhaseTimer {
 public:
  explicit PhaseTimer(tg::Device d) : device_(d) {}
  void start();
  double lap();  // ms since the previous mark
 private:
  tg::Device device_;
  double last_ = 0;
};

struct StepTimes {
  double forward = 0, backward = 0, optimizer = 0;
  double total() const { return forward + backward + optimizer; }
};

// The per-step progress lines and the closing summary.
class TrainingLog {
 public:
  void step(int64_t index, double loss, const StepTimes& t);
  // Means over all steps but the first (which pays for one-time setup: allocator growth,
  // kernel selection), then peak device memory.
  void summary(tg::Device d) const;
  const std::vector<double>& losses() const { return losses_; }

 private:
  std::vector<double> losses_;
  std::vector<StepTimes> times_;
};

std::string format_bytes(double bytes);

// Runs `body`, turning an exception into a message and exit code 1.
int guarded_main(const std::function<int()>& body);

}  // namespace ex
