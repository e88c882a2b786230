// GraphedStep (both builds), and the CUDA graph API of a build without CUDA: the queries say
// "not capturing" and the classes throw tg::UnsupportedError. The CUDA build's Graph and
// registry are in cuda_graph.cu.
#include "core/cuda_graph.h"

#include <utility>

#include "core/error.h"

namespace tg::cuda {

GraphedStep::GraphedStep(std::function<Tensor()> step, GraphedStepOptions options)
    : step_(std::move(step)), options_(options) {
  TG_CHECK_AS(UnsupportedError, TG_CUDA, "GraphedStep: CUDA graphs need a build with CUDA (this one has none)");
  TG_CHECK_AS(DeviceError, options_.device.is_cuda(), "GraphedStep: CUDA graphs need a GPU device, got ",
              options_.device.str());
  TG_CHECK(static_cast<bool>(step_), "GraphedStep: the step function is empty");
  TG_CHECK(options_.warmup >= 1, "GraphedStep: warmup must be at least 1 eager step (it creates the grads and "
                                 "optimizer state the graph reuses), got ",
           options_.warmup);
}

Tensor GraphedStep::operator()() {
  if (calls_ < options_.warmup) {
    Tensor out = step_();
    ++calls_;
    return out;
  }
  if (!graph_) {
    auto graph = std::make_unique<Graph>(options_.device);
    Tensor out;
    graph->capture([&] { out = step_(); });
    graph_ = std::move(graph);
    output_ = std::move(out);
  }
  graph_->replay();
  ++calls_;
  return output_;
}

#if !TG_CUDA

namespace {
[[noreturn]] void no_cuda(const char* what) {
  TG_FAIL_AS(UnsupportedError, what, ": CUDA graphs need a build with CUDA (this one has none)");
}
}  // namespace

bool capturing(int) { return false; }
bool any_capturing() { return false; }
void fail_if_capturing(const char*, int, const char*) {}
ReplayShift capture_random_draw(int, RandomStreamKey, uint64_t) { return {}; }
StepScalars capture_step_scalars(int, std::size_t) { return {}; }
bool on_replay(int, std::function<void()>, std::function<void()>) { return false; }

namespace detail {
bool capture_active() { return false; }
void note_allocation(int, void*) {}
bool keep_for_graph(int, void*, std::size_t) noexcept { return false; }
}  // namespace detail

struct Graph::Impl {};

Graph::Graph(Device device) : device_(device) { no_cuda("Graph"); }
Graph::~Graph() = default;
bool Graph::captured() const { return false; }
int64_t Graph::replays() const { return 0; }
size_t Graph::num_nodes() const { return 0; }
void Graph::capture(const std::function<void()>&) { no_cuda("Graph::capture"); }
void Graph::replay() { no_cuda("Graph::replay"); }

#endif

}  // namespace tg::cuda
