// The NCCL side of a process group: one communicator over the group's ranks, its own
// stream, events that order it against the framework's stream, and a watchdog thread that
// aborts the communicator when a collective outlives the group's timeout (or NCCL reports
// an asynchronous error), so that no stream waits forever on a rank that is gone.
// Internal to dist/; nccl_comm.cpp implements it in builds with NCCL, nccl_none.cpp
// in builds without.
#pragma once
#include <memory>

#include "dist/process_group.h"

namespace tg::dist {

class NcclComm {
 public:
  virtual ~NcclComm() = default;
  // Collectives on CUDA tensors on the group's device. They return at once; the Work's
  // wait() makes the framework's stream wait for the collective.
  virtual std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> broadcast(Tensor& t, int root) = 0;
  virtual std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) = 0;
  virtual std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) = 0;
  // Blocks the host until every queued collective has finished (or throws DistError).
  virtual void synchronize() = 0;
  // True once the watchdog aborted the communicator; raise_if_aborted throws its reason.
  virtual bool aborted() const = 0;
  virtual void raise_if_aborted() const = 0;
};

// Binds the calling process to group.device, bootstraps the communicator (rank 0's unique
// id broadcast over MPI) and starts the watchdog.
std::unique_ptr<NcclComm> make_nccl_comm(ProcessGroup::Impl& group);

}  // namespace tg::dist
