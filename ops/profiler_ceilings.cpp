// The profiler's ceilings: the peak rates of a GPU, measured with tapegrad's own kernels
// (a device-to-device copy, tg::matmul at FP32 and at TF32) once per GPU model and cached
// as JSON under Profiler::cache_dir(). Here rather than in core/ because it runs ops.
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "core/precision.h"
#include "core/profiler.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "ops/linear.h"
#if TG_CUDA
#include "core/cuda_context.h"
#endif

namespace tg {
namespace {

std::mutex g_ceilings_mutex;
std::map<std::string, Profiler::Ceilings> g_ceilings;  // by cache file path, this process

std::string gpu_name(Device d) {
  TG_CHECK_AS(DeviceError, d.is_cuda(), "Profiler::ceilings: ", d,
              " is not a GPU; the roofline ceilings are measured per GPU model");
#if TG_CUDA
  check_device("Profiler::ceilings", d);
  cudaDeviceProp prop{};
  TG_CUDA_CHECK(cudaGetDeviceProperties(&prop, d.index));
  return prop.name;
#else
  TG_FAIL_AS(UnsupportedError, "Profiler::ceilings: ", d, " needs a build with CUDA (this one has TG_CUDA=OFF)");
#endif
}

std::string num(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

// Reads a cache file; false if it is missing or unreadable (then it is measured again).
bool read_cache(const std::string& path, const std::string& gpu, Profiler::Ceilings& c) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream text;
  text << f.rdbuf();
  try {
    const json::Value v = json::parse(text.str());
    const json::Value* name = v.find("gpu");
    const json::Value* copy = v.find("copy_gbps");
    const json::Value* fp32 = v.find("fp32_tflops");
    const json::Value* tf32 = v.find("tf32_tflops");
    if (!name || !copy || !fp32 || !tf32 || !name->is_string() || name->text != gpu || !copy->is_number() ||
        !fp32->is_number() || !tf32->is_number())
      return false;
    c = {gpu, std::stod(copy->text), std::stod(fp32->text), std::stod(tf32->text)};
    return c.copy_gbps > 0 && c.fp32_tflops > 0 && c.tf32_tflops > 0;
  } catch (const std::exception&) {
    return false;
  }
}

void write_cache(const std::string& path, const Profiler::Ceilings& c) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    TG_CHECK_AS(IOError, f.good(), "Profiler: cannot write the ceilings cache ", tmp);
    f << "{\"gpu\":" << json::quote(c.gpu) << ",\"copy_gbps\":" << num(c.copy_gbps)
      << ",\"fp32_tflops\":" << num(c.fp32_tflops) << ",\"tf32_tflops\":" << num(c.tf32_tflops) << "}\n";
    TG_CHECK_AS(IOError, f.good(), "Profiler: failed writing ", tmp);
  }
  std::filesystem::rename(tmp, path);  // whole or not at all, for a concurrent reader
}

// Milliseconds per call of fn on device d: one warm-up call, then `reps` timed together.
template <class F>
double time_ms(Device d, int reps, F&& fn) {
  fn();
  GpuTimer timer(d);
  timer.start();
  for (int i = 0; i < reps; ++i) fn();
  timer.stop();
  return timer.elapsed_ms() / reps;
}

Profiler::Ceilings measure(Device d, const std::string& gpu) {
  profile::Unrecorded unrecorded;  // an active profiler does not see these runs
  Profiler::Ceilings c;
  c.gpu = gpu;
  {
    // Copy: 256 MiB each way, far past any cache; read + written bytes per second.
    const int64_t n = int64_t{64} << 20;
    Tensor a = zeros({n}, {.device = d}), b = zeros({n}, {.device = d});
    const double ms = time_ms(d, 10, [&] { b.copy_(a); });
    c.copy_gbps = 2.0 * static_cast<double>(a.nbytes()) / (ms * 1e6);
  }
  {
    // Matrix rate: a square f32 product large enough to fill any current GPU.
    const int64_t m = 8192;
    Tensor a = ones({m, m}, {.device = d}), b = ones({m, m}, {.device = d});
    const double flops = 2.0 * m * m * m;
    {
      PrecisionGuard p(Precision::FP32);
      c.fp32_tflops = flops / (time_ms(d, 3, [&] { matmul(a, b); }) * 1e9);
    }
    {
      PrecisionGuard p(Precision::TF32);
      c.tf32_tflops = flops / (time_ms(d, 3, [&] { matmul(a, b); }) * 1e9);
    }
  }
  return c;
}

Profiler::Ceilings get(Device d, bool refresh) {
  const std::string gpu = gpu_name(d);
  const std::string path = Profiler::ceilings_path(gpu);
  std::lock_guard<std::mutex> lock(g_ceilings_mutex);
  if (!refresh) {
    if (auto it = g_ceilings.find(path); it != g_ceilings.end()) return it->second;
  }
  Profiler::Ceilings c;
  if (refresh || !read_cache(path, gpu, c)) {
    c = measure(d, gpu);
    write_cache(path, c);
  }
  g_ceilings[path] = c;
  return c;
}

}  // namespace

Profiler::Ceilings Profiler::ceilings(Device device) { return get(device, false); }
Profiler::Ceilings Profiler::refresh_ceilings(Device device) { return get(device, true); }

}  // namespace tg
