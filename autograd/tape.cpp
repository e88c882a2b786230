#include "autograd/tape.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "autograd/anomaly.h"  // [anomaly hooks]
#include "autograd/grad_hooks.h"
#include "core/accumulate.h"
#include "core/autocast.h"
#include "core/profiler.h"

namespace tg {

struct Tape::Slot {
  // Held while an entry is recorded into the tape and while its destructor marks it dead,
  // so that a destruction on another thread cannot free the entries under a recording.
  // Recursive: an on_record hook may run ops that record on the same tape.
  std::recursive_mutex mutex;
  std::atomic<Tape*> tape;  // nullptr once the tape's destruction has begun
  explicit Slot(Tape* t) : tape(t) {}
};

namespace {

// Gradient accumulation (a tensor used twice, a leaf's grad +=), profiled as its own op:
// 1 FLOP per element; reads both operands, writes the sum.
Tensor accumulate_grad(const Tensor& a, const Tensor& b) {
  profile::OpScope scope("accumulate_grad", [&] {
    return profile::OpInfo{{&a, &b}, static_cast<double>(a.numel()), 1.5 * profile::bytes_of({&a, &b})};
  });
  return sum_of(a, b);
}

// Guards leaves' grad() while a backward accumulates into it.
std::mutex& leaf_grad_mutex() {
  static std::mutex m;
  return m;
}

std::atomic<uint64_t> g_next_tape_id{1};  // 0 means "recorded on no tape"

// The calling thread's active tapes, outermost first. It holds slots, not tapes: a slot
// whose tape was destroyed on another thread says so instead of dangling.
struct TapeStack {
  std::vector<std::shared_ptr<Tape::Slot>> slots;
  ~TapeStack();
};
// Trivially destructible, so readable even while the thread's (or the process's) objects
// are being destroyed: a Tape outliving its thread's stack then leaves it alone.
thread_local bool t_stack_gone = false;
TapeStack::~TapeStack() { t_stack_gone = true; }
thread_local TapeStack t_stack;
thread_local bool t_recording_paused = false;
// The callback list of the backward running on this thread (null when none runs).
thread_local std::vector<std::function<void()>>* t_backward_callbacks = nullptr;
struct BackwardCallbackScope {
  std::vector<std::function<void()>>* previous;
  explicit BackwardCallbackScope(std::vector<std::function<void()>>* mine) : previous(t_backward_callbacks) {
    t_backward_callbacks = mine;
  }
  ~BackwardCallbackScope() { t_backward_callbacks = previous; }
  BackwardCallbackScope(const BackwardCallbackScope&) = delete;
  BackwardCallbackScope& operator=(const BackwardCallbackScope&) = delete;
};

// The innermost live slot of this thread, after dropping the dead ones; null if none.
// `dropped` tells whether a dead one was dropped (a tape destroyed on another thread).
std::shared_ptr<Tape::Slot> innermost_slot(bool* dropped = nullptr) {
  if (t_stack_gone) return nullptr;
  auto& slots = t_stack.slots;
  size_t n = std::erase_if(slots, [](const std::shared_ptr<Tape::Slot>& s) { return s->tape.load() == nullptr; });
  if (dropped) *dropped = n > 0;
  return slots.empty() ? nullptr : slots.back();
}

}  // namespace

Tape::Tape() : slot_(std::make_shared<Slot>(this)), id_(g_next_tape_id.fetch_add(1)) {
  if (!t_stack_gone) t_stack.slots.push_back(slot_);
}

Tape::~Tape() {
  {
    std::lock_guard<std::recursive_mutex> lock(slot_->mutex);  // waits for a recording in flight
    slot_->tape.store(nullptr);
  }
  // On the creator thread the slot is removed wherever it sits; on any other thread it is
  // not found (the creator thread drops it, dead, when it next looks).
  if (t_stack_gone) return;
  auto& slots = t_stack.slots;
  auto it = std::find(slots.rbegin(), slots.rend(), slot_);
  if (it != slots.rend()) slots.erase(std::next(it).base());
}

Tape* Tape::active() {
  std::shared_ptr<Slot> slot = innermost_slot();
  return slot ? slot->tape.load() : nullptr;
}

NoGradGuard::NoGradGuard() : previous_(t_recording_paused) { t_recording_paused = true; }
NoGradGuard::~NoGradGuard() { t_recording_paused = previous_; }

bool should_record(const std::vector<Tensor>& inputs) {
  if (t_recording_paused) return false;
  bool wanted = false;
  for (const Tensor& t : inputs) wanted = wanted || (t.defined() && t.requires_grad());
  return wanted && Tape::active() != nullptr;
}

void Tape::append(TapeEntry entry) {
  entries_.push_back(std::move(entry));
  if (on_record) on_record(entries_.back());
}

void record(std::string op, std::vector<Tensor> inputs, std::vector<Tensor> outputs,
            std::vector<Tensor> saved, BackwardFn backward) {
  TapeEntry e;
  e.op = std::move(op);
  e.inputs = std::move(inputs);
  e.outputs = std::move(outputs);
  for (const Tensor& o : e.outputs) e.output_versions.push_back(o.defined() ? o.version() : 0);
  for (const Tensor& s : saved) e.saved_versions.push_back(s.defined() ? s.version() : 0);
  e.saved = std::move(saved);
  e.backward = std::move(backward);
  for (;;) {
    bool dropped = false;
    std::shared_ptr<Tape::Slot> slot = innermost_slot(&dropped);
    // The last tape was destroyed on another thread since should_record: record nothing.
    if (slot == nullptr && dropped) return;
    TG_CHECK(slot != nullptr, "record(", e.op, "): no active tape");
    std::lock_guard<std::recursive_mutex> lock(slot->mutex);
    Tape* tape = slot->tape.load();
    if (tape == nullptr) continue;  // destroyed on another thread just now: the next one records
    for (Tensor& out : e.outputs) {
      out.impl()->requires_grad = true;
      out.impl()->is_leaf = false;
      out.impl()->producer_tape = tape->id();
    }
    // [anomaly hook] Scans the outputs (and inputs from outside the tape) at record time
    // (only ops on a tape) when anomaly mode is on.
    if (detect_anomaly()) check_forward_anomaly(e.op, e.inputs, e.outputs, tape->id());
    tape->append(std::move(e));
    return;
  }
}

void Tape::backward(const Tensor& loss, const Tensor& seed) {
  TG_CHECK(loss.defined(), "Tape::backward: the loss is an undefined tensor");
  TG_CHECK(!used_, "Tape::backward: this tape already ran backward and freed what it saved; "
                   "record the forward pass on a new tape");
  bool on_tape = false;
  for (const TapeEntry& e : entries_)
    for (const Tensor& o : e.outputs) on_tape = on_tape || o.same(loss);
  TG_CHECK(on_tape, "Tape::backward: the loss ", describe(loss),
           " was not recorded on this tape (was it computed outside the tape's scope, or from "
           "inputs none of which requires grad?)");
  Tensor g0;
  if (seed.defined()) {
    TG_CHECK(seed.shape() == loss.shape() && seed.device() == loss.device(),
             "Tape::backward: seed gradient ", describe(seed), " does not match the loss ", describe(loss));
    g0 = seed.dtype() == loss.dtype() ? seed : seed.to(loss.dtype());
  } else {
    TG_CHECK(loss.numel() == 1, "Tape::backward: the loss ", describe(loss),
             " is not a scalar; pass a seed gradient of the same shape");
    g0 = ones(loss.shape(), {.dtype = loss.dtype(), .device = loss.device()});
  }
  used_ = true;
  NoGradGuard no_grad;  // gradients are not themselves recorded
  Autocast no_autocast(DType::bf16, false);  // backward ops run in their forward's types, as in PyTorch
  profile::PhaseGuard phase(profile::Phase::backward);  // what runs here is the backward pass

  std::unordered_map<TensorImpl*, Tensor> grads;
  grads[loss.impl()] = g0;
  auto accumulate = [&](const Tensor& target, const Tensor& g) {
    auto [it, inserted] = grads.try_emplace(target.impl(), g);
    if (!inserted) it->second = accumulate_grad(it->second, g);
  };

  auto process_entry = [&](TapeEntry& e) {
    bool any = false;
    for (const Tensor& o : e.outputs) any = any || grads.count(o.impl());
    if (!any) return;  // nothing downstream of this op reached the loss

    std::vector<bool> needs(e.inputs.size());
    bool needed = false;
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      needs[i] = e.inputs[i].defined() && e.inputs[i].requires_grad();
      needed = needed || needs[i];
    }
    std::vector<Tensor> gouts;
    for (size_t j = 0; j < e.outputs.size(); ++j) {
      const Tensor& o = e.outputs[j];
      auto g = grads.find(o.impl());
      TG_CHECK(g == grads.end() || o.version() == e.output_versions[j], "Tape::backward: output ", j, " ",
               describe(o), " of '", e.op, "' was modified in place after it was recorded (version ",
               e.output_versions[j], " -> ", o.version(), "), so what flowed on is not what '", e.op,
               "' computed and its gradient would be wrong; write into a clone() or a tensor made outside "
               "the tape instead");
      gouts.push_back(g != grads.end() ? g->second
                                       : zeros(o.shape(), {.dtype = o.dtype(), .device = o.device()}));
      // A non-leaf output gets no more gradient once its producer is processed.
      if (g != grads.end()) grads.erase(g);
    }
    if (!needed) return;
    for (size_t i = 0; i < e.saved.size(); ++i) {
      TG_CHECK(!e.saved[i].defined() || e.saved[i].version() == e.saved_versions[i],
               "Tape::backward: a tensor ", describe(e.saved[i]), " saved by '", e.op,
               "' for backward was modified in place after it was saved (version ",
               e.saved_versions[i], " -> ", e.saved[i].version(), "); its gradients would be wrong");
    }
    std::vector<Tensor> gin = e.backward(BackwardArgs{gouts, e.saved, needs});
    TG_CHECK(gin.size() == e.inputs.size(), "Tape::backward: '", e.op, "' returned ", gin.size(),
             " gradients for ", e.inputs.size(), " inputs");
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      if (!needs[i] || !gin[i].defined()) continue;
      // Its producer's entry is on another tape, which this walk never reaches: the
      // gradient would silently stop here.
      TG_CHECK(e.inputs[i].is_leaf() || e.inputs[i].producer_tape() == id_, "Tape::backward: the gradient of '",
               e.op, "' input ", i, " ", describe(e.inputs[i]), " cannot flow back: that tensor was recorded on "
               "another tape (one that has ended, or an enclosing one), and gradients do not cross tapes; record "
               "its computation on this tape, or detach() it to stop its gradient on purpose");
      TG_CHECK(gin[i].shape() == e.inputs[i].shape(), "Tape::backward: gradient ", describe(gin[i]),
               " of '", e.op, "' input ", i, " does not match the input ", describe(e.inputs[i]));
      // [anomaly hook] Scans every gradient before it is accumulated when anomaly mode is on.
      if (detect_anomaly()) check_backward_anomaly(e.op, i, gin[i]);
      if (on_gradient) on_gradient(e, i, gin[i]);
      accumulate(e.inputs[i], gin[i]);
    }
    // Free what this entry saved as soon as it is no longer needed.
    e.saved.clear();
    e.backward = nullptr;
  };

  // Leaves accumulate (+=) into grad(); PyTorch semantics across several backward calls.
  // A gradient handed over as is may share storage with another leaf's (add passes one
  // gradient to both inputs, reshape's is a view), with the caller's seed, or with a leaf's
  // data; only such a one is copied, so that in-place edits of one grad touch nothing else.
  std::unordered_set<const Storage*> taken;
  if (seed.defined()) taken.insert(seed.impl()->storage.get());
  // A leaf's gradient is complete once the walk has passed the earliest entry that takes it
  // as an input: ready_at[k] lists the leaves whose earliest consumer is entry k. They are
  // finished there, and their post-accumulate hooks run, while backward goes on.
  std::vector<std::vector<Tensor>> ready_at(entries_.size());
  {
    std::unordered_set<const TensorImpl*> seen;
    for (size_t k = 0; k < entries_.size(); ++k)
      for (const Tensor& in : entries_[k].inputs) {
        if (!in.defined() || !in.is_leaf()) continue;
        taken.insert(in.impl()->storage.get());
        if (in.requires_grad() && seen.insert(in.impl()).second) ready_at[k].push_back(in);
      }
  }
  // Whether a gradient still waiting in `grads` (for a tensor not processed yet) shares
  // `t`'s storage: a post-accumulate hook that edits the leaf's grad in place would change it.
  auto shares_a_pending_gradient = [&](const Tensor& t, const TensorImpl* owner) {
    for (const auto& [impl, g] : grads)
      if (impl != owner && g.impl()->storage == t.impl()->storage) return true;
    return false;
  };
  auto finish_leaves = [&](size_t k) {
    for (const Tensor& in : ready_at[k]) {
      auto g = grads.find(in.impl());
      if (g == grads.end()) continue;  // no gradient reached this leaf
      {
        // Leaves may be shared by backward passes running on several threads (one model,
        // one tape per thread): the read, sum and write of grad() are one step.
        std::lock_guard<std::mutex> lock(leaf_grad_mutex());
        Tensor old = in.grad();
        Tensor next = old.defined() ? accumulate_grad(old, g->second) : g->second;
        if (!taken.insert(next.impl()->storage.get()).second || shares_a_pending_gradient(next, in.impl()))
          next = next.clone();
        taken.insert(next.impl()->storage.get());
        in.set_grad(next);
      }
      grads.erase(g);
      run_post_accumulate_grad_hooks(in);
    }
  };

  // Callbacks that hooks queue (queue_callback) run once every leaf is finished.
  std::vector<std::function<void()>> callbacks;
  BackwardCallbackScope callback_scope(&callbacks);
  for (size_t k = entries_.size(); k-- > 0;) {
    process_entry(entries_[k]);
    finish_leaves(k);
  }
  // A callback may queue further ones; each runs once, in order.
  for (size_t i = 0; i < callbacks.size(); ++i) {
    std::function<void()> fn = std::move(callbacks[i]);
    fn();
  }
}

void Tape::queue_callback(std::function<void()> fn) {
  TG_CHECK(t_backward_callbacks != nullptr,
           "Tape::queue_callback: no backward is running on this thread (call it from a gradient hook)");
  TG_CHECK(static_cast<bool>(fn), "Tape::queue_callback: empty callback");
  t_backward_callbacks->push_back(std::move(fn));
}

}  // namespace tg
