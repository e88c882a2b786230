// The CUDA op tests' comparison with the CPU: the same op run forward and backward on the
// GPU in f32 and on the CPU in f64 from the same values, so the reference carries no f32
// rounding of its own and the tolerance measures the GPU's error alone.
#pragma once
#include <functional>
#include <vector>

#include "common/test_util.h"

namespace tg::test {

// A new tensor on GPU 0 whose every element is poison, so that one a kernel fails to write
// shows: NaN for floating dtypes, -1 (an index no kernel writes) for i64.
inline Tensor poisoned_gpu(const Shape& s, DType dt = f32) {
  Tensor t = Tensor::empty(s, {.dtype = dt, .device = Device::cuda(0)});
  if (dt == DType::i64) t.fill_(-1.0);
  else poison(t);
  return t;
}

// The CPU f64 reference of a GPU tensor's values.
inline Tensor ref_of(const Tensor& t) { return t.detach().cpu().to(f64); }

// Runs f on gpu_inputs (each defined one requiring grad; an undefined one stands for an
// absent optional operand such as a bias) with backward seeded by `seed`, then on f64 CPU
// copies of the same values, and expects the output and every defined input's gradient to
// agree within relative L2 `tol`. f must build its non-differentiable operands (class
// targets) on the device of its inputs.
inline void expect_matches_f64_cpu(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                   const std::vector<Tensor>& gpu_inputs, const Tensor& seed, double tol) {
  std::vector<Tensor> ref_inputs;
  for (const Tensor& t : gpu_inputs) ref_inputs.push_back(t.defined() ? ref_of(t).requires_grad_() : Tensor());
  Tensor y, ry;
  {
    Tape tape;
    y = f(gpu_inputs);
    tape.backward(y, seed);
  }
  {
    Tape tape;
    ry = f(ref_inputs);
    tape.backward(ry, ref_of(seed));
  }
  EXPECT_LE(rel_l2(y, ry), tol) << "output";
  for (size_t i = 0; i < gpu_inputs.size(); ++i) {
    if (gpu_inputs[i].defined()) {
      EXPECT_LE(rel_l2(gpu_inputs[i].grad(), ref_inputs[i].grad()), tol) << "gradient of input " << i;
    }
  }
}

}  // namespace tg::test
