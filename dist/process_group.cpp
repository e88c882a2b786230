#include "dist/process_group.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <thread>

#include "dist/nccl_comm.h"
#include "dist/process_group_impl.h"

namespace tg::dist {

namespace {

std::atomic<bool> g_group_alive{false};
// For the terminate handler, which cannot reach the group.
std::atomic<int> g_rank{0}, g_size{1};

[[noreturn]] void abort_job_on_terminate() {
  std::string what = "no active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = std::string("uncaught exception: ") + x.what();
    } catch (...) {
      what = "uncaught exception of unknown type";
    }
  }
  std::fprintf(stderr, "tapegrad dist: rank %d of %d is terminating (%s); aborting the job so that the other "
               "ranks do not wait for it\n", g_rank.load(), g_size.load(), what.c_str());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

double default_timeout() {
  if (const char* env = std::getenv("TG_DIST_TIMEOUT")) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    TG_CHECK_AS(DistError, end != env && *end == '\0' && v > 0,
                "ProcessGroup: TG_DIST_TIMEOUT must be a positive number of seconds, got '", env, "'");
    return v;
  }
  return 600;
}

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, len);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    default: return MPI_SUM;  // avg: a sum, then divided by size()
  }
}

// t /= n on the host (avg after MPI's sum).
void divide_in_place(const Tensor& t, int n) {
  if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= static_cast<float>(n);
  } else {
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= n;
  }
}

// An MPI collective in flight on CPU tensors.
struct MpiWork final : Work {
  ProcessGroup::Impl* group;
  MPI_Request request = MPI_REQUEST_NULL;
  const char* op;
  Tensor keep;            // the buffer MPI reads and writes
  int divide_by = 0;      // avg: divide after the sum
  bool waited = false;
  MpiWork(ProcessGroup::Impl* g, const char* name, Tensor t) : group(g), op(name), keep(std::move(t)) {}
  void wait() override {
    if (waited) return;
    waited = true;
    group->wait(request, op);
    if (divide_by > 1) divide_in_place(keep, divide_by);
    keep.bump_version();
  }
  ~MpiWork() override {
    try {
      wait();
    } catch (...) {  // the failure is recorded in the group; the next use throws it
    }
  }
};

void check_tensor(const char* op, const ProcessGroup::Impl& g, const Tensor& t) {
  TG_CHECK(t.defined(), "dist::", op, ": undefined tensor");
  // MPI and NCCL would be handed the wrong element type (mpi_type, nccl_type): refused.
  TG_CHECK_AS(DTypeError, !is_half(t.dtype()), "dist::", op, ": ", describe(t), ": ", dtype_name(t.dtype()),
              " tensors are storage-only for now; convert with .to(DType::f32)");
  if (t.device().is_cuda()) {
    TG_CHECK_AS(DeviceError, g.nccl != nullptr, "dist::", op, ": ", describe(t),
                " is a CUDA tensor, but this process group has no NCCL communicator (",
                nccl_built() ? "no GPU was visible, or use_gpu = false" : "the build has no NCCL",
                "); use CPU tensors or build with NCCL");
    TG_CHECK_AS(DeviceError, t.device() == g.device, "dist::", op, ": ", describe(t),
                " is not on this rank's device ", g.device.str());
  } else {
    // MPI's counts are int; all_gather's result and reduce_scatter's input are size() times
    // the count, which MPI addresses itself.
    TG_CHECK_AS(ShapeError, t.numel() <= std::numeric_limits<int>::max(), "dist::", op, ": ", describe(t),
                " has more elements than MPI's int count can address (", std::numeric_limits<int>::max(),
                "); split it, or use CUDA tensors (NCCL counts are 64-bit)");
  }
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i64: return MPI_INT64_T;
    // MPI has no 2-byte float: the half types move as 2-byte words (broadcasts of DDP's
    // buffers); reductions over them are refused before they get here.
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
  }
  TG_FAIL_AS(DTypeError, "dist: no MPI type for dtype ", static_cast<int>(t));
}

// ---- Impl -------------------------------------------------------------------------------

