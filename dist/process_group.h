// A process group: the processes of one data-parallel job, one per GPU (or per CPU slot),
// and the collectives that combine tensors across them. Built on MPI (launch, ranks, CPU
// tensors, bootstrap) and NCCL (CUDA tensors); no transport of our own.
//
//   mpirun -np 4 ./train                      # one host, four processes
//   mpirun -np 8 -H host1:4,host2:4 ./train   # two hosts
//   srun -n 8 ./train                         # Slurm, where MPI is built with PMIx
//
//   tg::dist::ProcessGroup pg;                // MPI_Init, rank, GPU = local rank, NCCL
//   tg::Tensor t = tg::ones({4}, {.device = pg.device()});
//   pg.all_reduce(t);                         // every rank: t = 4 ones * size()
//
// Ranks and devices. rank() and size() are MPI's; local_rank() is the rank among the
// processes of the same host (MPI's shared-memory split). A process binds to GPU
// local_rank() % (GPUs visible) when the build has NCCL and a GPU is visible; device() says
// which (CPU otherwise), and is where DDP keeps the model.
//
// Collectives. Every rank calls the same collectives in the same order with tensors of the
// same shape and dtype. CUDA tensors (on device()) go through NCCL on the group's own
// stream: it waits for the work already queued on the framework's stream, and the
// framework's stream waits for the collective, so the host does not block and results are
// ordered before any later op. CPU tensors go through MPI. The same program therefore runs
// on CPUs (tests, CI) and GPUs. By default each public collective first checks, with a small
// MPI exchange, that every rank passes the same shape and dtype, and throws DistError naming
// the op and both shapes otherwise (verify_collectives = false skips that exchange).
//
// Failure. A collective that waits longer than timeout_s for the other ranks throws
// DistError on this rank (GPU: a watchdog aborts the NCCL communicator, so a queued
// collective cannot hang the stream; the next collective or wait throws). An exception that
// escapes main on any rank aborts the whole job (a std::terminate handler calls MPI_Abort),
// so the other ranks do not wait for a rank that is gone; a rank that dies is reported by
// mpirun, which ends the others. After a failure the group cannot be used again, and its
// destructor aborts the job instead of waiting in MPI_Finalize.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../core/tensor.h"

namespace tg::dist {

enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

struct ProcessGroupOptions {
  // Seconds a collective may wait for the other ranks. <= 0: $TG_DIST_TIMEOUT, else 600.
  double timeout_s = 0;
  // Bind to a GPU and create the NCCL communicator when the build has NCCL and a GPU is
  // visible. false: MPI only (CUDA tensors are then refused).
  bool use_gpu = true;
  // Check, before each public collective, that all ranks pass the same shape and dtype.
  bool verify_collectives = true;
  // Install a std::terminate handler that aborts the whole job (see Failure above).
  bool abort_job_on_terminate = true;
};

// A collective in flight. wait() orders what follows after it: for CUDA tensors the
// framework's stream waits (the host does not block); for CPU tensors the host blocks until
// the data is there (or throws DistError on timeout). The destructor waits if wait() was
// not called, so a dropped Work never leaves a buffer in use.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class ProcessGroup {
 public:
  // Initialises MPI when the program has not (and then finalises it in the destructor).
  // One ProcessGroup per process: a second one while the first lives throws.
  explicit ProcessGroup(ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  Device device() const;    // the GPU this rank uses, or the CPU
  bool has_nccl() const;    // CUDA tensors can take part in collectives
  double timeout_s() const;

  // In place on every rank: t = op over all ranks' t. avg needs a floating dtype.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum);
  std::unique_ptr<Work> all_reduce_async(Tensor& t, ReduceOp op = ReduceOp::sum);
  // In place: every rank's t = root's t.
  void broadcast(Tensor& t, int root = 0);
  // Returns {size(), t.shape...}: slice r is rank r's t.
  Tensor all_gather(const Tensor& t);
  // t of shape {size() * m, ...}: returns {m, ...}, rank r's slice r of the reduction.
  Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::sum);
  void barrier();

  // Host-side helpers for agreement checks (MPI, any build): root's string on every rank;
  // true on every rank when `value` is true on every rank.
  std::string broadcast_string(const std::string& s, int root = 0);
  bool all_true(bool value);

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// True when this build has NCCL (CUDA tensors can take part in collectives on a GPU).
bool nccl_built();

}  // namespace tg::dist
