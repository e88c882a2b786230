// tg::Profiler on the CPU: exact FLOP and byte counts of a small model (computed by hand
// below), calls and phases per op, the trace as JSON, one active profiler at a time, and
// nothing recorded while none is active.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "core/json.h"
#include "core/profiler.h"
#include "tapegrad/tapegrad.h"

using namespace tg;

// Counts the heap allocations of this program while g_count_allocations is on (the off
// path of an op scope must make none). GCC sees malloc'd memory reach free through inlined
// library code and takes it for a new/delete mismatch; the pair below is consistent.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
std::atomic<bool> g_count_allocations{false};
std::atomic<int> g_allocations{0};
}  // namespace
// Every non-aligned form is replaced, so that no allocation made by one form (the library's
// nothrow new in std::stable_sort, new[]) reaches a delete of another family (AddressSanitizer
// reports such a pair as a mismatch).
namespace {
void* counted_malloc(std::size_t n) noexcept {
  if (g_count_allocations.load()) ++g_allocations;
  return std::malloc(n ? n : 1);
}
}  // namespace
void* operator new(std::size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

// x (2, 1, 5, 5) -> Conv2d(1 -> 2, 3x3, bias) -> ReLU -> reshape (2, 18) -> Linear(18 -> 3)
// -> mse_loss against (2, 3); tape.backward; SGD (lr only) step.
struct Model {
  nn::Conv2d conv{{.in_channels = 1, .out_channels = 2, .kernel_size = 3}};
  nn::Linear fc{{.in_features = 18, .out_features = 3}};
  Tensor x = randn({2, 1, 5, 5});
  Tensor target = randn({2, 3});

  void step(nn::Optimizer& opt) {
    Tape tape;
    Tensor h = relu(conv.forward(x)).reshape({2, 18});
    Tensor loss = mse_loss(fc.forward(h), target);
    tape.backward(loss);
    opt.step();
    opt.zero_grad();
  }
  std::vector<Tensor> params() const {
    std::vector<Tensor> p = conv.parameters();
    for (const Tensor& t : fc.parameters()) p.push_back(t);
    return p;
  }
};

struct Totals {
  int calls = 0;
  double flops = 0, bytes = 0;
  std::set<profile::Phase> phases;
};

std::map<std::string, Totals> by_op(const std::vector<Profiler::Record>& recs) {
  std::map<std::string, Totals> m;
  for (const auto& r : recs) {
    Totals& t = m[r.op];
    ++t.calls;
    t.flops += r.flops;
    t.bytes += r.bytes;
    t.phases.insert(r.phase);
  }
  return m;
}

}  // namespace

