// tg::Profiler on the GPU: device times (from CUPTI's activity records, and from events where
// TG_PROFILER_EVENTS=1 asks for them) are positive for ops that run kernels, the counts match the
// CPU's, the ceilings are measured, written to the cache and read back, and the report has a
// roofline.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/test_util.h"
#include "core/json.h"
#include "core/profiler.h"

using namespace tg;
using namespace tg::test;

namespace {

// Conv2d -> GroupNorm -> ReLU -> mean pool -> Linear -> mse_loss, one training step.
void train_step(Device d, nn::Module& model, nn::Optimizer& opt, const Tensor& x, const Tensor& target) {
  Tape tape;
  Tensor loss = mse_loss(model.forward(x), target);
  tape.backward(loss);
  opt.step();
  opt.zero_grad();
  synchronize(d);
}

std::shared_ptr<nn::Sequential> small_cnn(Device d) {
  TensorOptions t{.device = d};
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(
          nn::Conv2dOptions{.in_channels = 3, .out_channels = 8, .kernel_size = {3, 3}, .padding = {1}}, t),
      std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 4, .num_channels = 8}, t),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MeanPool>(),
      std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 8, .out_features = 4}, t)});
}

std::map<std::string, std::pair<int, double>> counts(const std::vector<Profiler::Record>& recs) {
  std::map<std::string, std::pair<int, double>> m;
  for (const auto& r : recs) {
    ++m[r.op].first;
    m[r.op].second += r.flops;
  }
  return m;
}

}  // namespace

namespace {

// Sets an environment variable for the scope (the profiler reads TG_PROFILER_EVENTS when it starts).
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvGuard() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Events time every GPU op (an event pair brackets even one that launches nothing). CUPTI sums
// the activities an op ran: the convolutions and linears, which always launch kernels, must get
// positive times, every op a finite, non-negative one, and the first kernel cannot start before
// the profiler did.
void check_device_times(bool events) {
  std::map<std::string, std::pair<int, double>> per_device[2];
  bool from_cupti = false;
  for (int k = 0; k < 2; ++k) {
    const Device d = k == 0 ? Device::cpu() : Device::cuda();
    manual_seed(7);
    auto model = small_cnn(d);
    Tensor x = randn({4, 3, 16, 16}).to(d), target = randn({4, 4}).to(d);
    nn::SGD opt(model->parameters(), {.lr = 0.01});
    train_step(d, *model, opt, x, target);  // warm-up
    EnvGuard env("TG_PROFILER_EVENTS", events ? "1" : nullptr);
    Profiler prof;
    train_step(d, *model, opt, x, target);
    prof.stop();
    if (d.is_cuda()) from_cupti = prof.device_times_from_cupti();
    ASSERT_FALSE(prof.records().empty());
    double conv_and_linear = 0;
    for (const auto& r : prof.records()) {
      EXPECT_EQ(r.device, d) << r.op;
      if (!d.is_cuda()) continue;
      EXPECT_TRUE(std::isfinite(r.ms) && r.ms >= 0) << r.op << ": " << r.ms;
      if (events || r.op.rfind("conv2d", 0) == 0 || r.op.rfind("linear", 0) == 0) {
        EXPECT_GT(r.ms, 0) << r.op;
      }
      if (r.op.rfind("conv2d", 0) == 0 || r.op.rfind("linear", 0) == 0) conv_and_linear += r.ms;
      if (from_cupti && r.ms > 0) {
        EXPECT_GE(r.start_us, 0) << r.op;
      }
    }
    if (d.is_cuda()) {
      EXPECT_GT(conv_and_linear, 0);
    }
    per_device[k] = counts(prof.records());
  }
  EXPECT_EQ(per_device[0], per_device[1]);
  if (events) {
    EXPECT_FALSE(from_cupti) << "TG_PROFILER_EVENTS=1 must give event times";
  } else if (!from_cupti) {
    std::printf("CUPTI could not be had here (another tool holds it?): the events were checked\n");
  }
}

}  // namespace

