// See hopper.h. Compiled with the library's CUDA flags, like every wgmma kernel: if this file's
// device image carries sm_90a code, so do theirs.
#include "ops/cuda/arch/hopper.h"

#include <atomic>

#include "core/cuda_context.h"

namespace tg::cuda {
namespace {

// 1 in the device image when it was compiled with the sm_90a instructions, 0 otherwise (e.g. a
// build for sm_90 or older GPUs that the driver runs or JIT-compiles on an H100/H200).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ int wgmma_code_present = 1;
#else
__device__ int wgmma_code_present = 0;
#endif

}  // namespace

// Compute capability 9.0 and a device image with the sm_90a code; asked once per device.
bool device_runs_wgmma(int dev) {
  static std::atomic<int> known[64] = {};  // 0 unknown, 1 yes, 2 no
  if (dev < 0 || dev >= 64) return false;
  int state = known[dev].load(std::memory_order_acquire);
  if (state == 0) {
    int major = 0, minor = 0, present = 0;
    TG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    TG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major == 9 && minor == 0) {
      set_device(dev);
      // No image for this device at all is an error here, not a reason to stop: answer "no".
      if (cudaMemcpyFromSymbol(&present, wgmma_code_present, sizeof(int)) != cudaSuccess) {
        present = 0;
        (void)cudaGetLastError();
      }
    }
    state = present == 1 ? 1 : 2;
    known[dev].store(state, std::memory_order_release);
  }
  return state == 1;
}

int sm_count(int dev) {
  static std::atomic<int> cached[64] = {};
  if (dev < 0 || dev >= 64) dev = 0;
  int n = cached[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    TG_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cached[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace tg::cuda
