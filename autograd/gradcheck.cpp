#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/tape.h"
#include "core/random.h"

namespace tg {
namespace {

double projected(const Tensor& out, const std::vector<double>& r) {
  std::vector<double> v = out.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
  return s;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions opts) {
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad())
      TG_CHECK(t.dtype() == DType::f64 && t.device().is_cpu(),
               "gradcheck: inputs that require grad must be f64 on the CPU, got ", describe(t));
  }
  // Analytic gradients.
  std::vector<Tensor> saved_grads;
  for (const Tensor& t : inputs) {
    saved_grads.push_back(t.defined() ? t.grad() : Tensor());
    if (t.defined()) t.zero_grad();
  }
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
      p[i] = orig + opts.eps;
      double plus = projected(fn(inputs), r);
      p[i] = orig - opts.eps;
      double minus = projected(fn(inputs), r);
      p[i] = orig;
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
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].defined()) inputs[k].set_grad(saved_grads[k]);
  return result;
}

}  // namespace tg
