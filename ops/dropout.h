// Dropout (Srivastava et al., 2014) and its channel forms dropout2d / dropout3d, PyTorch
// semantics: in training each element (or each whole channel) is zeroed with probability p
// and the kept ones are scaled by 1/(1-p); outside training, or with p = 0, the op is the
// identity and returns x itself; p = 1 gives zeros.
//
// The mask is a pure function of (seed, offset + unit index) through the counter-based
// generator of core/random.h, so the CPU and the GPU drop the same elements, bit for bit,
// and backward regenerates the mask instead of saving it.
//
//   Tensor y = tg::dropout(x, 0.1);                             // seed from tg::manual_seed's generator
//   Tensor z = tg::dropout(x, {.p = 0.1, .seed = 42});          // explicit seed: the same mask every call
//   Tensor c = tg::dropout2d(feature_map, {.p = 0.2, .seed = 7});  // (N, C, H, W): whole channels
#pragma once
#include <cstdint>
#include <optional>

#include "../core/random.h"
#include "../core/tensor.h"

namespace tg {

struct DropoutParams {
  double p = 0.5;
  bool training = true;
  // The mask's counters are seed, offset + unit. Without a seed, each call reserves fresh
  // counters from the process-wide generator (tg::manual_seed), so calls differ and a
  // program that seeds once is reproducible.
  std::optional<uint64_t> seed = std::nullopt;
  uint64_t offset = 0;
};

Tensor dropout(const Tensor& x, const DropoutParams& params);
Tensor dropout(const Tensor& x, double p, bool training = true);
// x (N, C, H, W) or unbatched (C, H, W): each (n, c) channel is kept or zeroed whole.
Tensor dropout2d(const Tensor& x, const DropoutParams& params);
// x (N, C, D, H, W) or unbatched (C, D, H, W).
Tensor dropout3d(const Tensor& x, const DropoutParams& params);

// The flattened problem, shared by the CPU reference and the CUDA kernels: x is `units`
// runs of `inner` contiguous elements, each run kept or dropped together.
struct DropoutProblem {
  int64_t units = 0;
  int64_t inner = 1;  // 1 for dropout, H*W (or D*H*W) for the channel forms
  double p = 0.5;
  uint64_t seed = 0;
  uint64_t offset = 0;
  // Set when the draw is captured into a CUDA graph: the kernel adds this replay's shift to
  // `offset` (core/random.h), so that each replay draws the mask the eager step would.
  ReplayShift shift{};
};

// Whether unit u is kept: its uniform number is at least p (so p = 0 keeps all, p = 1 none).
TG_HOST_DEVICE bool dropout_keeps(const DropoutProblem& q, int64_t u) {
  return uniform_at(q.seed, q.offset + static_cast<uint64_t>(u)) >= q.p;
}
// The factor applied to kept elements: 1/(1-p), in double.
TG_HOST_DEVICE double dropout_scale(const DropoutProblem& q) { return q.p < 1.0 ? 1.0 / (1.0 - q.p) : 0.0; }

// Throws unless out and in fit the problem (units * inner elements, same dtype and device,
// floating) and p is in [0, 1]. Both backends call it first.
void check_dropout_buffers(const Tensor& out, const Tensor& in, const DropoutProblem& q);

}  // namespace tg

// Kernel entry point: out = in * mask * scale. The forward (in = x) and the backward
// (in = dy, out = dx) are the same function of the same mask. The CUDA twin is in
// ops/cuda/dropout.h.
namespace tg::cpu {
void dropout_apply(const Tensor& out, const Tensor& in, const DropoutProblem& q);
}  // namespace tg::cpu
