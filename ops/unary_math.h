// The formulas of the unary family, once, for both backends: the CPU reference instantiates
// them in double, the CUDA kernels in the tensor's type. Keeping one copy means the GPU can
// only differ from the reference by rounding, never by a formula.
//
// UnaryParams (ops/unary.h) holds std::optional and a GELU flag; kernels take this flat
// form instead: a function code with the form of GELU folded in, and plain scalars.
#pragma once
#include <cmath>
#include <type_traits>

#include "../core/random.h"  // TG_HOST_DEVICE
#include "unary.h"

namespace tg::unary_math {

enum class Fn { exp, log, sqrt, pow, abs, clamp, sigmoid, tanh, gelu_erf, gelu_tanh, silu, leaky_relu };

struct Scalars {
  double a = 0;  // pow: exponent; clamp: min; leaky_relu: negative slope
  double b = 0;  // clamp: max
  bool has_min = false, has_max = false;
};

inline Fn fn_of(const UnaryParams& p) {
  switch (p.op) {
    case UnaryOp::exp: return Fn::exp;
    case UnaryOp::log: return Fn::log;
    case UnaryOp::sqrt: return Fn::sqrt;
    case UnaryOp::pow: return Fn::pow;
    case UnaryOp::abs: return Fn::abs;
    case UnaryOp::clamp: return Fn::clamp;
    case UnaryOp::sigmoid: return Fn::sigmoid;
    case UnaryOp::tanh: return Fn::tanh;
    case UnaryOp::gelu: return p.approximate == GeluApproximate::tanh ? Fn::gelu_tanh : Fn::gelu_erf;
    case UnaryOp::silu: return Fn::silu;
    default: return Fn::leaky_relu;
  }
}

inline Scalars scalars_of(const UnaryParams& p) {
  Scalars s;
  if (p.op == UnaryOp::pow) s.a = p.exponent;
  if (p.op == UnaryOp::leaky_relu) s.a = p.negative_slope;
  if (p.op == UnaryOp::clamp) {
    s.has_min = p.min.has_value();
    s.has_max = p.max.has_value();
    s.a = p.min.value_or(0.0);
    s.b = p.max.value_or(0.0);
  }
  return s;
}

inline constexpr double kSqrt2OverPi = 0.79788456080286535588;   // sqrt(2 / pi)
inline constexpr double kInvSqrt2 = 0.70710678118654752440;      // 1 / sqrt(2)
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;    // 1 / sqrt(2 pi)
inline constexpr double kGeluCubic = 0.044715;

template <Fn F, class T>
TG_HOST_DEVICE T forward(T x, const Scalars& s) {
  if constexpr (F == Fn::exp) return std::exp(x);
  else if constexpr (F == Fn::log) return std::log(x);
  else if constexpr (F == Fn::sqrt) return std::sqrt(x);
  else if constexpr (F == Fn::pow) return std::pow(x, T(s.a));
  else if constexpr (F == Fn::abs) return std::fabs(x);
  else if constexpr (F == Fn::clamp) {
    // Comparisons, not fmin/fmax: a NaN input stays NaN (fmax would drop it), and with
    // min > max every element ends at max, as PyTorch's clamp.
    T v = x;
    if (s.has_min && v < T(s.a)) v = T(s.a);
    if (s.has_max && v > T(s.b)) v = T(s.b);
    return v;
  } else if constexpr (F == Fn::sigmoid) {
    return T(1) / (T(1) + std::exp(-x));  // exp(-x) = inf for x << 0 gives 0, not NaN
  } else if constexpr (F == Fn::tanh) {
    return std::tanh(x);
  } else if constexpr (F == Fn::gelu_erf) {
    // erfc(-z) = 1 + erf(z), without the cancellation of 1 + erf for x << 0.
    return T(0.5) * x * std::erfc(-x * T(kInvSqrt2));
  } else if constexpr (F == Fn::gelu_tanh) {
    const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
    return T(0.5) * x * (T(1) + std::tanh(u));
  } else if constexpr (F == Fn::silu) {
    return x / (T(1) + std::exp(-x));
  } else {  // leaky_relu
    return x > T(0) ? x : x * T(s.a);
  }
}

// dy * f'(x); `v` is y for the ops whose derivative is a function of the output
// (unary_saves_output: exp, sqrt, sigmoid, tanh), else x.
template <Fn F, class T>
TG_HOST_DEVICE T backward(T dy, T v, const Scalars& s) {
  if constexpr (F == Fn::exp) return dy * v;
  else if constexpr (F == Fn::log) return dy / v;
  else if constexpr (F == Fn::sqrt) return dy / (T(2) * v);
  else if constexpr (F == Fn::pow) {
    // d/dx x^0 is 0 everywhere (PyTorch), not 0 * x^-1 (NaN or inf at x = 0).
    if (s.a == 0) return T(0);
    return dy * T(s.a) * std::pow(v, T(s.a - 1));
  } else if constexpr (F == Fn::abs) {
    return v > T(0) ? dy : v < T(0) ? -dy : T(0);  // sign(0) = 0, as PyTorch
  } else if constexpr (F == Fn::clamp) {
    const bool inside = (!s.has_min || v >= T(s.a)) && (!s.has_max || v <= T(s.b));
    return inside ? dy : T(0);
  } else if constexpr (F == Fn::sigmoid) {
    return dy * v * (T(1) - v);
  } else if constexpr (F == Fn::tanh) {
    return dy * (T(1) - v * v);
  } else if constexpr (F == Fn::gelu_erf) {
    const T cdf = T(0.5) * std::erfc(-v * T(kInvSqrt2));
    const T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * v * v);
    return dy * (cdf + v * pdf);
  } else if constexpr (F == Fn::gelu_tanh) {
    const T x2 = v * v;
    const T t = std::tanh(T(kSqrt2OverPi) * (v + T(kGeluCubic) * x2 * v));
    const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x2);
    return dy * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du);
  } else if constexpr (F == Fn::silu) {
    const T sg = T(1) / (T(1) + std::exp(-v));
    return dy * sg * (T(1) + v * (T(1) - sg));
  } else {  // leaky_relu
    return v > T(0) ? dy : dy * T(s.a);
  }
}

// Calls f(std::integral_constant<Fn, F>{}) with the runtime code as a template argument, so
// each backend instantiates one loop per function (no switch inside the element loop).
template <class Visitor>
void visit(Fn fn, Visitor&& f) {
  switch (fn) {
    case Fn::exp: return f(std::integral_constant<Fn, Fn::exp>{});
    case Fn::log: return f(std::integral_constant<Fn, Fn::log>{});
    case Fn::sqrt: return f(std::integral_constant<Fn, Fn::sqrt>{});
    case Fn::pow: return f(std::integral_constant<Fn, Fn::pow>{});
    case Fn::abs: return f(std::integral_constant<Fn, Fn::abs>{});
    case Fn::clamp: return f(std::integral_constant<Fn, Fn::clamp>{});
    case Fn::sigmoid: return f(std::integral_constant<Fn, Fn::sigmoid>{});
    case Fn::tanh: return f(std::integral_constant<Fn, Fn::tanh>{});
    case Fn::gelu_erf: return f(std::integral_constant<Fn, Fn::gelu_erf>{});
    case Fn::gelu_tanh: return f(std::integral_constant<Fn, Fn::gelu_tanh>{});
    case Fn::silu: return f(std::integral_constant<Fn, Fn::silu>{});
    case Fn::leaky_relu: return f(std::integral_constant<Fn, Fn::leaky_relu>{});
  }
}

}  // namespace tg::unary_math
