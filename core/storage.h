// Storage: a move-only owner of one contiguous buffer on one device.
// GPU buffers come from CUDA's stream-ordered pool (cudaMallocAsync), which already caches
// freed blocks; we do not write our own allocator. Destructors never throw.
#pragma once
#include <cstddef>
#include <cstdint>

#include "device.h"

namespace tg {

class Storage {
 public:
  Storage(std::size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // Bumped by every in-place write (fill_, optimizer steps) so that autograd can tell
  // that a tensor it saved for backward was modified afterwards.
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
  uint64_t version_ = 0;
};

// Copies `bytes` between buffers on any two devices: memcpy on the host; with a GPU, ordered
// on the framework's streams (device to device on one GPU: queued, the host does not wait;
// to or from the host: returns once the host side may be reused or read).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);

struct MemoryStats {
  std::size_t in_use = 0;  // bytes held by live tensors on the device
  std::size_t peak = 0;    // high-water mark since the last reset
};
MemoryStats memory_stats(Device d);
void reset_peak_memory(Device d);

}  // namespace tg
