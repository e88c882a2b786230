#include "ops/cuda/policy.h"

namespace tg::cuda {
namespace {
KernelPolicy g_policy;
}

const KernelPolicy& kernel_policy() { return g_policy; }
void set_kernel_policy(const KernelPolicy& policy) { g_policy = policy; }

}  // namespace tg::cuda
