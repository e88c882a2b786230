// Timing work on a device. GPU work is asynchronous: a host clock read around an op measures
// the launch, not the kernel, and events recorded on the default stream do not bracket
// tapegrad's work, which runs on tapegrad's own stream per device (core/cuda_context.h).
// GpuTimer records CUDA events on that stream, so it measures exactly what tapegrad queued
// between start() and stop():
//
//   tg::GpuTimer timer(tg::Device::cuda());
//   timer.start();
//   tg::Tensor y = tg::conv2d(x, w, {}, {});
//   timer.stop();
//   double ms = timer.elapsed_ms();   // waits for stop's event only
//
// On the CPU, ops run synchronously and the timer reads the steady clock. In a build without
// CUDA, a timer for a GPU throws tg::UnsupportedError. To wait for all queued work of a
// device instead (e.g. before reading a host clock), call tg::synchronize(device)
// (core/device.h).
#pragma once
#include <chrono>

#include "device.h"

namespace tg {

class GpuTimer {
 public:
  // Checks the device (tg::Error if it does not exist here) and creates the events.
  explicit GpuTimer(Device device = Device::cuda());
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  // Record an event on the device's tapegrad stream (CPU: read the clock).
  void start();
  void stop();
  // Milliseconds between start() and stop(); waits for stop's event to complete.
  // Throws tg::Error unless start() and then stop() were called.
  double elapsed_ms();

  Device device() const { return device_; }

 private:
  Device device_;
  void* start_event_ = nullptr;  // cudaEvent_t, kept opaque so this header needs no CUDA
  void* stop_event_ = nullptr;
  std::chrono::steady_clock::time_point cpu_start_, cpu_stop_;
  bool started_ = false, stopped_ = false;
};

namespace cuda {
using Timer = GpuTimer;  // the name a libtorch/CUDA user looks for first
}

}  // namespace tg
