// Timing GPU work with CUDA events on the framework's stream: the events bracket exactly
// the work queued between start() and stop(), so untimed setup (a forward pass recorded on
// a tape before a timed backward) can run in the same repeat. Median of the repeats.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "core/cuda_context.h"

namespace bench {

class EventPair {
 public:
  explicit EventPair(cudaStream_t s) : stream_(s) {
    TG_CUDA_CHECK(cudaEventCreate(&start_));
    TG_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventPair() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  void start() { TG_CUDA_CHECK(cudaEventRecord(start_, stream_)); }
  void stop() { TG_CUDA_CHECK(cudaEventRecord(stop_, stream_)); }
  float elapsed_ms() {
    TG_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    TG_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_{}, stop_{};
};

struct Timing {
  double median_ms = 0, min_ms = 0;
  int repeats = 0;
  std::vector<double> in_order_ms;  // every repeat, in the order run (tg_bench --verbose prints them)
};

// Runs `run` warmup + repeats times; `run` calls start() and stop() around what it times.
// idle_ms > 0 leaves the GPU idle that long before each timed repeat. Back to back, A's and B's
// kernels drive this H200 into its software power cap within ~40-70 ms and run 5-13% slower
// from then on (bench/journal/notes_conv1x1.md, round 6); with idle gaps every repeat runs as the first.
inline Timing measure(cudaStream_t stream, int warmup, int repeats, const std::function<void(EventPair&)>& run,
                      int idle_ms = 0) {
  EventPair events(stream);
  for (int i = 0; i < warmup; ++i) {
    run(events);
    events.elapsed_ms();
  }
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    if (idle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));  // the last repeat has synced
    run(events);
    ms.push_back(events.elapsed_ms());
  }
  Timing t;
  t.in_order_ms = ms;
  std::sort(ms.begin(), ms.end());
  t.repeats = repeats;
  t.min_ms = ms.front();
  t.median_ms = repeats % 2 ? ms[repeats / 2] : 0.5 * (ms[repeats / 2 - 1] + ms[repeats / 2]);
  return t;
}

}  // namespace bench
