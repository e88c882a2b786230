// bf16 / f16 tensors in the elementwise ops and reductions: the op runs its f32 kernel on
// exact f32 copies of its inputs and rounds the f32 result once, to nearest even, to the
// inputs' half type (what PyTorch's bf16 CPU kernels compute: f32 arithmetic, f32
// accumulation in reductions, one rounding of each result). Only the ops that call this take
// half tensors; the others refuse them (core/dtype_dispatch.h). The half types carry no
// gradients, so nothing is recorded on a tape. They live on the CPU only for now.
// docs/dtypes.md has the list and the precision contract.
#pragma once
#include <functional>
#include <vector>

#include "../core/tensor.h"

namespace tg {

// Whether any of the op's inputs is bf16 / f16 (then the op calls compute_in_f32).
bool any_half(const std::vector<Tensor>& inputs);

// Checks that every input is defined and of one half type (a DTypeError naming `op` and the
// tensors otherwise), runs f on their f32 copies and rounds its result to that type.
Tensor compute_in_f32(const char* op, const std::vector<Tensor>& inputs,
                      const std::function<Tensor(const std::vector<Tensor>&)>& f);

}  // namespace tg
