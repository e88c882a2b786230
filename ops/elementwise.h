// Elementwise ops: tensor-tensor with NumPy broadcasting (a bias of shape [C, 1, 1] adds to
// [N, C, H, W]), tensor-scalar, and relu. Both operands on one device, one dtype.
#pragma once
#include "../core/tensor.h"

namespace tg {

enum class BinaryOp { add, sub, mul, div };

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

// a * scale + shift, elementwise: the tensor-scalar forms are all this one op.
Tensor affine(const Tensor& a, double scale, double shift);
inline Tensor add(const Tensor& a, double s) { return affine(a, 1.0, s); }
inline Tensor sub(const Tensor& a, double s) { return affine(a, 1.0, -s); }
inline Tensor mul(const Tensor& a, double s) { return affine(a, s, 0.0); }
inline Tensor div(const Tensor& a, double s) { return affine(a, 1.0 / s, 0.0); }
inline Tensor neg(const Tensor& a) { return affine(a, -1.0, 0.0); }

Tensor relu(const Tensor& x);
// Gradient of relu: dy where x > 0, else 0 (public so fused code can reuse it).
Tensor relu_backward(const Tensor& dy, const Tensor& x);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace tg
