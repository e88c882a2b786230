// Numerical gradient check: analytic gradients from the tape against central differences,
// in f64 on the CPU. A non-scalar output is projected onto fixed random weights r, so the
// checked quantity is sum(fn(inputs) * r) and every output element contributes.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "../core/tensor.h"

namespace tg {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-7;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-5;
  uint64_t seed = 1234;  // for the projection weights
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0;
  std::string message;  // the first mismatch: input, element, both values
  explicit operator bool() const { return ok; }
};

// Every input that requires grad must be an f64 CPU tensor; fn must be deterministic.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions opts = {});

}  // namespace tg