void ProcessGroup::Impl::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex);
    if (!failed.load()) {
      failure = message;
      failed.store(true);
    }
  }
  throw DistError(message);
}

void ProcessGroup::Impl::check_usable(const char* op) {
  if (nccl) nccl->raise_if_aborted();
  if (!failed.load()) return;
  std::lock_guard<std::mutex> lock(failure_mutex);
  throw DistError("dist::" + std::string(op) + ": the process group failed earlier and cannot be used: " + failure);
}

void ProcessGroup::Impl::check_mpi(int rc, const char* op) {
  if (rc != MPI_SUCCESS)
    fail("dist::" + std::string(op) + ": rank " + std::to_string(rank) + ": MPI failed: " + mpi_error_text(rc));
}

void ProcessGroup::Impl::wait(MPI_Request& request, const char* op) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  for (int polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), op);
    if (done) return;
    if (clock::now() > deadline)
      fail("dist::" + std::string(op) + ": rank " + std::to_string(rank) + " of " + std::to_string(size) +
           " timed out after " + std::to_string(timeout_s) +
           " s waiting for the other ranks (one of them may have failed, hung, or called a different "
           "collective); raise TG_DIST_TIMEOUT if the wait is legitimate");
    // Spin briefly (small collectives finish in microseconds), then stop burning the core.
    if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void ProcessGroup::Impl::verify_same(const char* op, const Tensor& t, CollectiveArgs args) {
  if (!options.verify_collectives || size == 1) return;
  // The reduce op, the root, dtype, device kind, rank of the shape, the dims: a fixed-size
  // record per rank. Ranks that disagree on the op or the root would not fail in MPI or
  // NCCL: their replicas would silently differ.
  constexpr int kLen = 5 + kMaxDims;
  int64_t mine[kLen] = {};
  mine[0] = args.reduce_op ? static_cast<int64_t>(*args.reduce_op) : -1;
  mine[1] = args.root;
  mine[2] = static_cast<int64_t>(t.dtype());
  mine[3] = t.device().is_cuda() ? 1 : 0;
  mine[4] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) mine[5 + d] = t.size(d);
  std::vector<int64_t> all(static_cast<size_t>(kLen) * size);
  MPI_Request req;
  check_mpi(MPI_Iallgather(mine, kLen, MPI_INT64_T, all.data(), kLen, MPI_INT64_T, comm, &req), op);
  wait(req, op);
  auto describe_record = [&](int r) {
    const int64_t* x = &all[static_cast<size_t>(r) * kLen];
    std::string s = dtype_name(static_cast<DType>(x[2]));
    s += "[";
    for (int64_t d = 0; d < x[4]; ++d) s += (d ? ", " : "") + std::to_string(x[5 + d]);
    s += std::string("] on ") + (x[3] ? "cuda" : "cpu");
    if (x[0] >= 0) s += std::string(" with op ") + reduce_op_name(static_cast<ReduceOp>(x[0]));
    if (x[1] >= 0) s += " from root " + std::to_string(x[1]);
    return s;
  };
  for (int r = 1; r < size; ++r)
    if (std::memcmp(&all[0], &all[static_cast<size_t>(r) * kLen], sizeof(mine)) != 0)
      throw DistError("dist::" + std::string(op) + ": ranks disagree on the call: rank 0 passes " +
                      describe_record(0) + ", rank " + std::to_string(r) + " passes " + describe_record(r) +
                      " (every rank must pass the same shape, dtype, device kind, reduce op and root)");
}

// ---- ProcessGroup -----------------------------------------------------------------------

