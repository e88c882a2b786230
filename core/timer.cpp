#include "core/timer.h"

#include "core/error.h"
#if TG_CUDA
#include "core/cuda_context.h"
#endif

namespace tg {

GpuTimer::GpuTimer(Device device) : device_(device) {
  if (device_.is_cpu()) return;
#if TG_CUDA
  check_device("GpuTimer", device_);
  cuda::set_device(device_.index);
  cudaEvent_t a = nullptr, b = nullptr;
  TG_CUDA_CHECK(cudaEventCreate(&a));
  if (cudaError_t e = cudaEventCreate(&b); e != cudaSuccess) {
    cudaEventDestroy(a);
    TG_CUDA_CHECK(e);
  }
  start_event_ = a;
  stop_event_ = b;
#else
  TG_FAIL_AS(UnsupportedError, "GpuTimer: ", device_, " needs a build with CUDA (this one has TG_CUDA=OFF)");
#endif
}

GpuTimer::~GpuTimer() {
#if TG_CUDA
  // Destructors never throw: a failure to destroy an event only leaks it.
  if (start_event_) cudaEventDestroy(static_cast<cudaEvent_t>(start_event_));
  if (stop_event_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_event_));
#endif
}

void GpuTimer::start() {
  stopped_ = false;
  started_ = true;
  if (device_.is_cpu()) {
    cpu_start_ = std::chrono::steady_clock::now();
    return;
  }
#if TG_CUDA
  cuda::set_device(device_.index);
  TG_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_event_), cuda::stream(device_.index)));
#endif
}

void GpuTimer::stop() {
  TG_CHECK(started_, "GpuTimer::stop: start() was not called");
  stopped_ = true;
  if (device_.is_cpu()) {
    cpu_stop_ = std::chrono::steady_clock::now();
    return;
  }
#if TG_CUDA
  cuda::set_device(device_.index);
  TG_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop_event_), cuda::stream(device_.index)));
#endif
}

double GpuTimer::elapsed_ms() {
  TG_CHECK(started_ && stopped_, "GpuTimer::elapsed_ms: call start() and then stop() first");
  if (device_.is_cpu()) return std::chrono::duration<double, std::milli>(cpu_stop_ - cpu_start_).count();
#if TG_CUDA
  float ms = 0;
  TG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_event_)));
  TG_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_event_),
                                     static_cast<cudaEvent_t>(stop_event_)));
  return ms;
#else
  return 0;  // unreachable: the constructor refused a GPU
#endif
}

}  // namespace tg
