// tg::Autocast: mixed precision as PyTorch's torch.autocast. Inside the scope, the matrix ops
// (conv2d, conv3d, conv_transpose2d/3d, linear, matmul) cast their f32 operands to the scope's
// half type and return a result of that type (operands rounded to it, products accumulated in
// f32, the result rounded once); the ops that need range or accuracy (group_norm, layer_norm, softmax,
// log_softmax, the losses, pooling, upsampling) cast half inputs back to f32 and return f32;
// the elementwise ops and reductions run in their inputs' type, and where f32 meets the half
// type they compute in f32. The casts are recorded on the tape, so backward is correct:
// parameters stay f32 and their gradients arrive in f32. docs/dtypes.md has the op table.
//
//   {
//     tg::Autocast ac(tg::DType::bf16);
//     loss = cross_entropy(model(x), y);   // convs / linears in bf16, the rest as above
//   }
//   tape.backward(loss);                   // outside the scope, as in PyTorch
//
// Thread-local, nestable (the innermost scope wins; Autocast(dtype, false) switches it off
// inside another). CPU and CUDA tensors alike; on the GPU the half products run on the f32
// kernels (operands rounded to the half type, result rounded once), except bf16 linear,
// conv2d and conv3d on Hopper, which run on the engine's BF16 kernels (docs/dtypes.md).
#pragma once
#include "dtype.h"

namespace tg {

class Autocast {
 public:
  explicit Autocast(DType dtype = DType::bf16, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool previous_enabled_;
  DType previous_dtype_;
};

bool autocast_enabled();
DType autocast_dtype();  // the half type of the innermost enabled scope (bf16 when none)

}  // namespace tg