ProcessGroup::ProcessGroup(ProcessGroupOptions options) : impl_(std::make_unique<Impl>()) {
  TG_CHECK_AS(DistError, !g_group_alive.exchange(true),
              "ProcessGroup: one process group per process, and one is alive already");
  Impl& g = *impl_;
  g.options = options;
  try {
    g.timeout_s = options.timeout_s > 0 ? options.timeout_s : default_timeout();
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      TG_CHECK_AS(DistError, MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS,
                  "ProcessGroup: MPI_Init_thread failed");
      g.we_initialized_mpi = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &g.comm);
    MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g.comm, &g.rank);
    MPI_Comm_size(g.comm, &g.size);
    MPI_Comm node;
    MPI_Comm_split_type(g.comm, MPI_COMM_TYPE_SHARED, g.rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g.local_rank);
    MPI_Comm_size(node, &g.local_size);
    MPI_Comm_free(&node);
    g_rank = g.rank;
    g_size = g.size;
    if (options.abort_job_on_terminate) std::set_terminate(abort_job_on_terminate);
    if (options.use_gpu && nccl_built() && cuda_device_count() > 0) {
      g.device = Device::cuda(g.local_rank % cuda_device_count());
      g.nccl = make_nccl_comm(g);
    }
  } catch (...) {
    g_group_alive = false;
    throw;
  }
}

ProcessGroup::~ProcessGroup() {
  Impl& g = *impl_;
  const bool failed = g.failed.load() || (g.nccl && g.nccl->aborted());
  if (failed) {
    // Peers may be stuck in a collective this rank will never join; MPI_Finalize would
    // wait for them. End the job instead (the failure was reported where it happened).
    std::fprintf(stderr, "tapegrad dist: rank %d of %d: the process group failed (%s); aborting the job\n",
                 g.rank, g.size, g.failure.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  g.nccl.reset();
  if (g.comm != MPI_COMM_NULL) MPI_Comm_free(&g.comm);
  if (g.we_initialized_mpi) MPI_Finalize();
  g_group_alive = false;
}

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
int ProcessGroup::local_rank() const { return impl_->local_rank; }
int ProcessGroup::local_size() const { return impl_->local_size; }
Device ProcessGroup::device() const { return impl_->device; }
bool ProcessGroup::has_nccl() const { return impl_->nccl != nullptr; }
double ProcessGroup::timeout_s() const { return impl_->timeout_s; }

std::unique_ptr<Work> ProcessGroup::Impl::start_all_reduce(Tensor& t, ReduceOp op) {
  if (t.device().is_cuda()) return nccl->all_reduce(t, op);
  auto work = std::make_unique<MpiWork>(this, "all_reduce", t);
  if (op == ReduceOp::avg) work->divide_by = size;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), static_cast<int>(t.numel()), mpi_type(t.dtype()), mpi_op(op),
                           comm, &work->request),
            "all_reduce");
  return work;
}

std::unique_ptr<Work> ProcessGroup::Impl::start_broadcast(Tensor& t, int root) {
  if (t.device().is_cuda()) return nccl->broadcast(t, root);
  auto work = std::make_unique<MpiWork>(this, "broadcast", t);
  check_mpi(MPI_Ibcast(t.raw_data(), static_cast<int>(t.numel()), mpi_type(t.dtype()), root, comm, &work->request),
            "broadcast");
  return work;
}

std::unique_ptr<Work> ProcessGroup::all_reduce_async(Tensor& t, ReduceOp op) {
  Impl& g = *impl_;
  g.check_usable("all_reduce");
  check_tensor("all_reduce", g, t);
  TG_CHECK_AS(DTypeError, op != ReduceOp::avg || t.dtype() != DType::i64, "dist::all_reduce: avg of ",
              describe(t), " is not defined for an integer dtype; use sum");
  g.verify_same("all_reduce", t, {.reduce_op = op});
  return g.start_all_reduce(t, op);
}

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }

void ProcessGroup::broadcast(Tensor& t, int root) {
  Impl& g = *impl_;
  g.check_usable("broadcast");
  check_tensor("broadcast", g, t);
  TG_CHECK(root >= 0 && root < g.size, "dist::broadcast: root ", root, " is not a rank of a group of ", g.size);
  g.verify_same("broadcast", t, {.root = root});
  g.start_broadcast(t, root)->wait();
}

