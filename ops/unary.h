// Elementwise unary ops and activations: exp, log, sqrt, pow (scalar exponent), abs, clamp,
// sigmoid, tanh, gelu (erf or tanh form), silu, leaky_relu. Floating dtypes, any shape; the
// output has the input's shape, dtype and device. Edge values follow PyTorch: log(0) = -inf,
// log and sqrt of a negative are NaN, pow of a negative base by a fractional exponent is NaN.
//
//   Tensor y = tg::gelu(x, tg::GeluApproximate::tanh);   // PyTorch's approximate="tanh"
//   Tensor z = tg::clamp(x, {}, 6.0);                     // min absent: only an upper bound
//
// The named functions are one op, `unary(x, params)`, which the kernels and the tape share.
// These names hide the C library's inside namespace tg: code there calls std::exp (never a
// bare exp) on numbers.
#pragma once
#include <optional>

// Parsed first because its inline functions call a bare sqrt and log on doubles (device
// branch), which would find tg::sqrt(Tensor) if it were declared before them.
#include "../core/random.h"
#include "../core/tensor.h"

namespace tg {

enum class UnaryOp { exp, log, sqrt, pow, abs, clamp, sigmoid, tanh, gelu, silu, leaky_relu };

// PyTorch's GELU(approximate="none" | "tanh").
enum class GeluApproximate { none, tanh };

// The one problem description of the family: the op and its scalars (unused ones ignored).
struct UnaryParams {
  UnaryOp op = UnaryOp::exp;
  double exponent = 1.0;                                // pow
  std::optional<double> min = std::nullopt;             // clamp: at least one of min, max
  std::optional<double> max = std::nullopt;
  GeluApproximate approximate = GeluApproximate::none;  // gelu
  double negative_slope = 0.01;                         // leaky_relu
};

// "exp", "clamp", "gelu" ...: the name errors and tape entries use.
const char* unary_name(UnaryOp op);
// Whether the backward reads the op's output y (exp, sqrt, sigmoid, tanh: the derivative is
// a function of y, so the input need not be kept) rather than its input x.
bool unary_saves_output(UnaryOp op);
// Throws tg::Error for scalars the op cannot take (clamp without either bound).
void check_unary_params(const UnaryParams& p);

Tensor unary(const Tensor& x, const UnaryParams& p);
// dx = dy * f'(x), where `saved` is y for ops with unary_saves_output, else x.
Tensor unary_backward(const Tensor& dy, const Tensor& saved, const UnaryParams& p);

Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor abs(const Tensor& x);
// min(max(x, min), max) as PyTorch: when min > max every element becomes max. The gradient
// flows where min <= x <= max (bounds included).
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
// x * Phi(x); with GeluApproximate::tanh, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor gelu(const Tensor& x, GeluApproximate approximate = GeluApproximate::none);
Tensor silu(const Tensor& x);  // x * sigmoid(x)
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);

// Throw unless the kernels' buffers fit together (same shape, dtype and device; floating);
// both backends call them first, so a kernel called directly (tests) is checked too.
void check_unary_buffers(const char* op, const Tensor& out, const Tensor& x);
void check_unary_backward_buffers(const char* op, const Tensor& dx, const Tensor& dy, const Tensor& saved);

}  // namespace tg
