#include "dist/ddp.h"

#include <cstring>
#include <sstream>

#include "autograd/grad_hooks.h"
#include "autograd/tape.h"
#include "dist/process_group_impl.h"
#include "nn/checkpoint.h"
#if TG_CUDA
#include "core/cuda_context.h"
#endif

namespace tg::dist {

namespace {

// Copies n elements between two tensors' buffers at element offsets (core's copy_bytes: on
// one GPU queued on the framework's stream, the host does not wait).
void copy_elements(const Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset, int64_t n) {
  const size_t esize = dtype_size(dst.dtype());
  copy_bytes(static_cast<char*>(dst.raw_data()) + dst_offset * esize, dst.device(),
             static_cast<const char*>(src.raw_data()) + src_offset * esize, src.device(), n * esize);
}

void zero_elements(const Tensor& dst, int64_t offset, int64_t n) {
  const size_t esize = dtype_size(dst.dtype());
  char* d = static_cast<char*>(dst.raw_data()) + offset * esize;
  if (dst.device().is_cpu()) {
    std::memset(d, 0, n * esize);
    return;
  }
#if TG_CUDA
  cuda::set_device(dst.device().index);
  TG_CUDA_CHECK(cudaMemsetAsync(d, 0, n * esize, cuda::stream(dst.device().index)));
#endif
}

std::string signature(const std::string& name, const Tensor& t) {
  std::ostringstream os;
  os << name << " " << dtype_name(t.dtype()) << t.shape() << (t.requires_grad() ? "" : " (frozen)");
  return os.str();
}

}  // namespace

struct DistributedDataParallel::State {
  struct Slot {
    std::string name;
    Tensor param;
    int bucket = -1;
    int64_t offset = 0;  // in the bucket, in elements
    bool ready = false;  // its gradient arrived in this backward
    uint64_t hook = 0;
  };
  struct Bucket {
    std::vector<int> slots;
    Tensor flat;  // the gradients side by side: what is all-reduced
    int pending = 0;
    std::unique_ptr<Work> work;
  };
  ProcessGroup::Impl* group = nullptr;
  DDPOptions options;
  std::vector<Slot> slots;  // parameters that require grad, registration order
  std::vector<Bucket> buckets;
  size_t next_bucket = 0;  // the next bucket to start (buckets start in order)
  bool in_backward = false;
  bool sync = true;

  void begin_backward() {
    in_backward = true;
    next_bucket = 0;
    for (Slot& s : slots) s.ready = false;
    for (Bucket& b : buckets) b.pending = static_cast<int>(b.slots.size());
    Tape::queue_callback([this] { finish_backward(); });
  }

  void on_grad_ready(int i) {
    if (!sync) return;
    if (!in_backward) begin_backward();
    Slot& s = slots[i];
    if (s.ready) return;  // a second gradient for it in one backward cannot happen; be safe
    s.ready = true;
    Bucket& b = buckets[s.bucket];
    copy_elements(b.flat, s.offset, s.param.grad(), 0, s.param.numel());
    --b.pending;
    start_ready_buckets();
  }

  void start_bucket(Bucket& b) { b.work = group->start_all_reduce(b.flat, ReduceOp::avg); }

  void start_ready_buckets() {
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) start_bucket(buckets[next_bucket++]);
  }

  void finish_backward() {
    // Parameters that got no gradient in this backward: their accumulated gradient (from
    // no_sync steps), or zeros.
    for (; next_bucket < buckets.size(); ++next_bucket) {
      Bucket& b = buckets[next_bucket];
      for (int i : b.slots) {
        Slot& s = slots[i];
        if (s.ready) continue;
        const Tensor g = s.param.grad();
        if (g.defined()) copy_elements(b.flat, s.offset, g, 0, s.param.numel());
        else zero_elements(b.flat, s.offset, s.param.numel());
      }
      start_bucket(b);
    }
    // How many ranks produced a gradient for each parameter (find_unused_parameters).
    std::vector<int> used;
    if (options.find_unused_parameters) {
      used.resize(slots.size());
      for (size_t i = 0; i < slots.size(); ++i) used[i] = slots[i].ready || slots[i].param.grad().defined();
      MPI_Request req;
      group->check_mpi(MPI_Iallreduce(MPI_IN_PLACE, used.data(), static_cast<int>(used.size()), MPI_INT, MPI_SUM,
                                      group->comm, &req),
                       "DistributedDataParallel (unused-parameter count)");
      group->wait(req, "DistributedDataParallel (unused-parameter count)");
    }
    for (Bucket& b : buckets) {
      b.work->wait();
      b.work.reset();
      for (int i : b.slots) {
        Slot& s = slots[i];
        if (!used.empty() && used[i] == 0) continue;  // no rank used it: grad stays as it is
        Tensor g = s.param.grad();
        if (!g.defined()) {
          g = Tensor::empty(s.param.shape(), {.dtype = s.param.dtype(), .device = s.param.device()});
          s.param.set_grad(g);
        }
        copy_elements(g, 0, b.flat, s.offset, s.param.numel());
        g.bump_version();
      }
    }
    in_backward = false;
  }
};

