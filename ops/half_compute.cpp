#include "ops/half_compute.h"

#include "autograd/tape.h"
#include "core/autocast.h"

namespace tg {

namespace {

bool any_half_of(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && is_half(t.dtype())) return true;
  return false;
}

const Tensor* first_defined(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined()) return &t;
  return nullptr;
}

}  // namespace

Tensor compute_in_f32(const char* op, const std::vector<Tensor>& inputs,
                      const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  const Tensor* first = first_defined(inputs);
  TG_CHECK(first, op, ": no inputs");
  // Called when some input is a half type: every input must be that same type. The message
  // names the first input that differs from the first half one.
  const Tensor* half_input = first;
  for (const Tensor& t : inputs)
    if (t.defined() && is_half(t.dtype())) {
      half_input = &t;
      break;
    }
  const DType half = half_input->dtype();
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    TG_CHECK_AS(DTypeError, t.dtype() == half && is_half(half), op, ": dtypes differ: ", describe(*half_input),
                " and ", describe(t), " (convert one with .to(dtype))");
  }
  // The casts and the f32 op are ordinary recorded ops: under a tape, with an input that
  // requires grad (a half result of a recorded op), the gradient flows back through them, in
  // f32 inside the op and rounded to the half type at its boundary.
  std::vector<Tensor> widened;
  widened.reserve(inputs.size());
  for (const Tensor& t : inputs) widened.push_back(t.defined() ? t.to(DType::f32) : t);  // exact
  Tensor result;
  {
    Autocast off(DType::bf16, false);  // the f32 op itself is not cast again
    result = f(widened);
  }
  return result.to(half);
}

std::vector<Tensor> autocast_lower(const std::vector<Tensor>& inputs) {
  if (!autocast_enabled()) return inputs;
  std::vector<Tensor> out;
  out.reserve(inputs.size());
  for (const Tensor& t : inputs) out.push_back(t.defined() && t.dtype() == DType::f32 ? t.to(autocast_dtype()) : t);
  return out;
}

Tensor autocast_f32(const Tensor& t) {
  return autocast_enabled() && t.defined() && is_half(t.dtype()) ? t.to(DType::f32) : t;
}

Tensor matrix_op(const char* op, const std::vector<Tensor>& inputs,
                 const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  const std::vector<Tensor> lowered = autocast_lower(inputs);
  return any_half_of(lowered) ? compute_in_f32(op, lowered, f) : f(lowered);
}

}  // namespace tg
