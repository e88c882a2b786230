#include "core/cupti_activity.h"

#if TG_CUDA && __has_include(<cupti.h>)
#include <cuda_runtime.h>
#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace tg::profile::cupti {
namespace {

// The CUPTI entry points the profiler uses, resolved from the library at run time: a build
// links no CUPTI, and a machine without it keeps the event timing.
struct Api {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityPushExternalCorrelationId) push = nullptr;
  decltype(&cuptiActivityPopExternalCorrelationId) pop = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;
  bool loaded = false;
};

// libcupti through the loader's path, else where the CUDA toolkit keeps it.
Api load() {
  std::vector<std::string> paths = {"libcupti.so", "libcupti.so.13"};
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* v = std::getenv(env); v && *v) {
      paths.push_back(std::string(v) + "/lib64/libcupti.so");
      paths.push_back(std::string(v) + "/extras/CUPTI/lib64/libcupti.so");
    }
  }
  paths.push_back("/usr/local/cuda/lib64/libcupti.so");
  paths.push_back("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so");
  void* lib = nullptr;
  for (const std::string& p : paths)
    if ((lib = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  Api api;
  if (!lib) return api;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    return fn != nullptr;
  };
  api.loaded = bind(api.register_callbacks, "cuptiActivityRegisterCallbacks") &&
               bind(api.enable, "cuptiActivityEnable") && bind(api.disable, "cuptiActivityDisable") &&
               bind(api.flush_all, "cuptiActivityFlushAll") && bind(api.next_record, "cuptiActivityGetNextRecord") &&
               bind(api.push, "cuptiActivityPushExternalCorrelationId") &&
               bind(api.pop, "cuptiActivityPopExternalCorrelationId") && bind(api.timestamp, "cuptiGetTimestamp");
  return api;
}

const Api& api() {
  static const Api a = load();
  return a;
}

// CUPTI writes an external-correlation record only ahead of an API record (cupti_activity.h,
// cuptiActivityPushExternalCorrelationId): the runtime and driver API kinds must be on for the
// op tags to reach the kernels, copies and memsets those calls start. Their records are skipped.
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME,
                                         CUPTI_ACTIVITY_KIND_DRIVER,
                                         CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};
constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr CUpti_ExternalCorrelationKind kTag = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;

struct Activity {
  uint32_t correlation;  // the runtime call that launched it
  uint64_t start, end;   // ns
};

// Filled by CUPTI's buffer callbacks, which may run on CUPTI's own thread.
std::mutex g_mutex;
std::vector<Activity> g_activities;
std::unordered_map<uint32_t, uint64_t> g_tags;  // correlation id -> the id pushed at its launch

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));  // CUPTI's records are 8-byte aligned
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  if (buffer) {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* r = nullptr;
    while (api().next_record(buffer, valid, &r) == CUPTI_SUCCESS) {
      switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
          g_activities.push_back({k->correlationId, k->start, k->end});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
          g_activities.push_back({m->correlationId, m->start, m->end});
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
          g_activities.push_back({m->correlationId, m->start, m->end});
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(r);
          if (e->externalKind == kTag) g_tags[e->correlationId] = e->externalId;
          break;
        }
        default: break;
      }
    }
  }
  std::free(buffer);
}

void disable_all() {
  for (CUpti_ActivityKind k : kKinds) api().disable(k);
}

}  // namespace

bool start() {
  // A tool injected into the process (Nsight Systems / Compute, compute-sanitizer) may hold
  // CUPTI or perturb it: leave the timing to events then.
  if (const char* v = std::getenv("CUDA_INJECTION64_PATH"); v && *v) return false;
  const Api& a = api();
  if (!a.loaded) return false;
  static const bool registered = a.register_callbacks(buffer_requested, buffer_completed) == CUPTI_SUCCESS;
  if (!registered) return false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_activities.clear();
    g_tags.clear();
  }
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    if (a.enable(kKinds[i]) != CUPTI_SUCCESS) {
      for (size_t j = 0; j < i; ++j) a.disable(kKinds[j]);
      return false;
    }
  }
  return true;
}

void push(uint64_t id) {
  if (api().loaded) api().push(kTag, id);
}

void pop() {
  uint64_t last = 0;
  if (api().loaded) api().pop(kTag, &last);
}

std::unordered_map<uint64_t, Span> collect(const std::vector<int>& devices) {
  // An activity reaches the buffers once it has finished: wait for those GPUs first.
  int current = 0;
  cudaGetDevice(&current);
  for (int d : devices) {
    cudaSetDevice(d);
    cudaDeviceSynchronize();
  }
  cudaSetDevice(current);
  api().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::unordered_map<uint64_t, Span> spans;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const Activity& a : g_activities) {
    const auto tag = g_tags.find(a.correlation);
    if (tag == g_tags.end()) continue;
    Span& s = spans[tag->second];
    s.ms += double(a.end - a.start) * 1e-6;
    s.first_ns = s.first_ns == 0 ? a.start : std::min(s.first_ns, a.start);
  }
  g_activities.clear();
  g_tags.clear();
  return spans;
}

void stop() {
  if (!api().loaded) return;
  disable_all();
  api().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_activities.clear();
  g_tags.clear();
}

uint64_t now_ns() {
  uint64_t t = 0;
  if (api().loaded) api().timestamp(&t);
  return t;
}

}  // namespace tg::profile::cupti

#elif TG_CUDA
// A toolkit without CUPTI's headers: the profiler keeps its event timing.
namespace tg::profile::cupti {
bool start() { return false; }
void push(uint64_t) {}
void pop() {}
std::unordered_map<uint64_t, Span> collect(const std::vector<int>&) { return {}; }
void stop() {}
uint64_t now_ns() { return 0; }
}  // namespace tg::profile::cupti
#endif
