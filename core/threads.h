// Threads of the CPU backend. The CPU kernels (ops/cpu) split their work over this many
// threads: the calling thread and the workers of a pool (core/thread_pool.h).
//
// Results never depend on the count: a kernel splits only over independent outputs, each
// computed with the same arithmetic whichever thread runs it, and a reduction over the split
// dimension adds fixed partitions of the work (fixed by the problem, not the thread count) in
// a fixed order. So set_num_threads(1) and set_num_threads(8) give bit-identical tensors.
//
// The default is the machine's hardware concurrency, or TG_NUM_THREADS when that environment
// variable holds a positive integer (read once, on first use; any other value is an error).
#pragma once

namespace tg {

// n <= 0 restores the default. More than kMaxThreads is an error (tg::Error).
void set_num_threads(int n);
// The count the CPU kernels use now (>= 1).
int get_num_threads();
// The default: TG_NUM_THREADS if set, else the hardware concurrency (>= 1).
int default_num_threads();

inline constexpr int kMaxThreads = 1024;

// Sets the thread count for a scope and restores the previous one on exit.
class NumThreadsGuard {
 public:
  explicit NumThreadsGuard(int n) : previous_(get_num_threads()) { set_num_threads(n); }
  ~NumThreadsGuard() { set_num_threads(previous_); }
  NumThreadsGuard(const NumThreadsGuard&) = delete;
  NumThreadsGuard& operator=(const NumThreadsGuard&) = delete;

 private:
  int previous_;
};

}  // namespace tg
