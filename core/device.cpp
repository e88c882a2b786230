#include "core/device.h"

#include "core/error.h"
#if TG_CUDA
#include "core/cuda_context.h"
#endif

namespace tg {

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      return Device::cuda(std::stoi(s.substr(5)));
    } catch (const std::exception&) {
    }
  }
  TG_FAIL("parse_device: expected 'cpu', 'cuda' or 'cuda:N', got '", s, "'");
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
    cuda::set_device(d.index);
    TG_CUDA_CHECK(cudaStreamSynchronize(cuda::stream(d.index)));
  }
#else
  (void)d;
#endif
}

}  // namespace tg