DistributedDataParallel::DistributedDataParallel(ProcessGroup& group, std::shared_ptr<nn::Module> module,
                                                 DDPOptions options)
    : group_(group), module_(std::move(module)), state_(std::make_unique<State>()) {
  TG_CHECK(module_ != nullptr, "DistributedDataParallel: null module");
  TG_CHECK(options.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
           options.bucket_cap_mb);
  register_module("module", module_);
  State& st = *state_;
  st.group = &group.impl();
  st.options = options;
  group.impl().check_usable("DistributedDataParallel");

  // Every rank's state list against rank 0's: names, dtypes, shapes, and the device.
  const auto state = module_->state_dict();
  std::vector<std::string> mine;
  std::string joined;
  for (const auto& [name, t] : state) {
    mine.push_back(signature(name, t));
    joined += mine.back() + "\n";
  }
  std::string problem;
  for (const auto& [name, t] : state)
    if (t.device() != group.device() && problem.empty())
      problem = "rank " + std::to_string(group.rank()) + " holds '" + name + "' on " + t.device().str() +
                ", not on its process group's device " + group.device().str() + " (call module->to(pg.device()))";
  const std::string reference = group.broadcast_string(joined, 0);
  if (problem.empty() && reference != joined) {
    std::istringstream in(reference);
    std::string line;
    size_t i = 0;
    for (; std::getline(in, line); ++i)
      if (i >= mine.size() || line != mine[i]) break;
    problem = "rank " + std::to_string(group.rank()) + " differs from rank 0 at state entry #" + std::to_string(i) +
              ": rank 0 has '" + (line.empty() ? std::string("(nothing)") : line) + "', rank " +
              std::to_string(group.rank()) + " has '" + (i < mine.size() ? mine[i] : std::string("(nothing)")) + "'";
  }
  if (!group.all_true(problem.empty())) {
    // Every rank throws the same message: the first rank's problem.
    std::string first;
    for (int r = 0; r < group.size() && first.empty(); ++r) first = group.broadcast_string(problem, r);
    throw DistError("DistributedDataParallel: the ranks' models do not match: " + first);
  }

  // Rank 0's parameters and buffers everywhere.
  for (const auto& [name, t] : state) {
    Tensor handle = t;
    group.impl().start_broadcast(handle, 0)->wait();
  }

  // Buckets: parameters that require grad, in reverse registration order, grouped by dtype.
  const auto params = module_->named_parameters();
  for (const auto& [name, t] : params)
    if (t.requires_grad()) st.slots.push_back({.name = name, .param = t});
  const int64_t cap_bytes = static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024);
  for (DType dtype : {DType::f32, DType::f64}) {
    int64_t bytes = 0;
    bool open = false;
    for (int i = static_cast<int>(st.slots.size()) - 1; i >= 0; --i) {
      State::Slot& s = st.slots[i];
      if (s.param.dtype() != dtype) continue;
      const int64_t b = static_cast<int64_t>(s.param.nbytes());
      if (!open || (bytes > 0 && bytes + b > cap_bytes)) {
        st.buckets.emplace_back();
        bytes = 0;
        open = true;
      }
      s.bucket = static_cast<int>(st.buckets.size()) - 1;
      st.buckets.back().slots.push_back(i);
      bytes += b;
    }
  }
  for (State::Bucket& b : st.buckets) {
    int64_t n = 0;
    for (int i : b.slots) {
      st.slots[i].offset = n;
      n += st.slots[i].param.numel();
    }
    b.flat = Tensor::empty({n}, {.dtype = st.slots[b.slots.front()].param.dtype(), .device = group.device()});
  }
  for (const auto& s : st.slots)
    TG_CHECK_AS(DTypeError, s.param.dtype() != DType::i64, "DistributedDataParallel: parameter '", s.name,
                "' is ", describe(s.param), "; gradients need a floating dtype");
  for (size_t i = 0; i < st.slots.size(); ++i)
    st.slots[i].hook = register_post_accumulate_grad_hook(
        st.slots[i].param, [s = state_.get(), i](const Tensor&) { s->on_grad_ready(static_cast<int>(i)); });
}

DistributedDataParallel::~DistributedDataParallel() {
  for (const auto& s : state_->slots) remove_post_accumulate_grad_hook(s.param, s.hook);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  State& st = *state_;
  TG_CHECK_AS(DistError, !st.in_backward,
              "DistributedDataParallel::forward: the previous backward did not finish (it threw), so its "
              "gradient reductions are incomplete; the ranks are out of step");
  if (st.options.broadcast_buffers && group_.size() > 1)
    for (Tensor b : module_->buffers()) st.group->start_broadcast(b, 0)->wait();
  return module_->forward(x);
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.state_->sync) {
  ddp_.state_->sync = false;
}
DistributedDataParallel::NoSync::~NoSync() { ddp_.state_->sync = previous_; }

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : state_->buckets) {
    out.emplace_back();
    for (int i : b.slots) out.back().push_back(state_->slots[i].name);
  }
  return out;
}

void save_checkpoint(ProcessGroup& group, const nn::Module& module, const std::string& path) {
  if (group.rank() == 0) tg::save(module, path);
  group.barrier();
}

}  // namespace tg::dist
