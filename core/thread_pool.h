// The CPU backend's thread pool: run_tasks(tasks, threads, fn, ctx) calls fn(ctx, t) for every
// t in [0, tasks) on up to `threads` threads (the caller and threads - 1 pool workers), and
// returns when all are done. Tasks are claimed one at a time from a shared counter, so a
// thread the OS has descheduled delays nobody: the others take its tasks. Idle workers watch
// for the next job for ~200 us, yielding the CPU each time round, then sleep on a condition
// variable: nothing spins at full speed, because on a machine busy with other work spinning
// threads take the CPU from the very threads they wait for. Hence not OpenMP: libgomp's
// barriers spin by default (a CPU training run measured 3x slower than on one thread, on a
// 2-core machine with other work on it), and its wait policy is only set by an environment
// variable read before main.
//
// A call made while the pool is busy (another thread's call, or a task calling run_tasks)
// runs its tasks on the calling thread. fn must not throw.
#pragma once
#include <cstdint>

namespace tg::detail {

using TaskFn = void (*)(void* ctx, int64_t task);
void run_tasks(int64_t tasks, int threads, TaskFn fn, void* ctx);

}  // namespace tg::detail
