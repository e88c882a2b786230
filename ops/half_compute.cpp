#include "ops/half_compute.h"

#include "autograd/tape.h"

namespace tg {

bool any_half(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && is_half(t.dtype())) return true;
  return false;
}

Tensor compute_in_f32(const char* op, const std::vector<Tensor>& inputs,
                      const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  TG_CHECK(!inputs.empty(), op, ": no inputs");
  const DType half = inputs.front().dtype();
  for (const Tensor& t : inputs) {
    TG_CHECK(t.defined(), op, ": an input is an undefined tensor");
    TG_CHECK_AS(DTypeError, t.dtype() == half && is_half(half), op, ": dtypes differ: ", describe(inputs.front()),
                " and ", describe(t), " (convert one with .to(dtype))");
  }
  std::vector<Tensor> widened;
  widened.reserve(inputs.size());
  for (const Tensor& t : inputs) widened.push_back(t.to(DType::f32));  // exact
  NoGradGuard no_grad;  // half inputs never require grad; their f32 copies record nothing either
  return f(widened).to(half);
}

}  // namespace tg
