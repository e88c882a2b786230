#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/tape.h"
#include "core/random.h"

namespace tg {
namespace {

// <out, r> for the random direction r, drawn for the first output: fn must return the same
// shape every call (an fn that does not is not a function of its inputs alone).
double projected(const Tensor& out, const Shape& first_shape, const std::vector<double>& r) {
  TG_CHECK_AS(ShapeError, out.defined() && out.shape() == first_shape, "gradcheck: fn returned ", describe(out),
              " on a perturbed input but ", first_shape.str(), " on the first call; it must return the same shape "
              "every time");
  std::vector<double> v = out.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
  return s;
}

// Puts back what gradcheck changes in the caller's tensors, also when fn throws: their
// grad()s, and the element being perturbed.
class RestoreOnExit {
 public:
  explicit RestoreOnExit(const std::vector<Tensor>& inputs) : inputs_(inputs) {
    for (const Tensor& t : inputs_) grads_.push_back(t.defined() ? t.grad() : Tensor());
  }
  ~RestoreOnExit() {
    if (element_ != nullptr) *element_ = element_value_;
    for (size_t k = 0; k < inputs_.size(); ++k)
      if (inputs_[k].defined()) inputs_[k].set_grad(grads_[k]);
  }
  RestoreOnExit(const RestoreOnExit&) = delete;
  RestoreOnExit& operator=(const RestoreOnExit&) = delete;
  void perturbing(double* element) { element_ = element, element_value_ = *element; }
  void done_perturbing() { element_ = nullptr; }

 private:
  const std::vector<Tensor>& inputs_;
  std::vector<Tensor> grads_;
  double* element_ = nullptr;
  double element_value_ = 0;
};

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions opts) {
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad())
      TG_CHECK(t.dtype() == DType::f64 && t.device().is_cpu(),
               "gradcheck: inputs that require grad must be f64 on the CPU, got ", describe(t));
  }
  RestoreOnExit restore(inputs);
  // Analytic gradients.
  for (const Tensor& t : inputs)
    if (t.defined()) t.zero_grad();
  std::vector<double> r;
  Tensor analytic_out;
  {
    Tape tape;
    analytic_out = fn(inputs);
    TG_CHECK(analytic_out.dtype() == DType::f64, "gradcheck: fn returned ", describe(analytic_out), ", expected f64");
    r.resize(static_cast<size_t>(analytic_out.numel()));
    for (size_t i = 0; i < r.size(); ++i) r[i] = 2.0 * uniform_at(opts.seed, i) - 1.0;
    tape.backward(analytic_out, from_vector(r, analytic_out.shape()));
  }

  GradcheckResult result;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    Tensor g = x.grad();
    std::vector<double> analytic =
        g.defined() ? g.to_vector<double>() : std::vector<double>(static_cast<size_t>(x.numel()), 0.0);
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double orig = p[i];
      restore.perturbing(&p[i]);
      p[i] = orig + opts.eps;
      double plus = projected(fn(inputs), analytic_out.shape(), r);
      p[i] = orig - opts.eps;
      double minus = projected(fn(inputs), analytic_out.shape(), r);
      p[i] = orig;
      restore.done_perturbing();
      double numeric = (plus - minus) / (2 * opts.eps);
      double err = std::abs(analytic[i] - numeric);
      result.max_abs_error = std::max(result.max_abs_error, err);
      if (result.ok && !(err <= opts.atol + opts.rtol * std::abs(numeric))) {
        result.ok = false;
        result.message = detail::concat("gradcheck: input ", k, " ", describe(x), " element ", i,
                                        ": analytic ", analytic[i], " vs numeric ", numeric);
      }
    }
  }
  return result;
}

}  // namespace tg