Tensor ProcessGroup::all_gather(const Tensor& t) {
  Impl& g = *impl_;
  g.check_usable("all_gather");
  check_tensor("all_gather", g, t);
  TG_CHECK_AS(ShapeError, t.dim() < kMaxDims, "dist::all_gather: ", describe(t), " has ", t.dim(),
              " dims; the result adds one and tensors have at most ", kMaxDims);
  g.verify_same("all_gather", t);
  std::vector<int64_t> dims{g.size};
  for (int64_t d : t.shape().dims()) dims.push_back(d);
  Tensor out = Tensor::empty(Shape(dims), {.dtype = t.dtype(), .device = t.device()});
  if (t.device().is_cuda()) {
    g.nccl->all_gather(t, out)->wait();
    return out;
  }
  MpiWork work(&g, "all_gather", out);
  g.check_mpi(MPI_Iallgather(t.raw_data(), static_cast<int>(t.numel()), mpi_type(t.dtype()), out.raw_data(),
                             static_cast<int>(t.numel()), mpi_type(t.dtype()), g.comm, &work.request),
              "all_gather");
  work.wait();
  return out;
}

Tensor ProcessGroup::reduce_scatter(const Tensor& t, ReduceOp op) {
  Impl& g = *impl_;
  g.check_usable("reduce_scatter");
  check_tensor("reduce_scatter", g, t);
  TG_CHECK_AS(ShapeError, t.dim() >= 1 && t.size(0) % g.size == 0, "dist::reduce_scatter: ", describe(t),
              " must have a first dim divisible by the group size ", g.size);
  TG_CHECK_AS(DTypeError, op != ReduceOp::avg || t.dtype() != DType::i64, "dist::reduce_scatter: avg of ",
              describe(t), " is not defined for an integer dtype; use sum");
  g.verify_same("reduce_scatter", t, {.reduce_op = op});
  std::vector<int64_t> dims = t.shape().dims();
  dims[0] /= g.size;
  Tensor out = Tensor::empty(Shape(dims), {.dtype = t.dtype(), .device = t.device()});
  if (t.device().is_cuda()) {
    g.nccl->reduce_scatter(t, out, op)->wait();
    return out;
  }
  MpiWork work(&g, "reduce_scatter", out);
  if (op == ReduceOp::avg) work.divide_by = g.size;
  g.check_mpi(MPI_Ireduce_scatter_block(t.raw_data(), out.raw_data(), static_cast<int>(out.numel()),
                                        mpi_type(t.dtype()), mpi_op(op), g.comm, &work.request),
              "reduce_scatter");
  work.wait();
  return out;
}

void ProcessGroup::barrier() {
  Impl& g = *impl_;
  g.check_usable("barrier");
  if (g.nccl) g.nccl->synchronize();  // queued GPU collectives are part of "everything before"
  MPI_Request req;
  g.check_mpi(MPI_Ibarrier(g.comm, &req), "barrier");
  g.wait(req, "barrier");
}

std::string ProcessGroup::broadcast_string(const std::string& s, int root) {
  Impl& g = *impl_;
  g.check_usable("broadcast_string");
  TG_CHECK_AS(DistError, root >= 0 && root < g.size, "dist::broadcast_string: root ", root,
              " is not a rank of a group of ", g.size);
  int64_t n = static_cast<int64_t>(s.size());
  MPI_Request req;
  g.check_mpi(MPI_Ibcast(&n, 1, MPI_INT64_T, root, g.comm, &req), "broadcast_string");
  g.wait(req, "broadcast_string");
  std::string out = g.rank == root ? s : std::string(static_cast<size_t>(n), '\0');
  // MPI counts are int: send in chunks so that long strings (parameter lists) fit.
  constexpr int64_t kChunk = 1 << 30;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int len = static_cast<int>(std::min(kChunk, n - off));
    g.check_mpi(MPI_Ibcast(out.data() + off, len, MPI_CHAR, root, g.comm, &req), "broadcast_string");
    g.wait(req, "broadcast_string");
  }
  return out;
}

bool ProcessGroup::all_true(bool value) {
  Impl& g = *impl_;
  g.check_usable("all_true");
  int v = value ? 1 : 0;
  MPI_Request req;
  g.check_mpi(MPI_Iallreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, g.comm, &req), "all_true");
  g.wait(req, "all_true");
  return v == 1;
}

}  // namespace tg::dist
