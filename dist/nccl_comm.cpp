// NCCL communicator, stream ordering and the watchdog (see nccl_comm.h).
//
// Ordering. A collective is queued on the group's stream after an event recorded on the
// framework's stream (so it sees every tensor the ops before it wrote), and records its own
// event; Work::wait() makes the framework's stream wait for that event. Buffers are freed
// stream-ordered on the framework's stream, so once it has waited, freeing a buffer the
// collective used is safe; a Work keeps its tensors alive until then.
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_context.h"
#include "dist/nccl_comm.h"
#include "dist/process_group_impl.h"

namespace tg::dist {

bool nccl_built() { return true; }

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i64: return ncclInt64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  TG_FAIL_AS(DTypeError, "dist: no NCCL type for dtype ", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

struct Event {
  cudaEvent_t e = nullptr;
  Event() { TG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// A collective the watchdog follows until its event completes.
struct Pending {
  std::shared_ptr<Event> done;
  Clock::time_point deadline;
  std::string op;
};

struct NcclWork final : Work {
  int device;
  std::shared_ptr<Event> done;
  std::vector<Tensor> keep;    // the buffers NCCL uses, alive until the stream has waited
  std::vector<Tensor> written; // their versions move on once the result is ordered
  bool waited = false;
  void wait() override {
    if (waited) return;
    waited = true;
    cuda::set_device(device);
    TG_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device), done->e, 0));
    for (const Tensor& t : written) t.bump_version();
    keep.clear();
  }
  ~NcclWork() override {
    try {
      wait();
    } catch (...) {  // a CUDA error here is reported by the next call that checks
    }
  }
};

class NcclCommImpl final : public NcclComm {
 public:
  explicit NcclCommImpl(ProcessGroup::Impl& group) : group_(group), device_(group.device.index) {
    cuda::set_device(device_);
    ncclUniqueId id{};
    if (group.rank == 0) check(ncclGetUniqueId(&id), "init (ncclGetUniqueId)");
    MPI_Request req;
    group.check_mpi(MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, group.comm, &req), "init");
    group.wait(req, "init (broadcast of NCCL's unique id)");
    check(ncclCommInitRank(&comm_, group.size, id, group.rank), "init (ncclCommInitRank)");
    int lo = 0, hi = 0;
    TG_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    // High priority: a bucket's reduction should start as soon as its gradients are ready,
    // not behind the backward kernels queued meanwhile.
    TG_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi));
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommImpl() override {
    if (!aborted_.load()) {
      try {
        synchronize();
      } catch (...) {
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    if (!aborted_.load()) ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    return run("all_reduce", {t}, {t}, [&] {
      return ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                           nccl_op(op), comm_, stream_);
    });
  }
  std::unique_ptr<Work> broadcast(Tensor& t, int root) override {
    return run("broadcast", {t}, {t}, [&] {
      return ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), root,
                           comm_, stream_);
    });
  }
  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) override {
    return run("all_gather", {in, out}, {out}, [&] {
      return ncclAllGather(in.raw_data(), out.raw_data(), static_cast<size_t>(in.numel()), nccl_type(in.dtype()),
                           comm_, stream_);
    });
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    return run("reduce_scatter", {in, out}, {out}, [&] {
      return ncclReduceScatter(in.raw_data(), out.raw_data(), static_cast<size_t>(out.numel()),
                               nccl_type(in.dtype()), nccl_op(op), comm_, stream_);
    });
  }

  void synchronize() override {
    cuda::set_device(device_);
    // Poll rather than cudaStreamSynchronize: the watchdog may abort a stuck collective,
    // and the host must not be blocked inside CUDA when it does.
    for (;;) {
      raise_if_aborted();
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) TG_CUDA_CHECK(q);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    raise_if_aborted();
  }

  bool aborted() const override { return aborted_.load(); }
  void raise_if_aborted() const override {
    if (!aborted_.load()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    throw DistError(reason_);
  }

 private:
  void check(ncclResult_t r, const char* op) {
    if (r == ncclSuccess) return;
    group_.fail("dist::" + std::string(op) + ": rank " + std::to_string(group_.rank) + ": NCCL failed: " +
                ncclGetErrorString(r) + " (" + ncclGetLastError(comm_) + ")");
  }

  template <class Launch>
  std::unique_ptr<Work> run(const char* op, std::vector<Tensor> keep, std::vector<Tensor> written, Launch launch) {
    raise_if_aborted();
    cuda::set_device(device_);
    Event ready;
    TG_CUDA_CHECK(cudaEventRecord(ready.e, cuda::stream(device_)));
    TG_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready.e, 0));
    check(launch(), op);
    auto work = std::make_unique<NcclWork>();
    work->device = device_;
    work->done = std::make_shared<Event>();
    TG_CUDA_CHECK(cudaEventRecord(work->done->e, stream_));
    work->keep = std::move(keep);
    work->written = std::move(written);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back({work->done, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(group_.timeout_s)),
                          op});
    }
    return work;
  }

  // The watchdog: every few milliseconds, drops finished collectives, and aborts the
  // communicator when one is past its deadline or NCCL reports an asynchronous error.
  void watch() {
    cuda::set_device(device_);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(10));
      if (stop_ || aborted_.load()) continue;
      std::string reason;
      const auto now = Clock::now();
      std::erase_if(pending_, [&](const Pending& p) {
        const cudaError_t q = cudaEventQuery(p.done->e);
        if (q == cudaSuccess) return true;
        if (q != cudaErrorNotReady && reason.empty())
          reason = "dist::" + p.op + ": rank " + std::to_string(group_.rank) + ": CUDA error " +
                   cudaGetErrorString(q) + " while the collective ran";
        else if (now > p.deadline && reason.empty())
          reason = "dist::" + p.op + ": rank " + std::to_string(group_.rank) + " of " +
                   std::to_string(group_.size) + " timed out after " + std::to_string(group_.timeout_s) +
                   " s waiting for the other ranks (one of them may have failed, hung, or called a different "
                   "collective); the NCCL communicator was aborted. Raise TG_DIST_TIMEOUT if the wait is "
                   "legitimate";
        return false;
      });
      ncclResult_t async = ncclSuccess;
      if (reason.empty() && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress)
        reason = "dist: rank " + std::to_string(group_.rank) + ": NCCL reported an asynchronous error: " +
                 ncclGetErrorString(async) + "; the communicator was aborted";
      if (reason.empty()) continue;
      reason_ = reason;
      aborted_.store(true);
      pending_.clear();
      lock.unlock();
      ncclCommAbort(comm_);  // makes the stuck kernels return, so no stream waits forever
      lock.lock();
    }
  }

  ProcessGroup::Impl& group_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;  // pending_, reason_, stop_
  std::condition_variable wake_;
  std::vector<Pending> pending_;
  std::string reason_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<NcclComm> make_nccl_comm(ProcessGroup::Impl& group) {
  return std::make_unique<NcclCommImpl>(group);
}

}  // namespace tg::dist
