// Which kernels the CUDA dispatchers may choose. The default (Auto) lets each dispatcher
// take its ordered table: specialised kernels for the shapes they claim, then the
// implicit-GEMM engine, then the direct FFMA kernels (f64, and what the engine cannot index).
// Tests and the benchmark force one path to measure or check it; nothing reads the
// environment.
#pragma once
#include "ops/cuda/gemm/engine.h"

namespace tg::cuda {

enum class KernelPath {
  Auto,     // the dispatcher's own order
  Engine,   // the implicit-GEMM engine wherever it can serve (skips specialised kernels)
  Direct,   // the general FFMA kernels (reference-style, slow)
};

struct KernelPolicy {
  KernelPath conv = KernelPath::Auto;
  KernelPath gemm = KernelPath::Auto;
  EnginePolicy engine;  // tile and split overrides inside the engine
};

// The policy in force (process-wide, like tg::precision()).
const KernelPolicy& kernel_policy();
void set_kernel_policy(const KernelPolicy& policy);

// Sets a policy for one scope and restores the previous one.
class KernelPolicyGuard {
 public:
  explicit KernelPolicyGuard(const KernelPolicy& policy) : previous_(kernel_policy()) { set_kernel_policy(policy); }
  ~KernelPolicyGuard() { set_kernel_policy(previous_); }
  KernelPolicyGuard(const KernelPolicyGuard&) = delete;
  KernelPolicyGuard& operator=(const KernelPolicyGuard&) = delete;

 private:
  KernelPolicy previous_;
};

}  // namespace tg::cuda
