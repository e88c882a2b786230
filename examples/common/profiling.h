// --profile and --trace PATH for the examples: run training under a tg::Profiler, print its
// table at the end and write a Chrome/Perfetto trace (--trace PATH, else profile.json in the
// current directory). Nothing is profiled, and no file written, unless one of them is given.
// Recording starts after --profile-skip training steps (default 1): a first step's one-time
// costs (kernels loaded on first launch, the memory pool growing) would otherwise be charged
// to whichever op met them first.
#pragma once
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "common/args.h"
#include "core/profiler.h"

namespace ex {

class ExampleProfiler {
 public:
  // Reads --profile (a switch: list "profile" among Args' switches) and --trace PATH.
  explicit ExampleProfiler(Args& args)
      : trace_(args.get("trace", "")), skip_(args.get_nonnegative_int("profile-skip", 1)) {
    on_ = args.has("profile") || !trace_.empty();
    if (on_ && trace_.empty()) trace_ = "profile.json";
  }
  static const char* usage() { return "[--profile] [--trace PATH] [--profile-skip STEPS (default 1)]"; }
  bool on() const { return on_; }

  // Call before each training step with the number of steps done: recording starts once
  // that reaches --profile-skip.
  void before_step(int64_t steps_done) {
    if (on_ && !profiler_ && steps_done >= skip_) profiler_.emplace();
  }
  // Stops recording, prints the table, writes the trace.
  void finish() {
    if (!profiler_) {
      if (on_) std::printf("\nprofile: nothing recorded (--profile-skip %lld: no step after it)\n",
                           static_cast<long long>(skip_));
      return;
    }
    profiler_->stop();
    std::printf("\nprofile (device time per op; %% roof: share of the roofline bound reached):\n");
    std::fflush(stdout);
    profiler_->report(std::cout);
    profiler_->write_trace(trace_);
    std::printf("wrote %s (open in https://ui.perfetto.dev or chrome://tracing)\n", trace_.c_str());
    profiler_.reset();
  }

 private:
  bool on_ = false;
  std::string trace_;
  int64_t skip_;
  std::optional<tg::Profiler> profiler_;
};

}  // namespace ex
