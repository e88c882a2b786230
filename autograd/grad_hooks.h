// Hooks on a leaf that run as soon as its grad() has received a backward's gradient, while
// the rest of backward is still running: PyTorch's Tensor.register_post_accumulate_grad_hook.
// Data-parallel training uses them to start reducing a bucket of gradients while backward
// goes on computing the others (dist/ddp.h).
//
//   auto id = tg::register_post_accumulate_grad_hook(w, [](const tg::Tensor& leaf) {
//     use(leaf.grad());          // final for this backward
//   });
//   ...
//   tg::remove_post_accumulate_grad_hook(w, id);
//
// When. Tape::backward walks its entries in reverse; a leaf's gradient is complete once the
// walk has passed the earliest entry that took the leaf as an input. Then the gradient is
// added to grad() (as at the end of backward: accumulation across backward calls is
// unchanged) and the leaf's hooks run, in registration order, on the thread running
// backward. A leaf that receives no gradient in a backward (not on the loss's path) gets
// no call. Hooks run with recording paused; an exception from a hook ends that backward.
//
// Tape::queue_callback (tape.h) lets a hook schedule work for the end of the backward that
// called it, after every leaf's grad is final.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "../core/tensor.h"

namespace tg {

using GradHook = std::function<void(const Tensor& leaf)>;

struct GradHooks {
  std::vector<std::pair<uint64_t, GradHook>> hooks;  // (handle, hook), registration order
};

// `leaf` must be a leaf that requires grad (a parameter); throws tg::Error otherwise.
// Returns a handle for remove_post_accumulate_grad_hook. The hook is kept by the tensor
// (every handle to it shares it), so it must not own that tensor.
uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, GradHook hook);
// Removes a hook; an unknown handle is ignored (removal is idempotent).
void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t handle);
// Runs the leaf's hooks (Tape::backward calls it; a no-op when none is registered).
void run_post_accumulate_grad_hooks(const Tensor& leaf);

}  // namespace tg
