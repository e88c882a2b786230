// The explicit tape. While a Tape is alive on a thread, every op whose input requires grad
// appends an entry; entries are therefore already in topological order, and backward walks
// them in reverse without recursion.
//
//   tg::Tape tape;
//   tg::Tensor loss = tg::mse_loss(model.forward(x), target);
//   tape.backward(loss);   // every parameter's grad() is filled
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

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
  BackwardFn backward;
};

class Tape {
 public:
  Tape();   // becomes the thread's active tape (tapes nest; the innermost records)
  ~Tape();  // frees everything it saved
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // Gradients of `loss` (a one-element tensor, or any shape with `seed`, the gradient of
  // the final quantity with respect to `loss`) for everything recorded. Leaves that require
  // grad accumulate into grad(); a tape can run backward once.
  void backward(const Tensor& loss, const Tensor& seed = Tensor());

  const std::vector<TapeEntry>& entries() const { return entries_; }
  static Tape* active();

  // For teaching and debugging: called after each entry is recorded, and after each
  // gradient backward produces (op, input index, gradient).
  std::function<void(const TapeEntry&)> on_record;
  std::function<void(const TapeEntry&, size_t, const Tensor&)> on_gradient;

  void append(TapeEntry entry);

 private:
  std::vector<TapeEntry> entries_;
  Tape* previous_ = nullptr;
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
