// Where a tensor's buffer lives: the host, or GPU number N.
#pragma once
#include <ostream>
#include <string>

namespace tg {

// GPU ordinals are below this: per-device tables (streams, memory counters) have this
// many slots, so an index is checked against it before it is used as one.
inline constexpr int kMaxCudaDevices = 16;

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {Kind::cpu, 0}; }
  // Checks the ordinal's range only: naming a GPU this machine lacks is an error where the
  // device is used (check_device), so that a Device can be described on any machine.
  static Device cuda(int index = 0);
  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// Parses "cpu", "cuda" or "cuda:N" (N decimal digits, below kMaxCudaDevices).
Device parse_device(const std::string& s);

// Number of usable GPUs. Any CUDA error (no driver, driver too old, no device) counts as
// none, and a build without CUDA always reports 0.
int cuda_device_count();
inline bool cuda_available() { return cuda_device_count() > 0; }

// Throws tg::Error naming `op` unless `d` can be used here: the CPU (index 0), or a GPU
// ordinal below kMaxCudaDevices and below the number of visible GPUs.
void check_device(const char* op, Device d);

// Waits for all work queued on the device (no-op on the CPU).
void synchronize(Device d);

}  // namespace tg
