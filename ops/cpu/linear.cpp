// CPU reference of the linear family: Eigen GEMM on row-major maps of the buffers.
//
// Threads: C is cut into tiles of at most kTileRows x kTileCols, one Eigen GEMM (over the
// whole K) per tile, tiles split over threads. Eigen's result for an element depends on the
// shape of the product it is computed in (its blocking and kernels follow the sizes), so the
// tiles are fixed by the problem, never by the thread count; Eigen's own threading is off
// (EIGEN_DONT_PARALLELIZE) for the same reason.
#include <Eigen/Dense>
#include <algorithm>
#include <vector>

#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/checks.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace tg::cpu {
namespace {

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const RowMajor<T>>;

constexpr int64_t kTileRows = 256, kTileCols = 256;

template <class T>
void gemm_impl(T* c, const T* a, const T* b, const T* bias, const GemmProblem& p) {
  Eigen::Map<RowMajor<T>> C(c, p.M, p.N);  // (M, N)
  ConstMap<T> A(a, p.a_rows(), p.a_cols());
  ConstMap<T> B(b, p.b_rows(), p.b_cols());
  const int64_t tm = (p.M + kTileRows - 1) / kTileRows, tn = (p.N + kTileCols - 1) / kTileCols;
  const int64_t tile_cost = std::min(p.M, kTileRows) * std::min(p.N, kTileCols) * std::max<int64_t>(p.K, 1);
  // op(A) (M, K) and op(B) (K, N), whichever transposes they are.
  auto run = [&](const auto& opA, const auto& opB) {
    parallel_for(tm * tn, tile_cost, [&](int64_t t) {
      const int64_t r0 = t / tn * kTileRows, c0 = t % tn * kTileCols;
      const int64_t rows = std::min(kTileRows, p.M - r0), cols = std::min(kTileCols, p.N - c0);
      auto tile = C.block(r0, c0, rows, cols);
      tile.noalias() = opA.middleRows(r0, rows) * opB.middleCols(c0, cols);
      if (bias) {
        Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>> row(bias + c0, cols);
        tile.rowwise() += row;
      }
    });
  };
  if (!p.transA && !p.transB) run(A, B);
  else if (p.transA && !p.transB) run(A.transpose(), B);
  else if (!p.transA && p.transB) run(A, B.transpose());
  else run(A.transpose(), B.transpose());
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
    // Threads split the columns; each column sums its rows in order.
    parallel_ranges(cols, rows, [&](int64_t j0, int64_t j1) {
      std::vector<double> acc(static_cast<size_t>(j1 - j0), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = j0; j < j1; ++j) acc[static_cast<size_t>(j - j0)] += g[r * cols + j];
      for (int64_t j = j0; j < j1; ++j) out[j] = static_cast<T>(acc[static_cast<size_t>(j - j0)]);
    });
  });
}

}  // namespace tg::cpu
