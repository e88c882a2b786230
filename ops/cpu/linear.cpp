// CPU reference of the linear family: Eigen GEMM on row-major maps of the buffers.
#include <Eigen/Dense>
#include <vector>

#include "core/dtype_dispatch.h"
#include "ops/checks.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace tg::cpu {
namespace {

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const RowMajor<T>>;

template <class T>
void gemm_impl(T* c, const T* a, const T* b, const T* bias, const GemmProblem& p) {
  Eigen::Map<RowMajor<T>> C(c, p.M, p.N);  // (M, N)
  ConstMap<T> A(a, p.a_rows(), p.a_cols());
  ConstMap<T> B(b, p.b_rows(), p.b_cols());
  if (!p.transA && !p.transB) C.noalias() = A * B;
  else if (p.transA && !p.transB) C.noalias() = A.transpose() * B;
  else if (!p.transA && p.transB) C.noalias() = A * B.transpose();
  else C.noalias() = A.transpose() * B.transpose();
  if (bias) {
    Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>> row(bias, p.N);
    C.rowwise() += row;
  }
}

}  // namespace

void gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p) {
  check_gemm_operands(c, a, b, bias, p);
  dispatch_floating("gemm", c.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    gemm_impl<T>(c.data<T>(), a.data<T>(), b.data<T>(), bias.defined() ? bias.data<T>() : nullptr, p);
  });
}

void linear_grad_input_weight(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                              const Tensor& w) {
  const int64_t B = dy.size(0), out = dy.size(1), in = x.size(1);
  gemm(dx, dy, w, Tensor(), {.M = B, .N = in, .K = out});
  gemm(dw, dy, x, Tensor(), {.M = out, .N = in, .K = B, .transA = true});
}

void sum_rows(const Tensor& db, const Tensor& dy) {
  check_same_device_dtype("sum_rows", db, dy);
  TG_CHECK(dy.dim() == 2 && db.shape() == Shape({dy.size(1)}), "sum_rows: output ", db.shape(),
           " does not fit input ", dy.shape());
  dispatch_floating("sum_rows", dy.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const int64_t rows = dy.size(0), cols = dy.size(1);
    const T* g = dy.data<T>();  // (rows, cols)
    T* out = db.data<T>();      // (cols)
    // Double accumulators: the reference must be the accurate one.
    std::vector<double> acc(static_cast<size_t>(cols), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) acc[j] += g[r * cols + j];
    for (int64_t j = 0; j < cols; ++j) out[j] = static_cast<T>(acc[j]);
  });
}

}  // namespace tg::cpu
