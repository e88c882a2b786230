#include "core/cuda_context.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace tg {
namespace detail {
void throw_cuda_error(const char* file, int line, const char* call, cudaError_t err) {
  throw_as<CudaError>(file, line, concat("CUDA error in ", call, ": ", cudaGetErrorName(err), " (",
                                         cudaGetErrorString(err), ")"));
}
}  // namespace detail

namespace cuda {

void set_device(int device) {
  static thread_local int current = -1;
  if (current != device) {
    TG_CUDA_CHECK(cudaSetDevice(device));
    current = device;
  }
}

void allow_dynamic_smem(const void* kernel, int bytes, bool max_shared_carveout) {
  int device = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device));
  struct Set {
    int bytes = 0;
    bool carveout = false;
  };
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, Set> allowed;  // (kernel, device) -> what is set
  std::lock_guard<std::mutex> lock(mutex);
  Set& set = allowed[{kernel, device}];
  if (set.bytes < bytes) {
    TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    set.bytes = bytes;
  }
  if (max_shared_carveout && !set.carveout) {
    TG_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    set.carveout = true;
  }
}

cudaStream_t stream(int device) {
  static std::once_flag once[16];
  static cudaStream_t streams[16];
  TG_CHECK(device >= 0 && device < 16, "cuda::stream: device index ", device, " out of range");
  std::call_once(once[device], [device] {
    int previous = 0;
    TG_CUDA_CHECK(cudaGetDevice(&previous));
    TG_CUDA_CHECK(cudaSetDevice(device));
    TG_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
    // Keep freed blocks in the pool instead of returning them to the driver at every
    // synchronization: this is what makes cudaMallocAsync a caching allocator.
    cudaMemPool_t pool;
    TG_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t threshold = UINT64_MAX;
    TG_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    TG_CUDA_CHECK(cudaSetDevice(previous));
  });
  return streams[device];
}

}  // namespace cuda
}  // namespace tg
