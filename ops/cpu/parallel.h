// How the CPU kernels use several threads (core/threads.h): tasks on the pool of
// core/thread_pool.h, at most tg::get_num_threads() threads, over independent outputs.
//
// The rule every kernel keeps: an output element is computed by one thread with the same
// arithmetic whatever the thread count, so results are bit-identical for any count. Where a
// kernel reduces over the dimension it splits (sums, losses, weight gradients), the partition
// into partial sums is fixed by the problem (chunked_sum, kFixedGroups), never by the threads,
// and the partials are added in their order. Callables passed here must not throw: the pool
// cannot carry an exception back (kernels validate before they loop).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../../core/thread_pool.h"
#include "../../core/threads.h"

namespace tg::cpu {

// Work (about one multiply-add or element each) below which a loop stays on the calling
// thread: waking a team costs a few microseconds, the cost of ~10^4 simple element updates.
inline constexpr int64_t kParallelGrain = int64_t(1) << 15;

// Threads for `items` items of `cost` work each: no more than the items, and 1 when the whole
// loop is cheaper than about two grains.
inline int threads_for(int64_t items, int64_t cost) {
  if (items < 2) return 1;
  const int64_t c = std::max<int64_t>(cost, 1);
  const int64_t work = items > INT64_MAX / c ? INT64_MAX : items * c;  // saturating
  if (work < 2 * kParallelGrain) return 1;
  const int64_t by_work = work / kParallelGrain;
  return static_cast<int>(std::min<int64_t>({int64_t(get_num_threads()), items, by_work}));
}

// Ranges per thread: a few, so a thread that the OS deschedules holds up little work.
inline constexpr int64_t kRangesPerThread = 4;

// Calls f(begin, end) on contiguous, disjoint ranges covering [0, items), in parallel, so a
// task can set up scratch space once for its range. The ranges depend on the thread count:
// f's result for an item must not depend on the range it came in.
template <class F>
void parallel_ranges(int64_t items, int64_t cost, F&& f) {
  if (items <= 0) return;
  const int nt = threads_for(items, cost);
  if (nt <= 1) {
    f(int64_t(0), items);
    return;
  }
  struct Job {
    F* f;
    int64_t items, ranges;
  } job{&f, items, std::min<int64_t>(items, nt * kRangesPerThread)};
  detail::run_tasks(job.ranges, nt, [](void* ctx, int64_t r) {
    const Job& j = *static_cast<const Job*>(ctx);
    const int64_t base = j.items / j.ranges, extra = j.items % j.ranges;
    const int64_t begin = r * base + std::min(r, extra);
    (*j.f)(begin, begin + base + (r < extra ? 1 : 0));
  }, &job);
}

// Calls f(i) for every i in [0, items), each on one thread.
template <class F>
void parallel_for(int64_t items, int64_t cost, F&& f) {
  parallel_ranges(items, cost, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) f(i);
  });
}

// Elements per partial sum of chunked_sum: fixed, so the association of the sum is too.
inline constexpr int64_t kSumChunk = int64_t(1) << 14;

// Sum over [0, n) where f(begin, end) returns the partial sum (double) of a range:
// partials over fixed chunks of kSumChunk elements, computed in parallel and added in chunk
// order. Up to kSumChunk elements it is f(0, n) itself, the plain serial sum.
template <class F>
double chunked_sum(int64_t n, int64_t cost, F&& f) {
  if (n <= kSumChunk) return f(int64_t(0), n);
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> part(static_cast<size_t>(chunks));
  parallel_for(chunks, kSumChunk * cost, [&](int64_t c) {
    part[static_cast<size_t>(c)] = f(c * kSumChunk, std::min(n, (c + 1) * kSumChunk));
  });
  double s = 0;
  for (double p : part) s += p;
  return s;
}

// Partial sums for reductions whose partials are whole tensors (conv's weight gradient over
// the batch): at most this many, fixed whatever the thread count.
inline constexpr int64_t kFixedGroups = 8;

}  // namespace tg::cpu
