// The profiler's recording side: phases, op scopes, GPU events and the report (the trace:
// core/profiler_trace.cpp).
// The ceilings (peak rates) are measured with ops (tg::matmul) and live in
// ops/profiler_ceilings.cpp, so that this file needs nothing above core.
#include "core/profiler.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <ostream>

#include "core/cuda_graph.h"
#include "core/error.h"
#include "core/precision.h"
#include "core/tensor.h"
#if TG_CUDA
#include <nvtx3/nvToolsExt.h>

#include "core/cuda_context.h"
#include "core/cupti_activity.h"
#endif

namespace tg {

using Clock = std::chrono::steady_clock;

struct Profiler::State {
  uint64_t serial = 0;  // unique per profiler: a scope opened under another one ends harmlessly
  Clock::time_point t0 = Clock::now();
  bool stopped = false;
  std::vector<Record> records;
  std::vector<Clock::time_point> cpu_begin;  // per record, while it is open
#if TG_CUDA
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  std::vector<Events> events;                   // per record; null where resolved or CPU
  std::vector<cudaEvent_t> pool[kMaxCudaDevices];  // finished events, for reuse
  cudaEvent_t ref[kMaxCudaDevices] = {};        // a completed event at host time ref_us
  double ref_us[kMaxCudaDevices] = {};
  // Device times from CUPTI's activity records instead of events (core/cupti_activity.h):
  // per record, the summed durations of its activities and the first one's start.
  bool cupti = false, cupti_running = false;
  uint64_t cupti_t0_ns = 0;  // CUPTI's clock at t0
  std::vector<double> device_ms;
  std::vector<uint64_t> first_ns;
  uint64_t tag(size_t slot) const { return (serial << 32) | (slot + 1); }
#endif
  ~State();
  void resolve();
};

namespace profile {
namespace detail {
std::atomic<int> g_enabled{0};
}  // namespace detail

namespace {
constexpr int kProfilerOn = 1, kNvtxEnv = 2;
// Guards g_state: begin/end of recorded scopes and the profiler's life. Held only while a
// profiler is active, never on the off path.
std::mutex g_mutex;
Profiler::State* g_state = nullptr;
std::atomic<uint64_t> g_recorded{0};
uint64_t g_serial = 0;  // guarded by g_mutex
std::atomic<int> g_threads{0};
thread_local Phase t_phase = Phase::forward;
thread_local int t_depth = 0;  // open op scopes on this thread
thread_local int t_thread = -1;

// TG_NVTX=1 in the environment turns NVTX ranges on for the whole run (CUDA builds).
const bool g_nvtx_env = [] {
  const char* v = std::getenv("TG_NVTX");
  const bool on = TG_CUDA && v && std::strcmp(v, "1") == 0;
  if (on) detail::g_enabled.fetch_or(kNvtxEnv, std::memory_order_relaxed);
  return on;
}();

int thread_index() {
  if (t_thread < 0) t_thread = g_threads.fetch_add(1);
  return t_thread;
}

double since_us(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t - t0).count();
}
}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    default: return "optimizer";
  }
}
Phase current_phase() { return t_phase; }
PhaseGuard::PhaseGuard(Phase p) : previous_(t_phase) { t_phase = p; }
PhaseGuard::~PhaseGuard() { t_phase = previous_; }
uint64_t ops_recorded() { return g_recorded.load(); }
bool profiler_active() { return (detail::g_enabled.load(std::memory_order_relaxed) & kProfilerOn) != 0; }
Unrecorded::Unrecorded() { ++t_depth; }  // a scope that is never the outermost
Unrecorded::~Unrecorded() { --t_depth; }

double bytes_of(std::initializer_list<const Tensor*> ts) {
  double b = 0;
  for (const Tensor* t : ts)
    if (t && t->defined()) b += static_cast<double>(t->nbytes());
  return b;
}

void OpScope::begin(const char* name, const OpInfo& info) {
  if (info.name) name = info.name;
  state_ = 1;
  const bool outermost = t_depth++ == 0;
#if TG_CUDA
  nvtxRangePushA(name);
  state_ |= 4;
#endif
  if (!outermost) return;
  try {
    start_record(name, info);
  } catch (...) {  // the constructor throws: the destructor will not run, so undo here
    end();
    state_ = 0;
    throw;
  }
}

