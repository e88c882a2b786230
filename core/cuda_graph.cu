// tg::cuda::Graph: stream capture of tapegrad's per-device stream, and the registry through
// which the storage, dropout and cross_entropy cooperate with a capture in progress.
#include "core/cuda_graph.h"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/cuda_context.h"
#include "core/profiler.h"

namespace tg::cuda {
namespace {

// Random streams (the process-wide generator, each nn::Dropout's seed) one captured step
// may draw from, and per-step scalars it may read (capture_step_scalars): a step with more
// is refused.
constexpr int kMaxRandomStreams = 256;
constexpr std::size_t kMaxStepScalars = 8192;
constexpr int kScalarStaging = 4;  // pinned upload buffers, used in turn by the replays

// One graph's device-side state: for its random draws, the index of the replay that is
// running (`current`, set by the graph's first random node from `next`) and the counters
// each stream uses per step (written once after capture); the per-step scalars.
struct GraphDeviceState {
  uint64_t current;
  uint64_t next;
  uint64_t span[kMaxRandomStreams];
  double scalars[kMaxStepScalars];
};

__global__ void advance_replay_kernel(GraphDeviceState* s) {
  s->current = s->next;
  s->next = s->next + 1;
}

struct KeyLess {
  bool operator()(const RandomStreamKey& a, const RandomStreamKey& b) const {
    return std::tie(a.global, a.seed) < std::tie(b.global, b.seed);
  }
};

// What one capture collects while it runs; its Graph takes it over at the end.
struct CaptureState {
  std::mutex mutex;
  std::unordered_set<void*> allocations;  // graph allocations made and not yet freed
  std::vector<void*> kept;                // buffers made before capture, dropped during it
  std::vector<std::function<void()>> before, after;
  std::map<RandomStreamKey, int, KeyLess> stream_slot;
  std::vector<uint64_t> spans;            // counters drawn per slot during capture
  GraphDeviceState* rng = nullptr;
  bool rng_advance_queued = false;
  double* host_scalars = nullptr;         // the Graph's host side of rng->scalars
  std::size_t scalars_used = 0;
};

std::atomic<CaptureState*> g_capture[kMaxCudaDevices];
std::atomic<int> g_captures{0};

// Buffers allocated inside a capture that failed: no graph ever backed them, so their owners'
// frees must not reach CUDA. The failed capture's graph (if CUDA returned one) is kept, so
// that these addresses are never handed out again.
std::mutex g_abandoned_mutex;
std::unordered_set<void*> g_abandoned;
std::vector<cudaGraph_t> g_abandoned_graphs;
std::atomic<bool> g_any_abandoned{false};

CaptureState* capture_of(int device) {
  if (device < 0 || device >= kMaxCudaDevices) return nullptr;
  return g_capture[device].load(std::memory_order_acquire);
}

// After a failed capture: frees what the step dropped (nothing will use it: the graph never
// ran) and marks what it allocated and kept as abandoned.
// What Graph::capture says when CUDA ended the capture with `ended` (not cudaSuccess).
std::string invalidated_capture(cudaError_t ended) {
  return std::string("Graph::capture: CUDA invalidated the capture (") + cudaGetErrorName(ended) +
         "): the step made a call that cannot be captured (a host synchronisation, cudaMalloc, a copy from "
         "pageable host memory, or a first-use initialisation: run the step eagerly once first)";
}

void abandon(CaptureState& state, cudaGraph_t graph, cudaStream_t stream) {
  for (void* p : state.kept) cudaFreeAsync(p, stream);
  state.kept.clear();
  if (state.allocations.empty()) {
    if (graph) cudaGraphDestroy(graph);
  } else {
    std::lock_guard<std::mutex> lock(g_abandoned_mutex);
    g_abandoned.insert(state.allocations.begin(), state.allocations.end());
    if (graph) g_abandoned_graphs.push_back(graph);
    g_any_abandoned.store(true, std::memory_order_release);
  }
  cudaGetLastError();  // the failed calls above must not surface at the next launch check
}

}  // namespace

bool capturing(int device) { return capture_of(device) != nullptr; }
bool any_capturing() { return g_captures.load(std::memory_order_relaxed) != 0; }

void fail_if_capturing(const char* op, int device, const char* why) {
  if (device < 0 || device >= kMaxCudaDevices) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TG_CUDA_CHECK(cudaStreamIsCapturing(stream(device), &status));
  if (status == cudaStreamCaptureStatusNone) return;
  TG_FAIL_AS(CaptureError, op, " cannot be captured into a CUDA graph: ",
             why ? why : "it makes the host wait for the GPU", " (cuda:", device,
             " is capturing; call it outside the captured step)");
}

ReplayShift capture_random_draw(int device, RandomStreamKey key, uint64_t count) {
  CaptureState* s = capture_of(device);
  if (!s) return {};
  std::lock_guard<std::mutex> lock(s->mutex);
  auto it = s->stream_slot.find(key);
  if (it == s->stream_slot.end()) {
    TG_CHECK_AS(CaptureError, s->spans.size() < static_cast<size_t>(kMaxRandomStreams),
                "dropout: a captured step may draw from at most ", kMaxRandomStreams, " random streams");
    it = s->stream_slot.emplace(key, static_cast<int>(s->spans.size())).first;
    s->spans.push_back(0);
  }
  s->spans[static_cast<size_t>(it->second)] += count;
  if (!s->rng_advance_queued) {
    // The graph's first random node: every draw after it in stream order sees this replay's index.
    advance_replay_kernel<<<1, 1, 0, stream(device)>>>(s->rng);
    TG_LAUNCH_CHECK();
    s->rng_advance_queued = true;
  }
  return {&s->rng->current, &s->rng->span[it->second]};
}

StepScalars capture_step_scalars(int device, std::size_t count) {
  CaptureState* s = capture_of(device);
  if (!s) return {};
  std::lock_guard<std::mutex> lock(s->mutex);
  TG_CHECK_AS(CaptureError, count <= kMaxStepScalars - s->scalars_used, "a captured step may use at most ",
              kMaxStepScalars, " per-step scalars (optimizer settings), asked for ", s->scalars_used + count);
  const std::size_t first = s->scalars_used;
  s->scalars_used += count;
  return {&s->rng->scalars[first], s->host_scalars + first};
}

bool on_replay(int device, std::function<void()> before, std::function<void()> after) {
  CaptureState* s = capture_of(device);
  if (!s) return false;
  std::lock_guard<std::mutex> lock(s->mutex);
  if (before) s->before.push_back(std::move(before));
  if (after) s->after.push_back(std::move(after));
  return true;
}

namespace detail {

bool capture_active() {
  return g_captures.load(std::memory_order_relaxed) != 0 || g_any_abandoned.load(std::memory_order_relaxed);
}

void note_allocation(int device, void* ptr) {
  CaptureState* s = capture_of(device);
  if (!s || !ptr) return;
  std::lock_guard<std::mutex> lock(s->mutex);
  s->allocations.insert(ptr);
}

bool keep_for_graph(int device, void* ptr, std::size_t) noexcept {
  try {
    if (g_any_abandoned.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(g_abandoned_mutex);
      if (g_abandoned.erase(ptr)) {
        if (g_abandoned.empty()) g_any_abandoned.store(false, std::memory_order_release);
        return true;
      }
    }
    CaptureState* s = capture_of(device);
    if (!s) return false;
    std::lock_guard<std::mutex> lock(s->mutex);
    if (s->allocations.erase(ptr)) return false;  // a graph allocation: freed inside the graph
    s->kept.push_back(ptr);
    return true;
  } catch (...) {
    return true;  // out of host memory: leak the buffer rather than break the capture
  }
}

}  // namespace detail

// ---- Graph ------------------------------------------------------------------------------

struct Graph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GraphDeviceState* rng = nullptr;
  std::unique_ptr<double[]> host_scalars = std::make_unique<double[]>(kMaxStepScalars);
  std::size_t scalars_used = 0;
  double* staging[kScalarStaging] = {};  // pinned
  cudaEvent_t staged[kScalarStaging] = {};
  int next_staging = 0;
  std::vector<uint64_t> spans;
  uint64_t global_span = 0;  // counters of the process-wide generator per step
  std::vector<void*> kept;
  std::vector<std::function<void()>> before, after;
  int64_t replays = 0;
  size_t nodes = 0;
};

