#include "autograd/grad_hooks.h"

#include <atomic>

namespace tg {

namespace {
std::atomic<uint64_t> g_next_hook{1};
}

uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, GradHook hook) {
  TG_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(),
           "register_post_accumulate_grad_hook: the tensor must be a leaf that requires grad (a "
           "parameter), got ", leaf.defined() ? describe(leaf) : std::string("an undefined tensor"),
           leaf.defined() && !leaf.is_leaf() ? " computed by an op" : "");
  TG_CHECK(static_cast<bool>(hook), "register_post_accumulate_grad_hook: empty hook for ", describe(leaf));
  auto& slot = leaf.impl()->grad_hooks;
  if (!slot) slot = std::make_shared<GradHooks>();
  const uint64_t id = g_next_hook.fetch_add(1);
  slot->hooks.emplace_back(id, std::move(hook));
  return id;
}

void remove_post_accumulate_grad_hook(const Tensor& leaf, uint64_t handle) {
  if (!leaf.defined()) return;
  auto& slot = leaf.impl()->grad_hooks;
  if (!slot) return;
  std::erase_if(slot->hooks, [&](const auto& h) { return h.first == handle; });
  if (slot->hooks.empty()) slot.reset();
}

void run_post_accumulate_grad_hooks(const Tensor& leaf) {
  // A copy: a hook may register or remove hooks on this leaf.
  const std::shared_ptr<GradHooks> slot = leaf.impl()->grad_hooks;
  if (!slot) return;
  const auto hooks = slot->hooks;
  for (const auto& [id, hook] : hooks) hook(leaf);
}

}  // namespace tg