TEST(Profiler, ExactCountsCallsAndPhasesOfASmallModel) {
  Model m;
  nn::SGD opt(m.params(), {.lr = 0.1});
  m.step(opt);  // warm-up outside the profiler: nothing of it is recorded
  Profiler prof;
  m.step(opt);
  m.step(opt);
  prof.stop();
  const auto ops = by_op(prof.records());
  // Forward, per step (f32: 4 bytes an element):
  //   conv2d: 2*N*K*C*R*S*P*Q = 2*2*2*1*3*3*3*3 = 648 + 36 bias adds; bytes (x 50 + w 18 + b 2 + y 36) * 4
  //   relu: 36 elements; (36 in + 36 out) * 4
  //   linear: 2*B*in*out = 2*2*18*3 = 216 + 6 bias adds; (x 36 + w 54 + b 3 + y 6) * 4
  //   mse_loss: 3 per element * 6; (6 + 6) * 4 + the scalar 4
  // Backward (x and the target need no grad):
  //   mse_loss: 3 * 6 for dpred; seed 4 + pred 24 + target 24 + dpred 24
  //   linear: dx and dw 216 each + db 6; dy 24 + 2 * (x 144 + w 216) + db 12
  //   relu: 36; (dy 36 + y 36 + dx 36) * 4
  //   conv2d: dw 648 + db 36; dy 144 + (x 200 + dw 72) + db 8
  // SGD (no momentum, no decay): 2 FLOPs per element; p read and written, g read: 12 bytes
  // an element; 4 parameters, 77 elements.
  const std::map<std::string, std::tuple<int, double, double, profile::Phase>> want = {
      {"conv2d", {2, 684, 424, profile::Phase::forward}},
      {"relu", {2, 36, 288, profile::Phase::forward}},
      {"linear", {2, 222, 396, profile::Phase::forward}},
      {"mse_loss", {2, 18, 52, profile::Phase::forward}},
      {"mse_loss (backward)", {2, 18, 76, profile::Phase::backward}},
      {"linear (backward)", {2, 438, 756, profile::Phase::backward}},
      {"relu (backward)", {2, 36, 432, profile::Phase::backward}},
      {"conv2d (backward)", {2, 684, 424, profile::Phase::backward}},
      {"SGD", {8, 154, 924, profile::Phase::optimizer}},
  };
  ASSERT_EQ(ops.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(ops.count(name)) << name;
    const Totals& t = ops.at(name);
    const auto& [calls, flops, bytes, phase] = w;
    EXPECT_EQ(t.calls, calls) << name;
    EXPECT_DOUBLE_EQ(t.flops, 2 * flops) << name;  // two steps
    EXPECT_DOUBLE_EQ(t.bytes, 2 * bytes) << name;
    EXPECT_EQ(t.phases, std::set<profile::Phase>{phase}) << name;
  }
  for (const auto& r : prof.records()) {
    EXPECT_EQ(r.device, Device::cpu());
    EXPECT_GE(r.ms, 0);
  }
  // Input shapes of the first op: x and the conv's weight and bias.
  const Profiler::Record& first = prof.records().front();
  EXPECT_EQ(first.op, "conv2d");
  ASSERT_EQ(first.input_shapes.size(), 3u);
  EXPECT_EQ(first.input_shapes[0], Shape({2, 1, 5, 5}));
  EXPECT_EQ(first.input_shapes[1], Shape({2, 1, 3, 3}));
  EXPECT_EQ(first.input_shapes[2], Shape({2}));

  std::ostringstream table;
  prof.report(table);
  std::printf("%s", table.str().c_str());
  EXPECT_NE(table.str().find("conv2d (backward) [backward]"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("SGD [optimizer]"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("total"), std::string::npos);
}

TEST(Profiler, NestedOpsAreCountedOnceByTheOutermost) {
  Tensor w = randn({3, 4}), x = randn({4});
  Profiler prof;
  linear(x, w);  // a vector: linear reshapes and calls itself on a batch of one
  prof.stop();
  const auto ops = by_op(prof.records());
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops.at("linear").calls, 1);
  EXPECT_DOUBLE_EQ(ops.at("linear").flops, 2 * 3 * 4);
}

TEST(Profiler, TraceIsChromeJsonWithOneEventPerOp) {
  Model m;
  nn::SGD opt(m.params(), {.lr = 0.1});
  Profiler prof;
  m.step(opt);
  prof.stop();
  const std::string path = ::testing::TempDir() + "tg_profiler_trace.json";
  prof.write_trace(path);
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  const json::Value doc = json::parse(text.str());
  const json::Value* events = doc.find("traceEvents");
  ASSERT_TRUE(events && events->is_array());
  std::multiset<std::string> names;
  int metadata = 0;
  for (const json::Value& e : events->items) {
    ASSERT_TRUE(e.is_object());
    const std::string ph = e.find("ph")->text;
    if (ph == "M") {
      ++metadata;
      continue;
    }
    ASSERT_EQ(ph, "X");
    names.insert(e.find("name")->text);
    for (const char* key : {"ts", "dur", "tid", "pid"}) EXPECT_TRUE(e.find(key) && e.find(key)->is_number()) << key;
    const json::Value* args = e.find("args");
    ASSERT_TRUE(args && args->is_object());
    EXPECT_TRUE(args->find("shapes")->is_array());
    EXPECT_TRUE(args->find("flops")->is_number());
    EXPECT_TRUE(args->find("bytes")->is_number());
    const std::string phase = args->find("phase")->text;
    EXPECT_TRUE(phase == "forward" || phase == "backward" || phase == "optimizer") << phase;
    if (e.find("name")->text == "conv2d") {
      EXPECT_EQ(args->find("flops")->text, "684");
      EXPECT_EQ(args->find("shapes")->items.size(), 3u);
    }
  }
  EXPECT_EQ(names.size(), prof.records().size());
  EXPECT_EQ(names.count("conv2d"), 1u);
  EXPECT_EQ(names.count("conv2d (backward)"), 1u);
  EXPECT_EQ(names.count("SGD"), 4u);
  EXPECT_EQ(metadata, 1);  // one track: this CPU thread
  std::remove(path.c_str());
}

// Op names are the user's bytes (an optimizer subclass names its own op): the trace parses
// whatever they hold, a byte that starts no UTF-8 sequence becoming U+FFFD.
TEST(Profiler, TraceOfAnOpNamedInBrokenUtf8StillParses) {
  struct OddSgd : nn::SGD {
    using nn::SGD::SGD;
    const char* name() const override { return "sgd\xff\xfe \xc3\xa9"; }
  };
  Model m;
  OddSgd opt(m.params(), {.lr = 0.1});
  Profiler prof;
  m.step(opt);
  prof.stop();
  const std::string path = ::testing::TempDir() + "tg_profiler_trace_utf8.json";
  prof.write_trace(path);
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  const json::Value doc = json::parse(text.str());
  int renamed = 0;
  for (const json::Value& e : doc.find("traceEvents")->items)
    renamed += e.find("name")->text == "sgd\xef\xbf\xbd\xef\xbf\xbd \xc3\xa9";
  EXPECT_EQ(renamed, 4);  // one per parameter update, as for SGD above
  std::remove(path.c_str());
}

TEST(Profiler, OnlyOneActiveAtATime) {
  Profiler a;
  EXPECT_THROW(Profiler b, Error);
  a.stop();
  Profiler c;  // a stopped profiler no longer counts
  EXPECT_TRUE(profile::enabled());
}

TEST(Profiler, NothingIsRecordedWithoutAnActiveProfiler) {
  { Profiler p; }
  Model m;
  nn::SGD opt(m.params(), {.lr = 0.1});
  const uint64_t before = profile::ops_recorded();
  m.step(opt);
  EXPECT_EQ(profile::ops_recorded(), before);
  if (!std::getenv("TG_NVTX")) {
    EXPECT_FALSE(profile::enabled());
  }
  // After stop() too: the scope sees no profiler.
  Profiler prof;
  prof.stop();
  m.step(opt);
  EXPECT_EQ(profile::ops_recorded(), before);
  EXPECT_TRUE(prof.records().empty());
}

TEST(Profiler, RecordsOpsOfOtherThreads) {
  Tensor a = randn({8, 8});
  Profiler prof;
  std::thread t([&] { relu(a); });
  t.join();
  relu(a);
  prof.stop();
  ASSERT_EQ(prof.records().size(), 2u);
  EXPECT_NE(prof.records()[0].thread, prof.records()[1].thread);
}

TEST(Profiler, CpuHasNoCeilings) {
  // Refused before anything is measured, in every build (a CUDA build would otherwise time
  // its GPU through CPU tensors).
  EXPECT_THROW(Profiler::ceilings(Device::cpu()), DeviceError);
  EXPECT_THROW(Profiler::refresh_ceilings(Device::cpu()), DeviceError);
  const std::string dir = Profiler::cache_dir();
  EXPECT_FALSE(dir.empty());
  EXPECT_NE(Profiler::ceilings_path("NVIDIA H100 80GB HBM3").find("ceilings-NVIDIA_H100_80GB_HBM3.json"),
            std::string::npos);
}

TEST(Profiler, GradientAccumulationIsAnOpOfTheBackward) {
  Tensor a = randn({4, 5});
  a.requires_grad_();
  Profiler prof;
  {
    Tape tape;
    tape.backward(sum(add(a, a)));  // a's two gradients are summed: 20 FLOPs, 3 * 80 bytes
  }
  prof.stop();
  const auto ops = by_op(prof.records());
  ASSERT_TRUE(ops.count("accumulate_grad"));
  EXPECT_EQ(ops.at("accumulate_grad").calls, 1);
  EXPECT_DOUBLE_EQ(ops.at("accumulate_grad").flops, 20);
  EXPECT_DOUBLE_EQ(ops.at("accumulate_grad").bytes, 240);
  EXPECT_EQ(ops.at("accumulate_grad").phases, std::set<profile::Phase>{profile::Phase::backward});
  EXPECT_EQ(ops.at("add").phases, std::set<profile::Phase>{profile::Phase::forward});
  EXPECT_EQ(ops.at("sum (backward)").phases, std::set<profile::Phase>{profile::Phase::backward});
  EXPECT_EQ(ops.at("add (backward)").phases, std::set<profile::Phase>{profile::Phase::backward});
  // add passes its gradient on to both inputs as is: no work.
  EXPECT_DOUBLE_EQ(ops.at("add (backward)").flops, 0);
  EXPECT_DOUBLE_EQ(ops.at("add (backward)").bytes, 0);
}

TEST(Profiler, BinaryBackwardCountsWhatItComputes) {
  Tensor a = randn({4, 5}), b = randn({5});
  a.requires_grad_();
  b.requires_grad_();
  Profiler prof;
  {
    Tape tape;
    tape.backward(sum(mul(a, b)));
  }
  prof.stop();
  const auto ops = by_op(prof.records());
  // ga = g * b: 20 FLOPs; reads g (80 bytes) and b (20), writes ga (80).
  // gb = sum over rows of g * a: 20 + 20 FLOPs; reads g (80) and a (80), writes gb (20).
  EXPECT_DOUBLE_EQ(ops.at("mul (backward)").flops, 60);
  EXPECT_DOUBLE_EQ(ops.at("mul (backward)").bytes, 180 + 180);
}

// Every op family has a scope in its forward and in the backward it records: each name
// below appears, in its phase, with the FLOPs its family declares.
TEST(Profiler, EveryOpFamilyIsProfiledForwardAndBackward) {
  auto leaf = [](Shape s) {
    Tensor t = randn(s);
    t.requires_grad_();
    return t;
  };
  Tensor x = leaf({2, 4, 6, 6}), w = leaf({4, 3, 3, 3}), lw = leaf({6}), lb = leaf({6});
  Tensor x3 = leaf({2, 3, 4, 4, 4}), w3 = leaf({4, 3, 3, 3, 3}), b3 = leaf({4}), g3 = leaf({4}), be3 = leaf({4});
  Tensor logits = leaf({3, 5}), targets = zeros({3}, {.dtype = DType::i64});
  Profiler prof;
  {
    Tape tape;
    std::vector<Tensor> parts = {
        layer_norm(x, {6}, lw, lb),
        gelu(x),
        softmax(x, -1),
        log_softmax(x, 1),
        dropout(x, 0.5),
        upsample_bilinear2d(x, {2.0}),
        conv_transpose2d(x, w),
        max_pool2d(x, {.kernel_size = {2}}),
        avg_pool2d(x, {.kernel_size = {2}}),
        narrow(x, 1, 0, 2),
        x.permute({0, 2, 3, 1}),
        cat({x, x}, 1),
        conv3d_group_norm_mean(x3, w3, b3, g3, be3, 2),
        cross_entropy(logits, targets),
    };
    Tensor total = zeros({});
    for (const Tensor& p : parts) total = add(total, sum(p));
    tape.backward(total);
  }
  prof.stop();
  const auto ops = by_op(prof.records());
  for (const char* name :
       {"layer_norm", "gelu", "softmax", "log_softmax", "dropout", "upsample_bilinear2d", "conv_transpose2d",
        "max_pool2d", "avg_pool2d", "narrow", "permute", "cat", "conv3d_group_norm_mean", "cross_entropy"}) {
    ASSERT_TRUE(ops.count(name)) << name;
    EXPECT_EQ(ops.at(name).phases, std::set<profile::Phase>{profile::Phase::forward}) << name;
    EXPECT_GT(ops.at(name).bytes, 0) << name;
    const std::string back = std::string(name) + " (backward)";
    ASSERT_TRUE(ops.count(back)) << back;
    EXPECT_EQ(ops.at(back).phases, std::set<profile::Phase>{profile::Phase::backward}) << back;
    EXPECT_GT(ops.at(back).bytes, 0) << back;
  }
  // A few declared counts: gelu 8 FLOPs per element, softmax 5, layer_norm 7, permute none;
  // the transposed convolution is the input-grad pass of a 4 -> 3 channel 3x3 convolution of
  // its 8x8 output: 2 * N * K * C * R * S * (6 * 6) with N=2, K=4, C=3.
  EXPECT_DOUBLE_EQ(ops.at("gelu").flops, 8.0 * 288);
  EXPECT_DOUBLE_EQ(ops.at("softmax").flops, 5.0 * 288);
  EXPECT_DOUBLE_EQ(ops.at("layer_norm").flops, 7.0 * 288);
  EXPECT_DOUBLE_EQ(ops.at("permute").flops, 0);
  EXPECT_DOUBLE_EQ(ops.at("conv_transpose2d").flops, 2.0 * 2 * 4 * 3 * 9 * 36);
}

TEST(Profiler, AnOpOpenWhenItsProfilerStopsIsNotRecordedByTheNext) {
  Tensor a = randn({4, 4});
  auto first = std::make_unique<Profiler>();
  std::unique_ptr<Profiler> second;
  {
    profile::OpScope outer("outer", [&] { return profile::OpInfo{{&a}, 1, 1}; });
    first.reset();                        // stops while "outer" is open
    second = std::make_unique<Profiler>();
    relu(a);                              // nested in "outer" on this thread: not recorded
    std::thread([&] { sigmoid(a); }).join();  // recorded by the second profiler: its record 0
  }  // "outer" ends under the second profiler and must leave its record 0 alone
  relu(a);
  second->stop();
  const auto& recs = second->records();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].op, "sigmoid");
  EXPECT_EQ(recs[1].op, "relu");
  EXPECT_NE(recs[0].thread, recs[1].thread);
}

TEST(Profiler, TheOffPathCallsNothingAndAllocatesNothing) {
  if (std::getenv("TG_NVTX")) GTEST_SKIP() << "TG_NVTX=1 turns the scopes on";
  Tensor a = randn({4, 4});
  int calls = 0;
  auto scoped = [&] {
    profile::OpScope scope("probe", [&] {
      ++calls;
      return profile::OpInfo{{&a}, 1, 1};  // allocates (the inputs vector) when called
    });
  };
  g_allocations = 0;
  g_count_allocations = true;
  scoped();
  g_count_allocations = false;
  EXPECT_EQ(g_allocations.load(), 0);
  EXPECT_EQ(calls, 0);
  Profiler prof;  // on: the lambda runs and the record is made
  g_count_allocations = true;
  scoped();
  g_count_allocations = false;
  EXPECT_GT(g_allocations.load(), 0);
  EXPECT_EQ(calls, 1);
}