Graph::Graph(Device device) : device_(device), impl_(std::make_unique<Impl>()) {
  TG_CHECK_AS(DeviceError, device.is_cuda(), "Graph: CUDA graphs need a GPU device, got ", device.str());
  check_device("Graph", device);
}

Graph::~Graph() {
  // Errors are ignored: a destructor must not throw.
  const int dev = device_.index;
  cudaSetDevice(dev);
  cudaStream_t s = stream(dev);
  if (impl_->exec || !impl_->kept.empty()) cudaStreamSynchronize(s);
  if (impl_->exec) cudaGraphExecDestroy(impl_->exec);
  if (impl_->graph) cudaGraphDestroy(impl_->graph);
  for (void* p : impl_->kept) cudaFreeAsync(p, s);
  if (impl_->rng) cudaFree(impl_->rng);
  for (int k = 0; k < kScalarStaging; ++k) {
    if (impl_->staging[k]) cudaFreeHost(impl_->staging[k]);
    if (impl_->staged[k]) cudaEventDestroy(impl_->staged[k]);
  }
  cudaGetLastError();
}

bool Graph::captured() const { return impl_->exec != nullptr; }
int64_t Graph::replays() const { return impl_->replays; }
size_t Graph::num_nodes() const { return impl_->nodes; }

