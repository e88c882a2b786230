// CUDA-graphed training steps against eager ones (core/cuda_graph.h), for the small models
// where the host, not the GPU, sets the pace: the cnn example's model on 16x16 images and
// the ResNet-18-style GroupNorm net of examples/resnet.cpp, at small batches. Every step
// refills a static input and label tensor from a ring of random batches, runs forward,
// cross-entropy, backward and Adam.
//
// Before any timing, each (model, batch) trains a few steps eagerly and graphed from the same
// weights on the same batches: the parameters must agree bit for bit, or the program stops
// with an error (exit status 1) and times nothing.
//
// Then it measures the host's cost per op: an op launch (a small tensor, no tape), a tape
// record (the same op with a tape active and an input that requires grad, minus the launch)
// and a backward entry (Tape::backward over a chain of those ops, per entry).
//
// And the profiler's cost (issue 28: on, <= 5% of a step; off, unmeasurable): the eager step of
// each (model, batch) with no tg::Profiler alive, with one recording, with one constructed and
// stopped, and with none again. The two runs without one show the run-to-run noise.
//
//   tg_graphs [--models cnn,resnet] [--batches 8,32] [--steps 200] [--warmup 20]
//             [--size 32] [--width 64] [--precision fp32|tf32] [--json]
//
// --json prints one JSON object per line (bench/graphs/run.sh reads them); otherwise a table.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/example.h"
#include "common/resnet.h"
#include "common/shapes_cnn.h"
#include "tapegrad/tapegrad.h"

