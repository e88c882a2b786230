// bf16 / f16 tensors in ops: the op runs its f32 kernel on exact f32 copies of its inputs and
// rounds the f32 result once, to nearest even, to the inputs' half type (what PyTorch's bf16
// CPU kernels compute: f32 arithmetic, f32 accumulation in reductions and products, one
// rounding of each result). The elementwise ops, the reductions and the matrix ops (conv2d,
// conv3d, conv_transpose2d/3d, linear, matmul) call it; the others refuse half tensors (core/dtype_dispatch.h)
// unless an Autocast scope casts them to f32 first (autocast_f32). The casts are recorded ops,
// so gradients flow through half results like any other. Device-agnostic: on the GPU the casts
// and the f32 op are GPU kernels.
// docs/dtypes.md has the lists and the precision contract.
#pragma once
#include <functional>
#include <vector>

#include "../core/autocast.h"
#include "../core/tensor.h"

namespace tg {

// Whether any of the op's inputs is bf16 / f16 (then the op calls compute_in_f32). Inline and
// allocation-free: every elementwise op asks it first.
template <class... Ts>
inline bool any_half(const Ts&... ts) {
  return ((ts.defined() && is_half(ts.dtype())) || ...);
}
// Whether a matrix op takes the half path (matrix_op): inside an Autocast scope or with a half
// input. As cheap as any_half on the common path.
template <class... Ts>
inline bool needs_matrix_half_path(const Ts&... ts) {
  return autocast_enabled() || any_half(ts...);
}

// Checks that every defined input is of one half type (a DTypeError naming `op` and the
// tensors otherwise), runs f on their f32 copies (undefined inputs, such as a missing bias,
// stay undefined) and rounds its result to that type.
Tensor compute_in_f32(const char* op, const std::vector<Tensor>& inputs,
                      const std::function<Tensor(const std::vector<Tensor>&)>& f);

// Autocast's casts (core/autocast.h), recorded on the tape; outside a scope they return their
// inputs. The matrix ops: every defined f32 input cast to the scope's half type.
std::vector<Tensor> autocast_lower(const std::vector<Tensor>& inputs);
// The ops that compute in f32: a half input cast to f32.
Tensor autocast_f32(const Tensor& t);

// The matrix ops' half path (after needs_matrix_half_path):
// inside an Autocast scope f32 operands cast to its type; with half operands then, the op on
// f32 copies rounded to the half type; otherwise f on the inputs as they are.
Tensor matrix_op(const char* op, const std::vector<Tensor>& inputs,
                 const std::function<Tensor(const std::vector<Tensor>&)>& f);

}  // namespace tg