void Graph::capture(const std::function<void()>& fn) {
  TG_CHECK(!captured(), "Graph::capture: this graph already holds a capture; make a new Graph for another");
  TG_CHECK_AS(CaptureError, !profile::profiler_active(),
              "Graph::capture: a tg::Profiler is active; its CUDA events cannot be captured "
              "(profile eager steps, or stop the profiler before capture)");
  const int dev = device_.index;
  set_device(dev);
  cudaStream_t s = stream(dev);
  if (!impl_->rng) {
    TG_CUDA_CHECK(cudaMalloc(&impl_->rng, sizeof(GraphDeviceState)));
    // Loads the kernel's module now: with lazy loading, drivers before CUDA 12.3 cannot load
    // a kernel first launched during capture.
    cudaFuncAttributes attributes;
    TG_CUDA_CHECK(cudaFuncGetAttributes(&attributes, advance_replay_kernel));
  }
  TG_CUDA_CHECK(cudaMemsetAsync(impl_->rng, 0, sizeof(GraphDeviceState), s));

  CaptureState state;
  state.rng = impl_->rng;
  state.host_scalars = impl_->host_scalars.get();
  CaptureState* none = nullptr;
  TG_CHECK_AS(CaptureError, g_capture[dev].compare_exchange_strong(none, &state), "Graph::capture: cuda:", dev,
              " is already capturing (one capture per device at a time)");
  g_captures.fetch_add(1);
  const RandomDraw rng_before = next_random_draw(0);
  // Thread-local mode: a call that is unsafe during capture (a synchronisation, cudaMalloc)
  // made by this thread invalidates the capture, so a mistake in the step is caught; other
  // threads (a DataLoader staging the next batch on its own stream) are left alone, which
  // the global mode would not do.
  cudaError_t begun = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  cudaGraph_t graph = nullptr;
  auto end_capture = [&] {
    const cudaError_t e = begun == cudaSuccess ? cudaStreamEndCapture(s, &graph) : begun;
    g_capture[dev].store(nullptr, std::memory_order_release);
    g_captures.fetch_sub(1);
    return e;
  };
  if (begun != cudaSuccess) {
    end_capture();
    cudaGetLastError();
    TG_CUDA_CHECK(begun);
  }
  try {
    fn();
  } catch (const CudaError& e) {
    // A call CUDA refuses during capture invalidates it; the next call into the capturing
    // stream then fails. Say what happened rather than only which call noticed.
    const cudaError_t ended = end_capture();
    abandon(state, graph, s);
    if (ended == cudaSuccess) throw;
    TG_FAIL_AS(CaptureError, invalidated_capture(ended), "; then: ", e.what());
  } catch (...) {
    end_capture();
    abandon(state, graph, s);
    throw;
  }
  const cudaError_t ended = end_capture();
  if (ended != cudaSuccess) {
    abandon(state, graph, s);
    TG_FAIL_AS(CaptureError, invalidated_capture(ended));
  }

  // The process-wide generator must have moved only by the draws the graph will shift.
  uint64_t global_span = 0;
  for (const auto& [key, slot] : state.stream_slot)
    if (key.global) global_span += state.spans[static_cast<size_t>(slot)];
  const RandomDraw rng_after = next_random_draw(0);
  if (rng_after.seed != rng_before.seed || rng_after.offset - rng_before.offset != global_span) {
    abandon(state, graph, s);
    TG_FAIL_AS(CaptureError, "Graph::capture: the step drew random numbers other than dropout's (tg::rand, randn, "
                             "uniform, an initialiser, or manual_seed): a graph would repeat them at every replay");
  }

  cudaGraphExec_t exec = nullptr;
  // Tensors made in the step and kept past it (the returned loss) are graph allocations
  // that the step does not free: relaunching needs them freed first.
  const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  if (made != cudaSuccess) {
    abandon(state, graph, s);
    TG_FAIL_AS(CudaError, "Graph::capture: cudaGraphInstantiateWithFlags failed: ", cudaGetErrorName(made), " (",
               cudaGetErrorString(made), ")");
  }
  size_t nodes = 0;
  TG_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  impl_->graph = graph;
  impl_->exec = exec;
  impl_->nodes = nodes;
  impl_->spans = std::move(state.spans);
  impl_->global_span = global_span;
  impl_->kept = std::move(state.kept);
  impl_->before = std::move(state.before);
  impl_->after = std::move(state.after);
  impl_->scalars_used = state.scalars_used;
  if (impl_->scalars_used) {
    for (int k = 0; k < kScalarStaging; ++k) {
      TG_CUDA_CHECK(cudaMallocHost(&impl_->staging[k], impl_->scalars_used * sizeof(double)));
      TG_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->staged[k], cudaEventDisableTiming));
    }
  }
  if (!impl_->spans.empty())
    TG_CUDA_CHECK(cudaMemcpyAsync(impl_->rng->span, impl_->spans.data(), impl_->spans.size() * sizeof(uint64_t),
                                  cudaMemcpyHostToDevice, s));
}