namespace {

namespace nn = tg::nn;
using Clock = std::chrono::steady_clock;

constexpr int64_t kClasses = ex::kShapeClasses;
constexpr int kRing = 4;  // distinct batches the steps cycle through

struct Config {
  int64_t steps = 200, warmup = 20, size = 32, width = 64;
  bool json = false;
  std::string precision = "fp32";
};


struct Setup {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<nn::Optimizer> opt;
  tg::Tensor x, y;                              // the static buffers every step reads
  std::vector<tg::Tensor> inputs, labels;       // the ring of batches
  std::function<tg::Tensor()> step;
};

std::unique_ptr<Setup> make_setup(const std::string& model, int64_t batch, const Config& c, uint64_t seed) {
  const tg::Device d = tg::Device::cuda();
  tg::manual_seed(seed);
  auto s = std::make_unique<Setup>();
  tg::Shape in_shape;
  if (model == "cnn") {
    s->model = ex::make_shapes_cnn(d);
    in_shape = {batch, 1, 16, 16};
  } else {
    const int64_t groups = std::min<int64_t>(32, std::max<int64_t>(1, c.width / 2));
    s->model = std::make_shared<ex::ResNet18GN>(
        ex::ResNetOptions{.in_channels = 3, .classes = kClasses, .width = c.width, .groups = groups}, tg::TensorOptions{.device = d});
    in_shape = {batch, 3, c.size, c.size};
  }
  s->opt = std::make_unique<nn::Adam>(s->model->parameters(), nn::AdamOptions{.lr = 1e-3});
  s->x = tg::Tensor::empty(in_shape, {.device = d});
  s->y = tg::Tensor::empty({batch}, {.dtype = tg::DType::i64, .device = d});
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> label(0, kClasses - 1);
  for (int k = 0; k < kRing; ++k) {
    s->inputs.push_back(tg::randn(in_shape, {.device = d}));
    std::vector<int64_t> t(static_cast<size_t>(batch));
    for (auto& v : t) v = label(gen);
    s->labels.push_back(tg::from_vector(t, {batch}, {.dtype = tg::DType::i64, .device = d}));
  }
  Setup* p = s.get();
  p->step = [p] {
    tg::Tape tape;
    tg::Tensor loss = tg::cross_entropy((*p->model)(p->x), p->y);
    tape.backward(loss);
    p->opt->step();
    p->opt->zero_grad();
    return loss;
  };
  return s;
}

void refill(Setup& s, int k) {
  s.x.copy_(s.inputs[static_cast<size_t>(k % kRing)]);
  s.y.copy_(s.labels[static_cast<size_t>(k % kRing)]);
}

// Eager and graphed training from the same start must end at the same parameters.
void check_graphed_matches_eager(const std::string& model, int64_t batch, const Config& c) {
  constexpr int kSteps = 6;
  auto eager = make_setup(model, batch, c, 7);
  auto graphed = make_setup(model, batch, c, 7);
  tg::cuda::GraphedStep graphed_step(graphed->step, {.warmup = 2});
  for (int k = 0; k < kSteps; ++k) {
    refill(*eager, k);
    const double le = eager->step().item();
    refill(*graphed, k);
    const double lg = graphed_step().item();
    TG_CHECK(le == lg, "tg_graphs: ", model, " batch ", batch, ": step ", k, " loss graphed ", lg, " != eager ", le);
  }
  const auto pe = eager->model->parameters(), pg = graphed->model->parameters();
  for (size_t i = 0; i < pe.size(); ++i)
    TG_CHECK(pe[i].to_vector<float>() == pg[i].to_vector<float>(), "tg_graphs: ", model, " batch ", batch,
             ": parameter ", i, " differs between the graphed and the eager run after ", kSteps, " steps");
}

// Milliseconds per call of `fn`, from the host clock over `steps` calls between two waits
// for the GPU: the rate of a training loop, whichever of host and GPU is the bottleneck.
double ms_per_call(const std::function<void(int)>& fn, int64_t warmup, int64_t steps) {
  for (int64_t k = 0; k < warmup; ++k) fn(static_cast<int>(k));
  tg::synchronize(tg::Device::cuda());
  const auto t0 = Clock::now();
  for (int64_t k = 0; k < steps; ++k) fn(static_cast<int>(k));
  tg::synchronize(tg::Device::cuda());
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / static_cast<double>(steps);
}

struct StepTimes {
  double eager_ms = 0, graphed_ms = 0;
};

StepTimes time_steps(const std::string& model, int64_t batch, const Config& c) {
  StepTimes t;
  {
    auto s = make_setup(model, batch, c, 11);
    t.eager_ms = ms_per_call([&](int k) { refill(*s, k); s->step(); }, c.warmup, c.steps);
  }
  {
    auto s = make_setup(model, batch, c, 11);
    tg::cuda::GraphedStep graphed(s->step, {.warmup = 2});
    t.graphed_ms = ms_per_call([&](int k) { refill(*s, k); graphed(); }, c.warmup, c.steps);
  }
  return t;
}

// The eager step timed four times on one setup, in this order: no profiler alive (off), a
// tg::Profiler recording (on), a profiler constructed and stop()ed (stopped: the only disabled
// state it has besides none alive), and no profiler again. An off cost is measurable only if
// it exceeds the difference between the two off runs. TG_NVTX=1 is read once at start-up, so
// under it every run also pushes NVTX ranges; main reports that as nvtx_env.
struct ProfilerOverhead {
  double off_ms = 0, on_ms = 0, stopped_ms = 0, off_again_ms = 0;
  double ops_per_step = 0;  // records the on run made per step (its warm-up steps included)
  double off_mean() const { return 0.5 * (off_ms + off_again_ms); }
  double pct(double ms) const { return 100.0 * (ms / off_mean() - 1.0); }
  double off_spread_pct() const { return 100.0 * std::abs(off_again_ms - off_ms) / off_mean(); }
};

ProfilerOverhead profiler_overhead(const std::string& model, int64_t batch, const Config& c) {
  auto s = make_setup(model, batch, c, 13);
  const std::function<void(int)> step = [&](int k) { refill(*s, k); s->step(); };
  // profile::ops_recorded() counts every record ever made: it must not move while off.
  auto off = [&] {
    const uint64_t before = tg::profile::ops_recorded();
    const double ms = ms_per_call(step, c.warmup, c.steps);
    TG_CHECK(tg::profile::ops_recorded() == before, "tg_graphs: ", model, " batch ", batch,
             ": ops were recorded while no profiler was recording");
    return ms;
  };
  ProfilerOverhead o;
  o.off_ms = off();
  {
    tg::Profiler prof;
    o.on_ms = ms_per_call(step, c.warmup, c.steps);
    prof.stop();
    // Reading the records waits for their events: after the timing, like a report would be.
    const std::vector<tg::Profiler::Record>& recs = prof.records();
    const int64_t steps = c.warmup + c.steps;
    bool backward = false, optimizer = false;
    for (const auto& r : recs) {
      backward = backward || r.phase == tg::profile::Phase::backward;
      optimizer = optimizer || r.phase == tg::profile::Phase::optimizer;
    }
    TG_CHECK(static_cast<int64_t>(recs.size()) >= steps && backward && optimizer, "tg_graphs: ", model, " batch ",
             batch, ": the profiler recorded ", recs.size(), " ops over ", steps,
             " steps (backward: ", backward, ", optimizer: ", optimizer, "); the on timing measured nothing");
    o.ops_per_step = static_cast<double>(recs.size()) / static_cast<double>(steps);
  }
  {
    tg::Profiler prof;
    prof.stop();
    o.stopped_ms = off();
  }
  o.off_again_ms = off();
  return o;
}

// Host microseconds per call of `fn` over n calls (the GPU keeps up: the ops are tiny).
double host_us(const std::function<void()>& fn, int n) {
  for (int k = 0; k < n / 10; ++k) fn();
  tg::synchronize(tg::Device::cuda());
  const auto t0 = Clock::now();
  for (int k = 0; k < n; ++k) fn();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n;
  tg::synchronize(tg::Device::cuda());
  return us;
}

struct HostCosts {
  double launch_us = 0, record_us = 0, backward_entry_us = 0;
};

HostCosts host_costs() {
  const tg::Device d = tg::Device::cuda();
  tg::Tensor x = tg::randn({256}, {.device = d});
  HostCosts h;
  constexpr int kOps = 4000;
  h.launch_us = host_us([&] { tg::relu(x); }, kOps);
  tg::Tensor w = tg::randn({256}, {.device = d}).requires_grad_();
  {
    tg::Tape tape;
    const double recorded = host_us([&] { tg::relu(w); }, kOps);
    h.record_us = recorded - h.launch_us;
  }
  // A chain of relu entries: backward runs one entry (a relu backward kernel) per op.
  constexpr int kChain = 2000, kRepeats = 5;
  double total = 0;
  for (int r = 0; r < kRepeats; ++r) {
    tg::Tape tape;
    tg::Tensor h_chain = w;
    for (int k = 0; k < kChain; ++k) h_chain = tg::relu(h_chain);
    tg::Tensor loss = tg::sum(h_chain);
    tg::synchronize(d);
    const auto t0 = Clock::now();
    tape.backward(loss);
    total += std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kChain;
    tg::synchronize(d);
    w.zero_grad();
  }
  h.backward_entry_us = total / kRepeats;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"json"});
    Config c;
    const std::vector<std::string> models = args.get_list("models", {"cnn", "resnet"});
    const std::vector<std::string> batches = args.get_list("batches", {"8", "32"});
    c.steps = args.get_int("steps", 200);
    c.warmup = args.get_int("warmup", 20);
    c.size = args.get_int("size", 32);
    c.width = args.get_int("width", 64);
    c.precision = args.get("precision", "fp32");
    c.json = args.has("json");
    args.finish("[--models cnn,resnet] [--batches 8,32] [--steps N] [--warmup N] [--size N] [--width N] "
                "[--precision fp32|tf32] [--json]");
    TG_CHECK(tg::cuda_available(), "tg_graphs: needs a GPU");
    TG_CHECK(c.precision == "fp32" || c.precision == "tf32", "--precision: fp32 or tf32, got ", c.precision);
    TG_CHECK(c.steps > 0 && c.warmup > 2, "--steps must be positive and --warmup above 2 (the graphed warm-up)");
    for (const std::string& m : models) TG_CHECK(m == "cnn" || m == "resnet", "--models: cnn and/or resnet, got ", m);
    tg::set_precision(c.precision == "tf32" ? tg::Precision::TF32 : tg::Precision::FP32);

    for (const std::string& m : models)
      for (const std::string& b : batches) check_graphed_matches_eager(m, std::stoll(b), c);
    if (!c.json) std::printf("graphed steps match eager steps bit for bit (every model and batch)\n");

    if (!c.json) std::printf("| model | batch | eager ms/step | graphed ms/step | graphed/eager |\n|---|---|---|---|---|\n");
    for (const std::string& m : models) {
      for (const std::string& b : batches) {
        const int64_t batch = std::stoll(b);
        const StepTimes t = time_steps(m, batch, c);
        if (c.json) {
          for (const auto& [mode, ms] : {std::pair{"eager", t.eager_ms}, std::pair{"graphed", t.graphed_ms}})
            std::printf("{\"framework\": \"tapegrad\", \"model\": \"%s\", \"batch\": %lld, \"mode\": \"%s\", "
                        "\"precision\": \"%s\", \"step_ms\": %.5f, \"checked\": true}\n",
                        m.c_str(), static_cast<long long>(batch), mode, c.precision.c_str(), ms);
        } else {
          std::printf("| %s | %lld | %.3f | %.3f | %.2f |\n", m.c_str(), static_cast<long long>(batch), t.eager_ms,
                      t.graphed_ms, t.graphed_ms / t.eager_ms);
        }
        std::fflush(stdout);
      }
    }
    // No profiler is alive here: anything enabled is NVTX from TG_NVTX=1.
    const bool nvtx_env = tg::profile::enabled();
    if (!c.json)
      std::printf("\nprofiler overhead%s\n| model | batch | off ms/step | on ms/step | stopped ms/step "
                  "| off again ms/step | on %% | stopped %% | off vs off %% | ops/step |\n"
                  "|---|---|---|---|---|---|---|---|---|---|\n",
                  nvtx_env ? " (TG_NVTX=1: every run pushes NVTX ranges)" : "");
    for (const std::string& m : models) {
      for (const std::string& b : batches) {
        const int64_t batch = std::stoll(b);
        const ProfilerOverhead o = profiler_overhead(m, batch, c);
        if (c.json) {
          std::printf("{\"framework\": \"tapegrad\", \"profiler_overhead\": true, \"model\": \"%s\", "
                      "\"batch\": %lld, \"precision\": \"%s\", \"nvtx_env\": %s, \"off_ms\": %.5f, "
                      "\"on_ms\": %.5f, \"stopped_ms\": %.5f, \"off_again_ms\": %.5f, \"on_overhead_pct\": %.3f, "
                      "\"stopped_overhead_pct\": %.3f, \"off_spread_pct\": %.3f, \"ops_per_step\": %.1f}\n",
                      m.c_str(), static_cast<long long>(batch), c.precision.c_str(), nvtx_env ? "true" : "false",
                      o.off_ms, o.on_ms, o.stopped_ms, o.off_again_ms, o.pct(o.on_ms), o.pct(o.stopped_ms),
                      o.off_spread_pct(), o.ops_per_step);
        } else {
          std::printf("| %s | %lld | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f | %.0f |\n", m.c_str(),
                      static_cast<long long>(batch), o.off_ms, o.on_ms, o.stopped_ms, o.off_again_ms, o.pct(o.on_ms),
                      o.pct(o.stopped_ms), o.off_spread_pct(), o.ops_per_step);
        }
        std::fflush(stdout);
      }
    }
    const HostCosts h = host_costs();
    if (c.json) {
      std::printf("{\"framework\": \"tapegrad\", \"host\": true, \"op_launch_us\": %.3f, \"tape_record_us\": %.3f, "
                  "\"backward_entry_us\": %.3f}\n",
                  h.launch_us, h.record_us, h.backward_entry_us);
    } else {
      std::printf("\nhost cost: %.2f us per op launch, %.2f us per tape record, %.2f us per backward entry\n",
                  h.launch_us, h.record_us, h.backward_entry_us);
    }
    return 0;
  });
}