TEST(ProfilerCuda, GpuTimesArePositiveAndCountsMatchTheCpu) {
  TG_REQUIRE_GPU();
  check_device_times(/*events=*/false);
}

TEST(ProfilerCuda, EventTimesWhereAskedFor) {
  TG_REQUIRE_GPU();
  check_device_times(/*events=*/true);
}

TEST(ProfilerCuda, CeilingsAreMeasuredCachedAndReadBack) {
  TG_REQUIRE_GPU();
  const std::string dir = ::testing::TempDir() + "tg_profiler_cache";
  std::filesystem::remove_all(dir);
  ::setenv("TG_CACHE_DIR", dir.c_str(), 1);
  const Profiler::Ceilings c = Profiler::refresh_ceilings(Device::cuda());
  EXPECT_GT(c.copy_gbps, 50);
  EXPECT_GT(c.fp32_tflops, 0.5);
  EXPECT_GT(c.tf32_tflops, 0.5);
  const std::string path = Profiler::ceilings_path(c.gpu);
  EXPECT_EQ(path.rfind(dir, 0), 0u) << path;
  ASSERT_TRUE(std::filesystem::exists(path)) << path;

  // The file is JSON with the measured values; an edited file is what the next process reads.
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  const json::Value v = json::parse(text.str());
  EXPECT_EQ(v.find("gpu")->text, c.gpu);
  EXPECT_NEAR(std::stod(v.find("copy_gbps")->text), c.copy_gbps, 1e-6 * c.copy_gbps);
  // A cache file is read, not re-measured: an edited one in another cache folder (a folder
  // this process has not used) gives exactly its values.
  const std::string dir2 = dir + "/other";
  ::setenv("TG_CACHE_DIR", dir2.c_str(), 1);
  const std::string path2 = Profiler::ceilings_path(c.gpu);
  std::filesystem::create_directories(dir2);
  {
    std::ofstream f(path2);
    f << "{\"gpu\":" << json::quote(c.gpu) << ",\"copy_gbps\":1000,\"fp32_tflops\":50,\"tf32_tflops\":400}";
  }
  const Profiler::Ceilings read = Profiler::ceilings(Device::cuda());
  EXPECT_EQ(read.copy_gbps, 1000);
  EXPECT_EQ(read.fp32_tflops, 50);
  EXPECT_EQ(read.tf32_tflops, 400);
  // Deleting the file and refreshing measures again and rewrites it.
  std::filesystem::remove(path2);
  const Profiler::Ceilings again = Profiler::refresh_ceilings(Device::cuda());
  EXPECT_TRUE(std::filesystem::exists(path2));
  EXPECT_GT(again.copy_gbps, 50);
  EXPECT_NE(again.copy_gbps, 1000);

  // The report has a roofline for GPU ops and names the cache file.
  Tensor a = randn({512, 512}).to(Device::cuda());
  Profiler prof;
  matmul(a, a);
  relu(a);
  prof.stop();
  std::ostringstream table;
  prof.report(table);
  std::printf("%s", table.str().c_str());
  EXPECT_NE(table.str().find("matmul [forward]"), std::string::npos);
  EXPECT_NE(table.str().find(path2), std::string::npos);
  const std::string trace = dir + "/trace.json";
  prof.write_trace(trace);
  std::stringstream t;
  t << std::ifstream(trace).rdbuf();
  const json::Value doc = json::parse(t.str());
  int gpu_events = 0;
  for (const json::Value& e : doc.find("traceEvents")->items)
    if (e.find("ph")->text == "X") {
      EXPECT_EQ(e.find("tid")->text, "1");  // cuda:0's track
      ++gpu_events;
    }
  EXPECT_EQ(gpu_events, 2);
  std::filesystem::remove_all(dir);
  ::unsetenv("TG_CACHE_DIR");
}
