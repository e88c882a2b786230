// --profile and --trace PATH for the examples: run training under a tg::Profiler, print its
// table at the end and write a Chrome/Perfetto trace (--trace PATH, else profile.json in the
// current directory). Nothing is profiled, and no file written, unless one of them is given.
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
  explicit ExampleProfiler(Args& args) : trace_(args.get("trace", "")) {
    on_ = args.has("profile") || !trace_.empty();
    if (on_ && trace_.empty()) trace_ = "profile.json";
  }
  static const char* usage() { return "[--profile] [--trace PATH]"; }
  bool on() const { return on_; }

  void start() {
    if (on_) profiler_.emplace();
  }
  // Stops recording, prints the table, writes the trace.
  void finish() {
    if (!profiler_) return;
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
  std::optional<tg::Profiler> profiler_;
};

}  // namespace ex
