#include "autograd/tape.h"

#include <unordered_map>

#include "autograd/anomaly.h"  // [anomaly hooks]
#include "ops/elementwise.h"

namespace tg {
namespace {
thread_local Tape* t_active = nullptr;
thread_local bool t_recording_paused = false;
}  // namespace

Tape::Tape() : previous_(t_active) { t_active = this; }
Tape::~Tape() { t_active = previous_; }
Tape* Tape::active() { return t_active; }

NoGradGuard::NoGradGuard() : previous_(t_recording_paused) { t_recording_paused = true; }
NoGradGuard::~NoGradGuard() { t_recording_paused = previous_; }

bool should_record(const std::vector<Tensor>& inputs) {
  if (!t_active || t_recording_paused) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void Tape::append(TapeEntry entry) {
  entries_.push_back(std::move(entry));
  if (on_record) on_record(entries_.back());
}

void record(std::string op, std::vector<Tensor> inputs, std::vector<Tensor> outputs,
            std::vector<Tensor> saved, BackwardFn backward) {
  TG_CHECK(t_active != nullptr, "record(", op, "): no active tape");
  for (Tensor& out : outputs) {
    out.impl()->requires_grad = true;
    out.impl()->is_leaf = false;
  }
  TapeEntry e;
  e.op = std::move(op);
  e.inputs = std::move(inputs);
  e.outputs = std::move(outputs);
  for (const Tensor& s : saved) e.saved_versions.push_back(s.defined() ? s.version() : 0);
  e.saved = std::move(saved);
  e.backward = std::move(backward);
  // [anomaly hook] Scans the outputs at record time (only ops on a tape) when anomaly mode is on.
  if (detect_anomaly()) check_forward_anomaly(e.op, e.outputs);
  t_active->append(std::move(e));
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

  std::unordered_map<TensorImpl*, Tensor> grads;
  grads[loss.impl()] = g0;
  auto accumulate = [&](const Tensor& target, const Tensor& g) {
    auto [it, inserted] = grads.try_emplace(target.impl(), g);
    if (!inserted) it->second = add(it->second, g);
  };

  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    TapeEntry& e = *it;
    bool any = false;
    for (const Tensor& o : e.outputs) any = any || grads.count(o.impl());
    if (!any) continue;  // nothing downstream of this op reached the loss

    std::vector<bool> needs(e.inputs.size());
    bool needed = false;
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      needs[i] = e.inputs[i].defined() && e.inputs[i].requires_grad();
      needed = needed || needs[i];
    }
    std::vector<Tensor> gouts;
    for (const Tensor& o : e.outputs) {
      auto g = grads.find(o.impl());
      gouts.push_back(g != grads.end() ? g->second
                                       : zeros(o.shape(), {.dtype = o.dtype(), .device = o.device()}));
      // A non-leaf output gets no more gradient once its producer is processed.
      if (g != grads.end()) grads.erase(g);
    }
    if (!needed) continue;
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
  }

  // Leaves accumulate (+=) into grad(); PyTorch semantics across several backward calls.
  for (TapeEntry& e : entries_) {
    for (const Tensor& in : e.inputs) {
      if (!in.defined() || !in.is_leaf() || !in.requires_grad()) continue;
      auto g = grads.find(in.impl());
      if (g == grads.end()) continue;
      Tensor old = in.grad();
      in.set_grad(old.defined() ? add(old, g->second) : g->second);
      grads.erase(g);
    }
  }
}

}  // namespace tg
