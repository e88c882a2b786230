#include "nn/init.h"

#include <cmath>

#include "autograd/tape.h"

namespace tg::nn::init {

int64_t fan_in(const Tensor& weight) {
  TG_CHECK(weight.defined() && weight.dim() >= 2, "init::fan_in: needs a weight of rank >= 2 "
           "(out, in, k...), got ", describe(weight));
  int64_t n = weight.size(1);
  for (int64_t d = 2; d < weight.dim(); ++d) n *= weight.size(d);
  return n;
}

void uniform_(Tensor& t, double lo, double hi) {
  TG_CHECK(t.defined(), "init::uniform_: undefined tensor");
  TG_CHECK(lo <= hi, "init::uniform_: empty range [", lo, ", ", hi, ")");
  NoGradGuard no_grad;  // initialization is never part of a forward pass
  fill_uniform_(t, lo, hi);
}

double kaiming_uniform_bound(double a, int64_t fan_in) {
  TG_CHECK(fan_in > 0, "init::kaiming_uniform_: fan_in must be positive, got ", fan_in);
  double gain = std::sqrt(2.0 / (1.0 + a * a));
  return gain * std::sqrt(3.0 / static_cast<double>(fan_in));
}

void kaiming_uniform_(Tensor& t, double a, int64_t fan_in) {
  double bound = kaiming_uniform_bound(a, fan_in);
  uniform_(t, -bound, bound);
}

void constant_(Tensor& t, double value) {
  TG_CHECK(t.defined(), "init::constant_: undefined tensor");
  NoGradGuard no_grad;
  t.fill_(value);
}

}  // namespace tg::nn::init
