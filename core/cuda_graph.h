// CUDA graphs: record the work a training step queues on tapegrad's stream once, replay it
// with one launch per step. A small model's step is bound by the host (the tape, the
// allocator, dozens of kernel launches); a replay costs one cudaGraphLaunch.
//
//   tg::Tensor x = ..., y = ...;              // static input and target: allocated once
//   auto step = [&] {
//     tg::Tape tape;
//     tg::Tensor loss = tg::cross_entropy(model(x), y);
//     tape.backward(loss);
//     opt.step();
//     opt.zero_grad();
//     return loss;
//   };
//   tg::cuda::GraphedStep graphed(step);      // eager for `warmup` calls, then captured
//   for (auto& batch : data) {
//     x.copy_(batch.input);                   // refill the static buffers before each call
//     y.copy_(batch.target);
//     tg::Tensor loss = graphed();            // the same tensor every graphed call
//   }
//
// Or by hand: `Graph g; g.capture(step); g.replay(); g.replay(); ...` (capture queues nothing:
// the first replay runs the captured step). docs/cuda_graphs.md has the whole story; in short:
// - A captured step reads and writes the same addresses at every replay. Inputs are static
//   tensors the caller refills (copy_) before each replay; parameters and optimizer state
//   must exist before capture (an eager step creates them: GraphedStep's warm-up).
// - Tensors created inside the step and freed inside it become the graph's own memory.
//   Tensors created inside and kept (the returned loss, grads kept after the step) are the
//   graph's outputs: same address, contents rewritten by each replay, valid until the next.
//   Tensors created before capture and dropped inside it are kept alive by the Graph.
// - Ops that need the host (item, to(cpu), clip_grad_norm_'s norm) throw tg::CaptureError
//   naming the op before they queue anything; the capture is then abandoned and the
//   stream usable again. Tensors created inside a failed capture are invalid: drop them
//   (zero_grad) before the next eager step.
// - Dropout's masks advance per replay, as eager steps' would (see ReplayShift in random.h),
//   and so do Adam's bias corrections and step counts (StepScalars below).
//   Other host-side settings are read at capture (an SGD learning rate changed later is not
//   seen; Adam's is).
// - cross_entropy's target check still reports a bad target, at the next replay or call.
// - No tg::Profiler may be active during capture (nor start inside one); replays are not
//   broken down by the profiler: profile eager steps.
//
// In a build without CUDA these classes exist and throw tg::UnsupportedError.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "device.h"
#include "random.h"
#include "tensor.h"

namespace tg::cuda {

// True while a tg::cuda::Graph captures on `device`'s stream (false in CPU builds).
bool capturing(int device);
bool any_capturing();  // on any device
// Throws tg::CaptureError "<op> cannot be captured into a CUDA graph: ..." when tapegrad's
// stream of `device` is capturing (asked of CUDA: cudaStreamIsCapturing, so captures begun
// outside tg::cuda::Graph count too). Call it before queueing anything.
void fail_if_capturing(const char* op, int device, const char* why = nullptr);
inline void fail_if_capturing(const char* op, Device d, const char* why = nullptr) {
  if (d.is_cuda()) fail_if_capturing(op, d.index, why);
}

// For random ops: a draw of `count` counters from one stream of counters, made while
// `device` is capturing, gets the shift its kernel must add to the offset at each replay.
// Streams are told apart by `key`: the process-wide generator (global = true), or an
// explicit seed (nn::Dropout's own stream). Outside capture: {} (no shift).
struct RandomStreamKey {
  bool global = true;
  uint64_t seed = 0;
};
ReplayShift capture_random_draw(int device, RandomStreamKey key, uint64_t count);

// For ops whose scalar settings change every step (Adam's bias corrections, its learning
// rate under a schedule): while `device` captures, reserves `count` doubles in the graph's
// memory, which the captured kernel reads instead of taking the values as arguments. `host`
// is their host side: the caller writes this step's values now and, from a before-replay
// hook (on_replay), the next step's before each later replay; the Graph uploads them ahead
// of each launch, in stream order. Outside capture: both null.
struct StepScalars {
  const double* device = nullptr;
  double* host = nullptr;
};
StepScalars capture_step_scalars(int device, std::size_t count);

// For ops with host-side follow-up work (cross_entropy's target check): while `device` is
// capturing, registers functions the Graph calls before and after each launch. Returns
// false (and registers nothing) when not capturing.
bool on_replay(int device, std::function<void()> before, std::function<void()> after);

class Graph {
 public:
  explicit Graph(Device device = Device::cuda());
  ~Graph();  // waits for the last replay, then frees what the graph kept alive
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Runs `fn` with tapegrad's stream of device() capturing (nothing it queues runs now),
  // then instantiates the graph. Throws tg::CaptureError if fn used something that cannot
  // be captured (the capture is abandoned, the stream usable again, the graph empty), and
  // rethrows whatever fn threw. A graph captures once.
  void capture(const std::function<void()>& fn);
  // Queues the captured work (asynchronous, like any op). Throws if nothing was captured.
  void replay();

  bool captured() const;
  int64_t replays() const;  // launches so far
  size_t num_nodes() const;  // nodes of the captured graph (kernels, copies, memory nodes)
  Device device() const { return device_; }

  struct Impl;

 private:
  Device device_;
  std::unique_ptr<Impl> impl_;
};

struct GraphedStepOptions {
  // Eager calls before the capture: they create the grads and optimizer state, run the
  // one-time initialisations (cross_entropy's check buffers, kernel attributes) and fill
  // the stream-ordered pool. At least 1.
  int warmup = 2;
  Device device = Device::cuda();
};

// A training step called like a function: the first options.warmup calls run `step`
// eagerly, the next one captures it and replays it, every later one only replays. Every
// call performs exactly one step, so N calls give the parameters N eager calls would.
// Returns what `step` returned: from the capture on, the same (graph-owned) tensor, whose
// contents each call rewrites.
class GraphedStep {
 public:
  explicit GraphedStep(std::function<Tensor()> step, GraphedStepOptions options = {});
  Tensor operator()();
  bool graphed() const { return graph_ != nullptr && graph_->captured(); }
  const Graph* graph() const { return graph_.get(); }

 private:
  std::function<Tensor()> step_;
  GraphedStepOptions options_;
  int calls_ = 0;
  std::unique_ptr<Graph> graph_;
  Tensor output_;
};

namespace detail {
// Hooks of core/storage.cpp. A buffer allocated while its device captures is a graph
// allocation and may be freed inside the capture; one allocated before cannot (CUDA allows
// only graph allocations in a captured free), so the Graph keeps it until it is destroyed.
bool capture_active();  // any device: one relaxed load
void note_allocation(int device, void* ptr);
// true: the Graph took the buffer (do not free it now). Never throws.
bool keep_for_graph(int device, void* ptr, std::size_t bytes) noexcept;
}  // namespace detail

}  // namespace tg::cuda