void OpScope::start_record(const char* name, const OpInfo& info) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Profiler::State* s = g_state;
  if (!s || s->stopped) return;
  Profiler::Record r;
  r.op = name;
  r.phase = t_phase;
  r.thread = thread_index();
  for (const Tensor* t : info.inputs) {
    if (!t || !t->defined()) continue;
    if (r.input_shapes.empty()) r.device = t->device();
    r.input_shapes.push_back(t->shape());
  }
  r.flops = info.flops;
  r.bytes = info.bytes;
  r.matrix = info.matrix;
  r.tf32 = info.matrix && precision() == Precision::TF32;
  r.ms = -1;  // open: resolve() skips it until end() closes it
  slot_ = static_cast<int64_t>(s->records.size());
  profiler_ = s->serial;
  s->records.push_back(std::move(r));
  s->cpu_begin.push_back(Clock::now());
#if TG_CUDA
  s->events.emplace_back();
  s->device_ms.push_back(0);
  s->first_ns.push_back(0);
  const Device d = s->records.back().device;
  if (d.is_cuda() && s->cupti) {
    profile::cupti::push(s->tag(static_cast<size_t>(slot_)));  // popped in end()
    state_ |= 8;
  } else if (d.is_cuda()) {
    cuda::set_device(d.index);
    cudaStream_t stream = cuda::stream(d.index);
    if (!s->ref[d.index]) {  // the time origin of this GPU: an event completed at a known host time
      TG_CUDA_CHECK(cudaStreamSynchronize(stream));
      TG_CUDA_CHECK(cudaEventCreate(&s->ref[d.index]));
      TG_CUDA_CHECK(cudaEventRecord(s->ref[d.index], stream));
      TG_CUDA_CHECK(cudaEventSynchronize(s->ref[d.index]));
      s->ref_us[d.index] = since_us(s->t0, Clock::now());
    }
    auto take = [&] {
      auto& pool = s->pool[d.index];
      cudaEvent_t e = nullptr;
      if (!pool.empty()) {
        e = pool.back();
        pool.pop_back();
      } else {
        TG_CUDA_CHECK(cudaEventCreate(&e));
      }
      return e;
    };
    auto& ev = s->events.back();
    ev.start = take();
    ev.stop = take();
    TG_CUDA_CHECK(cudaEventRecord(ev.start, stream));
  }
#endif
  state_ |= 2;
  g_recorded.fetch_add(1, std::memory_order_relaxed);
}

void OpScope::end() noexcept {
#if TG_CUDA
  if (state_ & 4) nvtxRangePop();
  if (state_ & 8) profile::cupti::pop();
#endif
  --t_depth;
  if (!(state_ & 2)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  Profiler::State* s = g_state;
  // The profiler may have stopped (or another started) while this op ran: then its record
  // is gone, or not this one's (another serial).
  if (!s || s->stopped || s->serial != profiler_ || slot_ >= static_cast<int64_t>(s->records.size())) return;
  Profiler::Record& r = s->records[static_cast<size_t>(slot_)];
  const Clock::time_point now = Clock::now();
  r.start_us = since_us(s->t0, s->cpu_begin[static_cast<size_t>(slot_)]);
  r.ms = std::chrono::duration<double, std::milli>(now - s->cpu_begin[static_cast<size_t>(slot_)]).count();
#if TG_CUDA
  auto& ev = s->events[static_cast<size_t>(slot_)];
  if (ev.stop) {
    // Failing to record only loses this op's GPU time (it keeps the host time).
    cuda::set_device(r.device.index);
    if (cudaEventRecord(ev.stop, cuda::stream(r.device.index)) != cudaSuccess) {
      cudaGetLastError();
      s->pool[r.device.index].push_back(ev.start);
      s->pool[r.device.index].push_back(ev.stop);
      ev = {};
    }
  }
  // Bounded pending events: past this many, wait for them (the oldest are done long ago).
  if (!s->cupti && s->records.size() % 4096 == 0) {
    try {
      s->resolve();
    } catch (...) {
    }
  }
#endif
}

}  // namespace profile

