#include "core/device.h"

#include "core/cuda_graph.h"
#include "core/error.h"
#if TG_CUDA
#include "core/cuda_context.h"
#endif

namespace tg {

Device Device::cuda(int index) {
  TG_CHECK(index >= 0 && index < kMaxCudaDevices, "Device::cuda: GPU ordinal ", index, " out of range [0, ",
           kMaxCudaDevices, ")");
  return {Kind::cuda, index};
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    // Digits only: std::stoi would accept a sign, leading spaces and trailing junk.
    const std::string n = s.substr(5);
    const bool digits = !n.empty() && n.size() <= 4 && n.find_first_not_of("0123456789") == std::string::npos;
    TG_CHECK(digits, "parse_device: expected 'cuda:N' with N a GPU ordinal in [0, ", kMaxCudaDevices, "), got '",
             s, "'");
    const int index = std::stoi(n);
    TG_CHECK(index < kMaxCudaDevices, "parse_device: GPU ordinal in '", s, "' out of range [0, ", kMaxCudaDevices,
             ")");
    return Device::cuda(index);
  }
  TG_FAIL("parse_device: expected 'cpu', 'cuda' or 'cuda:N', got '", s, "'");
}

void check_device(const char* op, Device d) {
  if (d.is_cpu()) {
    TG_CHECK_AS(DeviceError, d.index == 0, op, ": the CPU device has index 0, got ", d.index);
    return;
  }
  TG_CHECK_AS(DeviceError, d.is_cuda(), op, ": unknown device kind ", static_cast<int>(d.kind));
  TG_CHECK_AS(DeviceError, d.index >= 0 && d.index < kMaxCudaDevices, op, ": GPU ordinal ", d.index, " out of range [0, ",
           kMaxCudaDevices, ")");
#if TG_CUDA
  const int count = cuda_device_count();
  TG_CHECK_AS(DeviceError, d.index < count, op, ": no such device ", d.str(), " (", count, " GPUs visible)");
#else
  TG_FAIL_AS(UnsupportedError, op, ": ", d.str(), " requested, but tapegrad was built without CUDA");
#endif
}

int cuda_device_count() {
#if TG_CUDA
  static const int count = [] {
    int n = 0;
    // A machine with the toolkit but no driver reports 'driver version is insufficient',
    // not 'no device': every error means no usable GPU.
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

void synchronize(Device d) {
#if TG_CUDA
  if (d.is_cuda()) {
    check_device("synchronize", d);
    cuda::fail_if_capturing("synchronize", d.index);
    cuda::set_device(d.index);
    TG_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(d.index)));
  }
#else
  (void)d;
#endif
}

}  // namespace tg
