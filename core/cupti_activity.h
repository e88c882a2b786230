// Device times for tg::Profiler from CUPTI's activity records (CUDA builds): the GPU stamps the
// start and end of every kernel, copy and memset it runs, and CUPTI hands the stamps over in
// buffers, so the profiler needs no CUDA events between the ops (two per op cost the GPU a
// little time each and add up over hundreds of ops per step). What a thread launches between
// push(id) and pop() carries `id` (CUPTI's external correlation ids), so an op's device time is
// the sum of its activities' durations.
//
// CUPTI is loaded at run time (dlopen of libcupti from the CUDA toolkit): where it is missing,
// refuses, or a tool is injected into the process (CUDA_INJECTION64_PATH: Nsight, the
// sanitizers), start() says so and the profiler falls back to events.
// Defined in CUDA builds only.
// One collection at a time (the profiler allows one active tg::Profiler).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tg::profile::cupti {

// Starts collecting kernels, copies and memsets on every GPU; false, with nothing enabled,
// where CUPTI cannot be loaded or refuses. Drops whatever an earlier collection left.
bool start();
// Tags the calling thread's launches until the matching pop() with `id` (not 0).
void push(uint64_t id);
void pop();

struct Span {
  double ms = 0;           // summed durations of the activities tagged with the id
  uint64_t first_ns = 0;   // the earliest activity's start, on CUPTI's clock (now_ns)
};
// Waits for the work of the GPUs `devices` (those the tagged ops ran on), then hands over (and
// forgets) the activities finished since the last call, summed per id. Untagged activities are
// dropped.
std::unordered_map<uint64_t, Span> collect(const std::vector<int>& devices);
// Stops collecting; what was not collected is dropped.
void stop();
// CUPTI's clock, the one its activity stamps use (0 when CUPTI is not loaded).
uint64_t now_ns();

}  // namespace tg::profile::cupti
