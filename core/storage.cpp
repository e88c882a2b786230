#include "core/storage.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"
#if TG_CUDA
#include "core/cuda_context.h"
#include "core/cuda_graph.h"
#endif

namespace tg {
namespace {

struct Counters {
  std::atomic<std::size_t> in_use{0};
  std::atomic<std::size_t> peak{0};
};
Counters& counters(Device d) {
  static Counters cpu;
  static Counters gpu[kMaxCudaDevices];
  return d.is_cpu() ? cpu : gpu[d.index];  // callers ran check_device
}

void count_alloc(Device d, std::size_t bytes) {
  Counters& c = counters(d);
  std::size_t now = c.in_use.fetch_add(bytes) + bytes;
  std::size_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

#if TG_CUDA
// [OOM retry] The pool keeps freed blocks (release threshold raised), possibly fragmented
// so that a large request fits in none of them. When the cached free memory plus what the
// driver still has could satisfy `bytes`, release the cache and let the caller retry once.
// Synchronizing first completes pending cudaFreeAsync calls, which the trim cannot release.
bool trim_pool_for(int device, std::size_t bytes) {
  if (cudaStreamSynchronize(cuda::stream(device)) != cudaSuccess) return false;
  cudaMemPool_t pool;
  uint64_t reserved = 0, used = 0;
  if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const uint64_t cached = reserved > used ? reserved - used : 0;
  if (cached == 0 || cached + free_bytes < bytes) return false;
  if (cudaMemPoolTrimTo(pool, 0) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}
#endif

}  // namespace

Storage::Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  check_device("Storage", device);
  if (device.is_cpu()) {
    // 64-byte alignment lets Eigen and vector loads use aligned accesses.
    std::size_t rounded = (bytes + 63) / 64 * 64;
    data_ = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (rounded && !data_) {
      throw OutOfMemory(detail::concat("out of host memory allocating ", bytes, " bytes (",
                                       counters(device).in_use.load(), " bytes in use)"),
                        bytes, counters(device).in_use.load());
    }
  } else {
#if TG_CUDA
    if (bytes) {
      cuda::set_device(device.index);
      cudaError_t err = cudaMallocAsync(&data_, bytes, cuda::stream(device.index));
      if (err == cudaErrorMemoryAllocation) {  // [OOM retry] once, after releasing the pool's cache
        cudaGetLastError();
        if (trim_pool_for(device.index, bytes)) err = cudaMallocAsync(&data_, bytes, cuda::stream(device.index));
      }
      if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // clear the sticky-free error so later calls work
        data_ = nullptr;
        std::size_t in_use = counters(device).in_use.load();
        throw OutOfMemory(detail::concat("CUDA out of memory on ", device.str(), ": asked for ",
                                         bytes, " bytes with ", in_use,
                                         " bytes in use by tapegrad tensors"),
                          bytes, in_use);
      }
      TG_CUDA_CHECK(err);
      if (cuda::detail::capture_active()) cuda::detail::note_allocation(device.index, data_);
    }
#else
    TG_FAIL("Storage: tensor on ", device.str(), " requested, but tapegrad was built without CUDA");
#endif
  }
  count_alloc(device, bytes);
}

Storage::~Storage() {
  if (data_) {
    if (device_.is_cpu()) {
      std::free(data_);
    } else {
#if TG_CUDA
      // Errors here are ignored: a destructor must not throw, and a failed free at
      // shutdown leaves nothing to recover.
      // During a CUDA graph capture only the graph's own allocations can be freed in it;
      // the Graph keeps older buffers alive until it is destroyed (core/cuda_graph.h).
      if (!(cuda::detail::capture_active() && cuda::detail::keep_for_graph(device_.index, data_, bytes_))) {
        cudaSetDevice(device_.index);
        if (cudaFreeAsync(data_, cuda::stream(device_.index)) != cudaSuccess) cudaGetLastError();
      }
#endif
    }
  }
  counters(device_).in_use.fetch_sub(bytes_);
}

MemoryStats memory_stats(Device d) {
  check_device("memory_stats", d);
  return {counters(d).in_use.load(), counters(d).peak.load()};
}

void reset_peak_memory(Device d) {
  check_device("reset_peak_memory", d);
  counters(d).peak.store(counters(d).in_use.load());
}

}  // namespace tg
