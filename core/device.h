// Where a tensor's buffer lives: the host, or GPU number N.
#pragma once
#include <ostream>
#include <string>

namespace tg {

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {Kind::cpu, 0}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// Parses "cpu", "cuda" or "cuda:N".
Device parse_device(const std::string& s);

// Number of usable GPUs. Any CUDA error (no driver, driver too old, no device) counts as
// none, and a build without CUDA always reports 0.
int cuda_device_count();
inline bool cuda_available() { return cuda_device_count() > 0; }

// Waits for all work queued on the device (no-op on the CPU).
void synchronize(Device d);

}  // namespace tg
