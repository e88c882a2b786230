// Where the time goes: a per-op profiler.
//
//   tg::Profiler prof;                 // records every op run while it is alive, any thread
//   for (...) { /* forward, tape.backward(loss), opt.step() */ }
//   prof.report(std::cout);            // table by op and phase, sorted by total time
//   prof.write_trace("trace.json");    // Chrome / Perfetto trace (ui.perfetto.dev)
//
// Ops say what they are with an OpScope at the top of their public function and of the
// backward function they record (ops/*.cpp):
//
//   profile::OpScope scope("conv2d", [&] { return profile::OpInfo{{&x, &w, &b}, flops, bytes, true}; });
//
// The lambda runs only while a profiler is active. When none is (and TG_NVTX is not set)
// the scope costs one relaxed atomic load: no event, no allocation, no string.
// Nested scopes on one thread (an op calling other public ops, a backward calling mul and
// sum_to) are attributed to the outermost one only, so every op is counted once.
//
// Each record holds the op's name, device, phase (forward; backward = inside
// Tape::backward; optimizer = inside Optimizer::step), input shapes, device time (on a GPU the
// summed durations of the kernels, copies and memsets the op ran, from CUPTI's activity
// records, or CUDA events around the op where CUPTI cannot be had; on the CPU, wall time), and
// the FLOPs and minimum bytes the op family declares (inputs read once, outputs written once).
//
// The roofline column of report() compares each op's time with the bound
// max(flops / peak, bytes / copy bandwidth) of this GPU. The peaks are measured once per GPU
// model with tapegrad's own kernels (a device-to-device copy, tg::matmul at FP32 and TF32)
// and cached as JSON in ceilings_path(): $TG_CACHE_DIR, else $XDG_CACHE_HOME/tapegrad, else
// ~/.cache/tapegrad, file "ceilings-<GPU name>.json". Delete it, or call refresh_ceilings(),
// to measure again. CPU ops get times, FLOP/s and GB/s, and no roofline.
//
// NVTX: in CUDA builds every op scope also pushes an NVTX range (for Nsight Systems) while a
// profiler is active, or always when the environment has TG_NVTX=1.
#pragma once
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "shape.h"

namespace tg {

class Tensor;

namespace profile {

enum class Phase : uint8_t { forward, backward, optimizer };
const char* phase_name(Phase p);

// The calling thread's phase (forward unless inside a PhaseGuard).
Phase current_phase();
// Sets the calling thread's phase for its scope (Tape::backward, Optimizer::step).
class PhaseGuard {
 public:
  explicit PhaseGuard(Phase p);
  ~PhaseGuard();
  PhaseGuard(const PhaseGuard&) = delete;
  PhaseGuard& operator=(const PhaseGuard&) = delete;

 private:
  Phase previous_;
};

namespace detail {
// Nonzero while a profiler is active or TG_NVTX=1: the one load of the off path.
extern std::atomic<int> g_enabled;
}  // namespace detail
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed) != 0; }
// Whether a tg::Profiler is recording (not merely NVTX on): a CUDA graph capture refuses to
// start while one is, since the profiler's events cannot be captured.
bool profiler_active();

// What an op declares when it is profiled. Undefined tensors among `inputs` are skipped;
// the first defined one gives the device. `matrix`: bound by the matrix (GEMM) peak rather
// than the plain FP32 rate (conv, matmul, linear).
struct OpInfo {
  // Read before the scope's constructor returns: each must outlive that (an op's own
  // arguments and locals do; a temporary made inside the info lambda does not).
  std::vector<const Tensor*> inputs;
  double flops = 0;
  double bytes = 0;
  bool matrix = false;
  // Replaces the scope's name when set: a name that takes work to choose (a lookup by the
  // forward op's name) is chosen here, on the profiled path only.
  const char* name = nullptr;
};

// Ops recorded since the program started (by any profiler): a test's way to see that
// nothing is recorded while no profiler is active.
uint64_t ops_recorded();

class OpScope {
 public:
  template <class InfoFn>
  OpScope(const char* name, InfoFn&& info) {
    if (enabled()) [[unlikely]] begin(name, info());
  }
  ~OpScope() {
    if (state_ != 0) [[unlikely]] end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  void begin(const char* name, const OpInfo& info);
  void start_record(const char* name, const OpInfo& info);
  void end() noexcept;
  int state_ = 0;    // 0: off; else bits: 1 nested depth taken, 2 recording, 4 NVTX range pushed,
                     // 8 CUPTI tag pushed
  int64_t slot_ = -1;  // the profiler's pending record
  uint64_t profiler_ = 0;  // which profiler (its serial number) holds that record
};

// Ops run in its scope on the calling thread are not recorded (the profiler's own
// measurements of the ceilings).
class Unrecorded {
 public:
  Unrecorded();
  ~Unrecorded();
  Unrecorded(const Unrecorded&) = delete;
  Unrecorded& operator=(const Unrecorded&) = delete;
};

// Bytes of the defined tensors among `ts`.
double bytes_of(std::initializer_list<const Tensor*> ts);

}  // namespace profile

class Profiler {
 public:
  // Starts recording; throws tg::Error while another Profiler is alive.
  Profiler();
  ~Profiler();  // stops recording (waits for nothing; pending GPU times are dropped)
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  struct Record {
    std::string op;           // "conv2d", "conv2d (backward)", "SGD"
    Device device;
    profile::Phase phase = profile::Phase::forward;
    std::vector<Shape> input_shapes;
    double ms = 0;            // device time (GPU: see device_times_from_cupti; CPU: wall)
    double start_us = 0;      // since the profiler started (for the trace)
    double flops = 0, bytes = 0;
    bool matrix = false;      // bound by the matrix peak
    bool tf32 = false;        // precision was TF32 when it ran (matrix ops)
    int thread = 0;           // small per-thread index, in order of first appearance
  };

  // Stops recording early (the records stay readable; waits for the GPUs where CUPTI times
  // them); the destructor does it otherwise.
  void stop();
  // GPU ops' device times: true, the summed durations of the kernels, copies and memsets each
  // op ran, from CUPTI's activity records (core/cupti_activity.h); false, CUDA events on
  // tapegrad's stream around each op (TG_PROFILER_EVENTS=1 in the environment asks for them;
  // they are the fallback where CUPTI cannot be loaded or is held by another tool).
  bool device_times_from_cupti() const;
  // Every op recorded so far, in the order they started; GPU times are resolved first
  // (waits for the recorded events). Read it after stop(), or while no op runs: recording
  // appends to this vector.
  const std::vector<Record>& records();

  void report(std::ostream& os);
  void write_trace(const std::string& path);

  // Peak rates of a GPU, measured once per model and cached on disk (see above).
  struct Ceilings {
    std::string gpu;
    double copy_gbps = 0;    // device-to-device copy: bytes read + written per second / 1e9
    double fp32_tflops = 0;  // tg::matmul at Precision::FP32
    double tf32_tflops = 0;  // tg::matmul at Precision::TF32
  };
  static Ceilings ceilings(Device device);
  static Ceilings refresh_ceilings(Device device = Device::cuda());
  static std::string ceilings_path(const std::string& gpu_name);
  // The cache folder: $TG_CACHE_DIR, else $XDG_CACHE_HOME/tapegrad, else ~/.cache/tapegrad.
  static std::string cache_dir();

  struct State;  // profiler.cpp

 private:
  void stop_recording(bool keep_device_times);
  std::unique_ptr<State> state_;
};

}  // namespace tg
