// Numerical precision of matrix-like kernels (conv, linear). FP32 is the default and means
// results within FP32 rounding of the exact product; TF32 is opted into, like PyTorch's
// allow_tf32. How a kernel reaches FP32 accuracy (FFMA, or split-TF32 tensor-core math)
// is its own business.
#pragma once

namespace tg {

enum class Precision { FP32, TF32 };

void set_precision(Precision p);
Precision precision();

// Restores the previous precision on scope exit.
class PrecisionGuard {
 public:
  explicit PrecisionGuard(Precision p) : previous_(precision()) { set_precision(p); }
  ~PrecisionGuard() { set_precision(previous_); }
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;

 private:
  Precision previous_;
};

}  // namespace tg