void Profiler::State::resolve() {
#if TG_CUDA
  if (cupti) {
    if (cupti_running) {
      std::vector<int> devices;
      for (const Record& r : records)
        if (r.device.is_cuda() && std::find(devices.begin(), devices.end(), r.device.index) == devices.end())
          devices.push_back(r.device.index);
      for (const auto& [id, span] : profile::cupti::collect(devices)) {
        const uint64_t slot = (id & 0xffffffffu) - 1;
        if ((id >> 32) != serial || slot >= records.size()) continue;
        device_ms[slot] += span.ms;
        first_ns[slot] = first_ns[slot] == 0 ? span.first_ns : std::min(first_ns[slot], span.first_ns);
      }
    }
    for (size_t i = 0; i < records.size(); ++i) {
      Record& r = records[i];
      if (!r.device.is_cuda() || r.ms < 0) continue;  // host ops keep their wall time; open ones wait
      r.ms = device_ms[i];
      if (first_ns[i] != 0) r.start_us = (double(first_ns[i]) - double(cupti_t0_ns)) * 1e-3;
    }
    return;
  }
  for (size_t i = 0; i < events.size(); ++i) {
    Events& ev = events[i];
    if (!ev.start || (records[i].ms < 0)) continue;
    Record& r = records[i];
    const int d = r.device.index;
    cuda::set_device(d);
    TG_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    float ms = 0, from_ref = 0;
    TG_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    TG_CUDA_CHECK(cudaEventElapsedTime(&from_ref, ref[d], ev.start));
    r.ms = ms;
    r.start_us = ref_us[d] + 1000.0 * from_ref;
    pool[d].push_back(ev.start);
    pool[d].push_back(ev.stop);
    ev = {};
  }
#endif
}

Profiler::State::~State() {
#if TG_CUDA
  // Destructors never throw: failures only leak events.
  for (const Events& ev : events) {
    if (ev.start) cudaEventDestroy(ev.start);
    if (ev.stop) cudaEventDestroy(ev.stop);
  }
  for (int d = 0; d < kMaxCudaDevices; ++d) {
    for (cudaEvent_t e : pool[d]) cudaEventDestroy(e);
    if (ref[d]) cudaEventDestroy(ref[d]);
  }
#endif
}

Profiler::Profiler() : state_(std::make_unique<State>()) {
  TG_CHECK_AS(CaptureError, !cuda::any_capturing(),
              "Profiler: a CUDA graph capture is running; its ops cannot be timed with events (profile eager steps)");
  std::lock_guard<std::mutex> lock(profile::g_mutex);
  TG_CHECK(profile::g_state == nullptr,
           "Profiler: another tg::Profiler is active; only one may record at a time (destroy or stop() it first)");
  state_->serial = ++profile::g_serial;
#if TG_CUDA
  // CUPTI's activity records time the GPU ops unless TG_PROFILER_EVENTS=1 asks for events, or
  // CUPTI cannot be had (not installed, or held by another tool such as a sanitizer).
  const char* events_env = std::getenv("TG_PROFILER_EVENTS");
  if (!(events_env && std::strcmp(events_env, "1") == 0) && cuda_available() && profile::cupti::start()) {
    state_->cupti = state_->cupti_running = true;
    state_->cupti_t0_ns = profile::cupti::now_ns();
    state_->t0 = Clock::now();
  }
#endif
  profile::g_state = state_.get();
  profile::detail::g_enabled.fetch_or(profile::kProfilerOn, std::memory_order_relaxed);
}

Profiler::~Profiler() {
  try {
    stop_recording(/*keep_device_times=*/false);
  } catch (...) {
  }
}

void Profiler::stop() { stop_recording(/*keep_device_times=*/true); }

void Profiler::stop_recording([[maybe_unused]] bool keep_device_times) {
  std::lock_guard<std::mutex> lock(profile::g_mutex);
  if (state_->stopped) return;
  state_->stopped = true;
  if (profile::g_state == state_.get()) {
    profile::g_state = nullptr;
    profile::detail::g_enabled.fetch_and(~profile::kProfilerOn, std::memory_order_relaxed);
  }
#if TG_CUDA
  // CUPTI collects for one profiler at a time: what the recorded ops ran is collected (waiting
  // for the GPUs) before it stops, unless the profiler is going away.
  if (state_->cupti_running) {
    if (keep_device_times) state_->resolve();
    state_->cupti_running = false;
    profile::cupti::stop();
  }
#endif
}

bool Profiler::device_times_from_cupti() const {
#if TG_CUDA
  return state_->cupti;
#else
  return false;
#endif
}

const std::vector<Profiler::Record>& Profiler::records() {
  std::lock_guard<std::mutex> lock(profile::g_mutex);
  state_->resolve();
  return state_->records;
}