void Graph::replay() {
  TG_CHECK(captured(), "Graph::replay: nothing was captured (call capture first)");
  const int dev = device_.index;
  set_device(dev);
  for (const auto& f : impl_->before) f();
  // The capture moved the process-wide generator by one step; later replays move it too,
  // so that eager draws after the graphed steps continue where the graph left off.
  if (impl_->replays > 0 && impl_->global_span) next_random_draw(impl_->global_span);
  cudaStream_t s = stream(dev);
  if (impl_->scalars_used) {
    // The hooks wrote this replay's scalars; a pinned buffer that no queued copy still reads
    // carries them, ordered before the launch.
    const int k = impl_->next_staging;
    impl_->next_staging = (k + 1) % kScalarStaging;
    TG_CUDA_CHECK(cudaEventSynchronize(impl_->staged[k]));
    const std::size_t bytes = impl_->scalars_used * sizeof(double);
    std::memcpy(impl_->staging[k], impl_->host_scalars.get(), bytes);
    TG_CUDA_CHECK(cudaMemcpyAsync(impl_->rng->scalars, impl_->staging[k], bytes, cudaMemcpyHostToDevice, s));
    TG_CUDA_CHECK(cudaEventRecord(impl_->staged[k], s));
  }
  TG_CUDA_CHECK(cudaGraphLaunch(impl_->exec, s));
  ++impl_->replays;
  for (const auto& f : impl_->after) f();
}

}  // namespace tg::cuda
