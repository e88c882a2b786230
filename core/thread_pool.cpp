#include "core/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace tg::detail {
namespace {

class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  // Runs a job on the calling thread and `helpers` workers; the caller holds `busy`.
  void run(int64_t tasks, int helpers, TaskFn fn, void* ctx) {
    {
      std::lock_guard<std::mutex> lock(m_);
      while (static_cast<int>(workers_.size()) < helpers)
        workers_.emplace_back([this, index = static_cast<int>(workers_.size())] { worker(index); });
      fn_ = fn;
      ctx_ = ctx;
      tasks_ = tasks;
      helpers_ = helpers;
      next_.store(0);
      finished_ = 0;
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(m_);
    // All tasks done, and no worker still inside work() (it reads this job's fields).
    done_.wait(lock, [&] { return finished_ == tasks_ && inside_ == 0; });
    fn_ = nullptr;
  }

  std::mutex busy;  // one job at a time

 private:
  void worker(int index) {
    uint64_t seen = 0;
    for (;;) {
      // Kernels come back to back in a training step: watch for the next job for a short
      // while (yielding, so a busy machine's other threads run) before sleeping, which
      // would cost a wake-up of tens of microseconds per kernel.
      const auto until = std::chrono::steady_clock::now() + kWatch;
      while (generation_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
      std::unique_lock<std::mutex> lock(m_);
      wake_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
      if (index >= helpers_ || fn_ == nullptr) continue;  // not needed, or already over
      ++inside_;
      lock.unlock();
      work();
      lock.lock();
      if (--inside_ == 0) done_.notify_all();
    }
  }

  static constexpr std::chrono::microseconds kWatch{200};

  // Claims and runs tasks until none is left.
  void work() {
    int64_t ran = 0;
    for (int64_t t = next_.fetch_add(1); t < tasks_; t = next_.fetch_add(1), ++ran) fn_(ctx_, t);
    if (ran == 0) return;
    std::lock_guard<std::mutex> lock(m_);
    finished_ += ran;
    if (finished_ == tasks_) done_.notify_all();
  }

  std::mutex m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
  std::atomic<uint64_t> generation_{0};  // changed under m_, watched without it
  // The current job: written under m_ before the workers are woken, read by them after.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t tasks_ = 0, finished_ = 0;
  int helpers_ = 0, inside_ = 0;
  std::atomic<int64_t> next_{0};
};

Pool& pool() {
  static Pool p;
  return p;
}

void run_serial(int64_t tasks, TaskFn fn, void* ctx) {
  for (int64_t t = 0; t < tasks; ++t) fn(ctx, t);
}

}  // namespace

void run_tasks(int64_t tasks, int threads, TaskFn fn, void* ctx) {
  if (threads <= 1 || tasks <= 1) return run_serial(tasks, fn, ctx);
  Pool& p = pool();
  std::unique_lock<std::mutex> busy(p.busy, std::try_to_lock);
  if (!busy.owns_lock()) return run_serial(tasks, fn, ctx);  // nested, or another caller's job
  p.run(tasks, threads - 1, fn, ctx);
}

}  // namespace tg::detail
