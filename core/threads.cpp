#include "core/threads.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace tg {
namespace {

// 0 = not set: the default applies.
std::atomic<int> g_threads{0};

int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();  // 0 when unknown
  return n == 0 ? 1 : static_cast<int>(n < unsigned(kMaxThreads) ? n : unsigned(kMaxThreads));
}

int read_default() {
  const char* env = std::getenv("TG_NUM_THREADS");
  if (env == nullptr || *env == '\0') return hardware_threads();
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(env, &end, 10);
  TG_CHECK(errno == 0 && *end == '\0' && v >= 1 && v <= kMaxThreads, "TG_NUM_THREADS='", std::string(env),
           "' is not a thread count in [1, ", kMaxThreads, "]");
  return static_cast<int>(v);
}

}  // namespace

int default_num_threads() {
  static const int n = read_default();  // the environment is read once
  return n;
}

void set_num_threads(int n) {
  TG_CHECK(n <= kMaxThreads, "set_num_threads(", n, "): at most ", kMaxThreads, " threads");
  g_threads.store(n <= 0 ? 0 : n);
}

int get_num_threads() {
  const int n = g_threads.load();
  return n > 0 ? n : default_num_threads();
}

}  // namespace tg
