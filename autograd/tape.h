// The explicit tape. While a Tape is alive on a thread, every op whose input requires grad
// appends an entry; entries are therefore already in topological order, and backward walks
// them in reverse without recursion.
//
//   tg::Tape tape;
//   tg::Tensor loss = tg::mse_loss(model.forward(x), target);
//   tape.backward(loss);   // every parameter's grad() is filled
//
// Which tape records. Each thread keeps its own stack of active tapes: a Tape pushes itself
// on the stack of the thread that constructs it, and the innermost live tape of the calling
// thread records. A tape leaves the stack when it is destroyed, wherever it sits:
// - Destroyed out of creation order on its own thread (an outer tape before an inner one):
//   it is removed from the middle of the stack; the others keep their order and the
//   innermost remaining one goes on recording. Nothing dangles and nothing is reported: the
//   remaining nesting is unambiguous.
// - Destroyed on another thread than the one that created it: it never touches the creator
//   thread's stack (that is the creator's alone). It marks its slot there dead, under a
//   per-tape mutex; the creator thread drops dead slots when it next looks for its active
//   tape, so its ops record on the next live tape below, or on none. A recording racing
//   with that destruction either completes before it (the entry is freed with the tape) or
//   sees the tape dead; it never writes into freed memory.
// Destructors never throw or abort. A Tape must not be used (backward, append, entries)
// after its destruction has begun, as for any object; Tape::active() is valid only while
// the tape it returns is alive.
//
// Tape boundaries. Every recorded output remembers the id() of its tape. A gradient cannot
// cross from one tape to another: backward raises tg::Error when a gradient would flow into
// a non-leaf tensor recorded on another tape (one that has ended, or an enclosing one),
// instead of silently stopping there. detach() such a tensor to stop gradients on purpose.
//
// Leaf gradients never share storage with each other or with the caller's seed: backward
// copies a gradient only where it would otherwise be shared.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../core/tensor.h"

namespace tg {

struct BackwardArgs {
  const std::vector<Tensor>& grad_outputs;  // one per output (zeros where none flowed)
  const std::vector<Tensor>& saved;         // what the op saved, version-checked
  const std::vector<bool>& needs_grad;      // one per input
};
// Returns one gradient per input; an undefined Tensor where needs_grad is false.
using BackwardFn = std::function<std::vector<Tensor>(const BackwardArgs&)>;

struct TapeEntry {
  std::string op;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<Tensor> saved;
  std::vector<uint64_t> saved_versions;
  // The outputs' versions when recorded: an output written in place afterwards (fill_,
  // copy_, ...) no longer holds what the op produced, so backward refuses it.
  std::vector<uint64_t> output_versions;
  BackwardFn backward;
};

class Tape {
 public:
  Tape();   // becomes the thread's active tape (tapes nest; the innermost records)
  ~Tape();  // leaves its creator thread's stack (see above) and frees everything it saved
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // Gradients of `loss` (a one-element tensor, or any shape with `seed`, the gradient of
  // the final quantity with respect to `loss`) for everything recorded. Leaves that require
  // grad accumulate into grad(); a tape can run backward once.
  void backward(const Tensor& loss, const Tensor& seed = Tensor());

  const std::vector<TapeEntry>& entries() const { return entries_; }
  // The calling thread's innermost live tape, or nullptr.
  static Tape* active();
  // Unique in the process (never reused, unlike an address); tensors record it.
  uint64_t id() const { return id_; }

  // For teaching and debugging: called after each entry is recorded, and after each
  // gradient backward produces (op, input index, gradient).
  std::function<void(const TapeEntry&)> on_record;
  std::function<void(const TapeEntry&, size_t, const Tensor&)> on_gradient;

  // Schedules fn to run at the end of the backward running on the calling thread, after
  // every leaf's grad is final (PyTorch's queue_callback). Only from inside a backward (a
  // gradient hook, autograd/grad_hooks.h); throws tg::Error otherwise. If backward throws,
  // queued callbacks do not run.
  static void queue_callback(std::function<void()> fn);

  // Adds an entry as is (record() is the usual way in). The caller keeps the tape alive.
  void append(TapeEntry entry);

  struct Slot;  // this tape's place on its creator thread's stack (tape.cpp)

 private:
  std::vector<TapeEntry> entries_;
  std::shared_ptr<Slot> slot_;
  uint64_t id_;
  bool used_ = false;
};

// True when an op with these inputs must be recorded: a tape is active, recording is
// not paused, and at least one input requires grad.
bool should_record(const std::vector<Tensor>& inputs);

// Records an op (call only when should_record). Marks the outputs as non-leaf tensors that
// require grad and remembers the versions of the saved tensors.
void record(std::string op, std::vector<Tensor> inputs, std::vector<Tensor> outputs,
            std::vector<Tensor> saved, BackwardFn backward);

// Pauses recording in its scope (used by backward itself, optimizers and inference code
// that wants to ignore an enclosing tape).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace tg
