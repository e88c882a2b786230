// Which kernels the CUDA dispatchers may choose. The default (Auto) lets each dispatcher
// take its ordered table: specialised kernels for the shapes they claim, then the
// implicit-GEMM engine, then the direct FFMA kernels (f64, and what the engine cannot index).
// Tests and the benchmark force one path, or one variant inside a fast path, to measure or
// check it; nothing reads the environment. Every field is read at each launch.
#pragma once
#include <string_view>

#include "gemm/engine.h"

namespace tg::cuda {

enum class KernelPath {
  Auto,     // the dispatcher's own order
  Engine,   // the implicit-GEMM engine wherever it can serve (skips specialised kernels)
  Direct,   // the general FFMA kernels (reference-style, slow)
};

// Inside the 3x3 fast path (ops/cuda/conv3x3/conv3x3.h), for the problems conv3x3_applies to.
struct Conv3x3Policy {
  // Forward and grad-input.
  enum class Data {
    Auto,       // Hopper: the shared-operand wgmma kernel in TF32 (conv3x3_wgmma_ss), the register-A
                // one in FP32 (conv3x3_wgmma); other GPUs: the mma.sync kernel
    RegisterA,  // Hopper: the register-A wgmma kernel in TF32 too; other GPUs: mma.sync
    MmaSync,    // the mma.sync kernel (conv3x3/fprop_sm80.cu) on every GPU
  };
  // Grad-weight.
  enum class Weight {
    Auto,     // Hopper in TF32: the wgmma kernel (conv3x3_wgmma_dw); otherwise mma.sync
    MmaSync,  // the mma.sync kernel on every GPU
  };
  Data data = Data::Auto;
  Weight weight = Weight::Auto;
};

// Inside the 1x1 fast path (ops/cuda/conv1x1/conv1x1.h, pointwise_matmul_*).
struct Conv1x1Policy {
  // The forward and grad-input products on the TMA kernel (conv1x1/fprop_sm90.cu, Hopper) where it
  // applies; false: on the cp.async kernels everywhere.
  bool tma = true;
  // Channels-first products up to 64 reduction channels on the streamed-weight kernel
  // (conv1x1/fprop_streamed_sm90.cu) instead of the resident one (tests); past 64 it is the
  // only Hopper one.
  bool stream_weight = false;
};

struct KernelPolicy {
  KernelPath conv = KernelPath::Auto;
  // Forces one row of the convolution table by name (conv_variants.h: "pointwise", "few_channels",
  // "conv3x3", "engine", "direct"); empty: the order `conv` allows. A forced row that cannot
  // implement a problem is an UnsupportedError, never a silent fallback.
  std::string_view conv_variant;
  KernelPath gemm = KernelPath::Auto;
  // Forces one row of the matrix-product table by name (gemm_variants.h: "skinny", "pointwise",
  // "engine", "direct"); empty: the order `gemm` allows. As conv_variant: never a silent fallback.
  std::string_view gemm_variant;
  EnginePolicy engine;  // tile and split overrides inside the engine
  Conv3x3Policy conv3x3;  // only where conv == Auto lets the 3x3 fast path run
  Conv1x1Policy conv1x1;  // only where conv / gemm == Auto let the 1x1 fast path run
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
