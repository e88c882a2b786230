// Inside the process group: the MPI state every collective uses, the timed wait for MPI
// requests, and the NCCL side (dist/nccl_comm.h) when the build has it. Not installed for
// users; dist/*.cpp include it.
#pragma once
// MPI's C API only: the deprecated C++ bindings some MPIs pull in by default are not used.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "dist/process_group.h"

namespace tg::dist {

class NcclComm;  // dist/nccl_comm.h (builds with NCCL only)

// What a collective takes besides its tensor, for verify_same (root -1: none).
struct CollectiveArgs {
  std::optional<ReduceOp> reduce_op;
  int64_t root = -1;
};

struct ProcessGroup::Impl {
  ProcessGroupOptions options;
  double timeout_s = 600;
  bool we_initialized_mpi = false;
  MPI_Comm comm = MPI_COMM_NULL;  // our own duplicate of MPI_COMM_WORLD (errors return)
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  Device device = Device::cpu();
  std::unique_ptr<NcclComm> nccl;

  // Set once, by the first failure (a timeout, an MPI or NCCL error); every later use of
  // the group throws it again.
  std::atomic<bool> failed{false};
  std::mutex failure_mutex;
  std::string failure;

  // Records the failure (the first one wins) and throws DistError with `message`.
  [[noreturn]] void fail(const std::string& message);
  // Throws DistError when the group has failed before; `op` names the caller.
  void check_usable(const char* op);
  // Waits for an MPI request, polling, until done or timeout_s (then fail()).
  void wait(MPI_Request& request, const char* op);
  // Throws DistError naming `op` unless `rc` is MPI_SUCCESS.
  void check_mpi(int rc, const char* op);
  // Start a collective with no checks or verification (the callers checked): the public
  // collectives and DDP's buckets share these.
  std::unique_ptr<Work> start_all_reduce(Tensor& t, ReduceOp op);
  std::unique_ptr<Work> start_broadcast(Tensor& t, int root);
  // With options.verify_collectives: throws DistError on every rank unless all ranks pass
  // a tensor of this shape and dtype (and device kind), and the same reduce op and root.
  void verify_same(const char* op, const Tensor& t, CollectiveArgs args = {});
};

// MPI's datatype for a tensor dtype.
MPI_Datatype mpi_type(DType t);

}  // namespace tg::dist