namespace {

struct Row {
  std::string op, device;
  int64_t calls = 0;
  double ms = 0, flops = 0, bytes = 0, bound_ms = 0;
  bool has_bound = false;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

void Profiler::report(std::ostream& os) {
  const std::vector<Record>& recs = records();
  // Peak rates per GPU used (measured or read from the cache once per GPU model). A GPU
  // whose ceilings cannot be had gets no roofline column rather than no report.
  std::map<int, Ceilings> peaks;
  std::map<int, bool> have_peaks;
  for (const Record& r : recs) {
    if (!r.device.is_cuda() || have_peaks.count(r.device.index)) continue;
    try {
      peaks[r.device.index] = ceilings(r.device);
      have_peaks[r.device.index] = true;
    } catch (const std::exception& e) {
      os << "profiler: no roofline for " << r.device << ": " << e.what() << "\n";
      have_peaks[r.device.index] = false;
    }
  }
  std::map<std::string, Row> rows;
  double total_ms = 0;
  for (const Record& r : recs) {
    if (r.ms < 0) continue;  // still open
    const std::string key = r.op + " [" + profile::phase_name(r.phase) + "] " + r.device.str();
    Row& row = rows[key];
    row.op = r.op + " [" + profile::phase_name(r.phase) + "]";
    row.device = r.device.str();
    ++row.calls;
    row.ms += r.ms;
    row.flops += r.flops;
    row.bytes += r.bytes;
    total_ms += r.ms;
    if (r.device.is_cuda() && have_peaks[r.device.index]) {
      const Ceilings& c = peaks[r.device.index];
      const double tflops = r.matrix && r.tf32 ? c.tf32_tflops : c.fp32_tflops;
      // bound = max(flops / peak, bytes / bandwidth), in ms
      const double t_flops = tflops > 0 ? r.flops / (tflops * 1e9) : 0;
      const double t_bytes = c.copy_gbps > 0 ? r.bytes / (c.copy_gbps * 1e6) : 0;
      row.bound_ms += std::max(t_flops, t_bytes);
      row.has_bound = true;
    }
  }
  std::vector<const Row*> sorted;
  for (const auto& [k, row] : rows) sorted.push_back(&row);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Row* a, const Row* b) { return a->ms > b->ms; });

  size_t w = 20;
  for (const Row* r : sorted) w = std::max(w, r->op.size());
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %-7s %7s %11s %10s %7s %9s %9s %7s\n", static_cast<int>(w), "op [phase]",
                "device", "calls", "total ms", "mean ms", "% all", "TFLOP/s", "GB/s", "% roof");
  os << line;
  for (const Row* r : sorted) {
    const double s = r->ms / 1e3;
    const std::string roof = r->has_bound && r->ms > 0 ? fmt("%.1f", 100.0 * r->bound_ms / r->ms) : "-";
    std::snprintf(line, sizeof line, "%-*s %-7s %7lld %11.3f %10.4f %7.1f %9s %9s %7s\n", static_cast<int>(w),
                  r->op.c_str(), r->device.c_str(), static_cast<long long>(r->calls), r->ms, r->ms / r->calls,
                  total_ms > 0 ? 100.0 * r->ms / total_ms : 0.0, s > 0 ? fmt("%.4g", r->flops / s / 1e12).c_str() : "-",
                  s > 0 ? fmt("%.4g", r->bytes / s / 1e9).c_str() : "-", roof.c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "%-*s %-7s %7zu %11.3f\n", static_cast<int>(w), "total", "", recs.size(), total_ms);
  os << line;
  for (const auto& [d, c] : peaks)
    os << "roofline cuda:" << d << " (" << c.gpu << "): copy " << fmt("%.0f", c.copy_gbps) << " GB/s, FP32 matmul "
       << fmt("%.1f", c.fp32_tflops) << " TFLOP/s, TF32 matmul " << fmt("%.1f", c.tf32_tflops)
       << " TFLOP/s; cached in " << ceilings_path(c.gpu) << "\n";
  if (!have_peaks.empty())
    os << "GPU device times: " << (device_times_from_cupti() ? "CUPTI activity records (each op's kernels, copies and memsets)"
                                                              : "CUDA events around each op") << "\n";
}

// Where the ceilings are cached (a user setting, read here in core; ops/profiler_ceilings.cpp
// measures them).
std::string Profiler::cache_dir() {
  if (const char* v = std::getenv("TG_CACHE_DIR"); v && *v) return v;
  if (const char* v = std::getenv("XDG_CACHE_HOME"); v && *v) return std::string(v) + "/tapegrad";
  if (const char* v = std::getenv("HOME"); v && *v) return std::string(v) + "/.cache/tapegrad";
  return ".cache/tapegrad";
}

std::string Profiler::ceilings_path(const std::string& gpu) {
  std::string file = "ceilings-";
  for (char ch : gpu) file += std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' ? ch : '_';
  return cache_dir() + "/" + file + ".json";
}

}  // namespace tg
