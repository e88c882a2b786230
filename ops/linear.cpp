#include "ops/linear.h"

#include "autograd/tape.h"
#include "core/profiler.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/half_compute.h"
#if TG_CUDA
#include "ops/cuda/linear.h"
#endif

namespace tg {
namespace {

// Allocates C and runs one GEMM on the operands' device (nothing is recorded).
Tensor run_gemm(const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p) {
  Tensor c = Tensor::empty({p.M, p.N}, {.dtype = a.dtype(), .device = a.device()});
  TG_DISPATCH(a.device(), gemm(c, a, b, bias, p));
  return c;
}

Tensor run_sum_rows(const Tensor& dy) {  // (rows, cols) -> (cols)
  Tensor db = Tensor::empty({dy.size(1)}, {.dtype = dy.dtype(), .device = dy.device()});
  TG_DISPATCH(dy.device(), sum_rows(db, dy));
  return db;
}

// For C = A B with A (M, K), B (K, N) and dC (M, N):
//   dA (M, K) = dC B^T  and  dB (K, N) = A^T dC.
Tensor grad_left(const Tensor& dc, const Tensor& b, int64_t M, int64_t N, int64_t K) {
  return run_gemm(dc, b, Tensor(), {.M = M, .N = K, .K = N, .transB = true});
}
Tensor grad_right(const Tensor& a, const Tensor& dc, int64_t M, int64_t N, int64_t K) {
  return run_gemm(a, dc, Tensor(), {.M = K, .N = N, .K = M, .transA = true});
}

// Profiler costs (core/profiler.h). A product of (M, K) by (K, N) is 2*M*N*K FLOPs; a bias
// adds, and its grad sums, one per output element. Bytes: every operand read once, every
// result written once. Backward: the products its needs ask for.
double gemm_flops(int64_t M, int64_t N, int64_t K) {
  return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
}
profile::OpInfo gemm_backward_info(const BackwardArgs& a, int64_t M, int64_t N, int64_t K, bool bias) {
  const Tensor& dc = a.grad_outputs[0];
  const double e = static_cast<double>(dtype_size(dc.dtype()));
  const double A = static_cast<double>(M) * K * e, B = static_cast<double>(K) * N * e;
  profile::OpInfo info{{&dc, &a.saved[0], &a.saved[1]}, 0, profile::bytes_of({&dc}), true};
  if (a.needs_grad[0]) info.flops += gemm_flops(M, N, K), info.bytes += A + B;  // reads B, writes dA
  if (a.needs_grad[1]) info.flops += gemm_flops(M, N, K), info.bytes += A + B;  // reads A, writes dB
  if (bias && a.needs_grad[2]) info.flops += static_cast<double>(M) * N, info.bytes += static_cast<double>(N) * e;
  return info;
}

}  // namespace

void check_gemm_operands(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias,
                         const GemmProblem& p) {
  TG_CHECK_AS(ShapeError, p.M >= 0 && p.N >= 0 && p.K >= 0, "gemm: negative size in M=", p.M, " N=", p.N, " K=", p.K);
  check_same_device_dtype("gemm", c, a);
  check_same_device_dtype("gemm", c, b);
  TG_CHECK_AS(ShapeError, c.shape() == Shape({p.M, p.N}) && a.shape() == Shape({p.a_rows(), p.a_cols()}) &&
                  b.shape() == Shape({p.b_rows(), p.b_cols()}),
              "gemm: problem M=", p.M, " N=", p.N, " K=", p.K, " transA=", p.transA, " transB=", p.transB,
              " does not fit c ", c.shape(), ", a ", a.shape(), ", b ", b.shape());
  if (bias.defined()) {
    check_same_device_dtype("gemm", c, bias);
    TG_CHECK_AS(ShapeError, bias.shape() == Shape({p.N}), "gemm: bias ", bias.shape(), " does not match N=", p.N);
  }
}

namespace {

Tensor matmul_impl(const Tensor& a, const Tensor& b) {
  check_same_device_dtype("matmul", a, b);
  TG_CHECK_AS(ShapeError, a.dim() == 2 && b.dim() == 2, "matmul: expects two 2-D matrices, got ", describe(a),
              " and ", describe(b));
  TG_CHECK_AS(ShapeError, a.size(1) == b.size(0), "matmul: ", a.shape(), " x ", b.shape(), ": inner dimensions ",
              a.size(1), " and ", b.size(0), " differ");
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  profile::OpScope scope("matmul", [&] {
    return profile::OpInfo{{&a, &b}, gemm_flops(M, N, K),
                           profile::bytes_of({&a, &b}) + static_cast<double>(M * N) * dtype_size(a.dtype()), true};
  });
  Tensor c = run_gemm(a, b, Tensor(), {.M = M, .N = N, .K = K});
  if (should_record({a, b})) {
    record("matmul", {a, b}, {c}, {a, b}, [M, N, K](const BackwardArgs& args) {
      profile::OpScope scope("matmul (backward)", [&] { return gemm_backward_info(args, M, N, K, false); });
      const Tensor& dc = args.grad_outputs[0];  // (M, N)
      Tensor da, db;
      if (args.needs_grad[0]) da = grad_left(dc, args.saved[1], M, N, K);
      if (args.needs_grad[1]) db = grad_right(args.saved[0], dc, M, N, K);
      return std::vector<Tensor>{da, db};
    });
  }
  return c;
}

Tensor linear_impl(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_same_device_dtype("linear", x, w);
  TG_CHECK_AS(ShapeError, w.dim() == 2, "linear: weight must be 2-D (out, in), got ", describe(w));
  TG_CHECK_AS(ShapeError, x.dim() == 1 || x.dim() == 2, "linear: input must be (batch, in) or (in), got ", describe(x));
  TG_CHECK_AS(ShapeError, x.size(-1) == w.size(1), "linear: input ", x.shape(), " has ", x.size(-1),
              " features but weight ", w.shape(), " expects ", w.size(1));
  if (b.defined()) {
    check_same_device_dtype("linear", x, b);
    TG_CHECK_AS(ShapeError, b.dim() == 1 && b.size(0) == w.size(0), "linear: bias ", b.shape(),
                " does not match weight ", w.shape(), " (expected [", w.size(0), "])");
  }
  profile::OpScope scope("linear", [&] {
    const int64_t B = x.dim() == 1 ? 1 : x.size(0), out = w.size(0);
    return profile::OpInfo{{&x, &w, &b}, gemm_flops(B, out, x.size(-1)) + (b.defined() ? static_cast<double>(B * out) : 0),
                           profile::bytes_of({&x, &w, &b}) + static_cast<double>(B * out) * dtype_size(x.dtype()), true};
  });
  // A vector is a batch of one; the reshapes are recorded, so gradients flow through them.
  if (x.dim() == 1) return linear_impl(x.reshape({1, x.size(0)}), w, b).reshape({w.size(0)});

  // y (B, out) = x (B, in) * w^T, with w stored (out, in): transB.
  const int64_t B = x.size(0), in = x.size(1), out = w.size(0);
  Tensor y = run_gemm(x, w, b, {.M = B, .N = out, .K = in, .transB = true});
  if (should_record({x, w, b})) {
    record("linear", {x, w, b}, {y}, {x, w}, [B, in, out](const BackwardArgs& args) {
      profile::OpScope scope("linear (backward)", [&] { return gemm_backward_info(args, B, out, in, true); });
      const Tensor& dy = args.grad_outputs[0];  // (B, out)
      Tensor dx, dw, db;
      if (args.needs_grad[0] && args.needs_grad[1]) {  // both at once: one pass over dy on the GPU
        dx = Tensor::empty({B, in}, {.dtype = dy.dtype(), .device = dy.device()});
        dw = Tensor::empty({out, in}, {.dtype = dy.dtype(), .device = dy.device()});
        TG_DISPATCH(dy.device(), linear_grad_input_weight(dx, dw, dy, args.saved[0], args.saved[1]));
      } else {
        // dx (B, in) = dy (B, out) * w (out, in)
        if (args.needs_grad[0]) dx = run_gemm(dy, args.saved[1], Tensor(), {.M = B, .N = in, .K = out});
        // dw (out, in) = dy^T * x, with dy stored (B, out): transA
        if (args.needs_grad[1]) dw = run_gemm(dy, args.saved[0], Tensor(), {.M = out, .N = in, .K = B, .transA = true});
      }
      if (args.needs_grad[2]) db = run_sum_rows(dy);
      return std::vector<Tensor>{dx, dw, db};
    });
  }
  return y;
}

#if TG_CUDA
// Whether linear's bf16 operands (after Autocast's casts) take linear_bf16_impl: a batch of rows
// on a GPU, shapes that fit (else the f32 path reports them) within the engine's limits (else
// f32 copies), nothing empty.
bool bf16_linear_on_gpu(const Tensor& x, const Tensor& w, const Tensor& b) {
  const auto bf16 = [&](const Tensor& t) { return t.dtype() == DType::bf16 && t.device() == x.device(); };
  return x.device().is_cuda() && bf16(x) && bf16(w) && (!b.defined() || (bf16(b) && b.dim() == 1)) &&
         x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && (!b.defined() || b.size(0) == w.size(0)) &&
         x.numel() > 0 && w.numel() > 0 && cuda::linear_bf16_can_implement(x.size(0), x.size(1), w.size(0));
}

// bf16 linear on a GPU (Autocast's): the forward's and the backward's products on the engine's
// BF16 kernel (cuda::linear_bf16 and linear_bf16_backward: exact products, f32 accumulation,
// one rounding to bf16), the same products the f32 path computes for a bf16 op (compute_in_f32)
// on f32 copies. The bias gradient sums an f32 copy of dy's rows.
Tensor linear_bf16_impl(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t B = x.size(0), in = x.size(1), out = w.size(0);
  profile::OpScope scope("linear", [&] {
    return profile::OpInfo{{&x, &w, &b}, gemm_flops(B, out, in) + (b.defined() ? static_cast<double>(B * out) : 0),
                           profile::bytes_of({&x, &w, &b}) + static_cast<double>(B * out) * dtype_size(x.dtype()), true};
  });
  Tensor y = Tensor::empty({B, out}, {.dtype = DType::bf16, .device = x.device()});
  cuda::linear_bf16(y, x, w, b);
  if (should_record({x, w, b})) {
    record("linear", {x, w, b}, {y}, {x, w}, [B, in, out](const BackwardArgs& args) {
      profile::OpScope scope("linear (backward)", [&] { return gemm_backward_info(args, B, out, in, true); });
      // Casts inside a backward are not recorded (Tensor::to under the backward's NoGradGuard).
      const Tensor& dy = args.grad_outputs[0];
      Tensor dx, dw, db;
      if (dy.dtype() == DType::bf16) {
        const TensorOptions bf16{.dtype = DType::bf16, .device = dy.device()};
        if (args.needs_grad[0]) dx = Tensor::empty({B, in}, bf16);
        if (args.needs_grad[1]) dw = Tensor::empty({out, in}, bf16);
        cuda::linear_bf16_backward(dx, dw, dy, args.saved[0], args.saved[1]);
      } else {  // a gradient that arrived in another type: the f32 path on f32 copies
        const Tensor dy32 = dy.to(DType::f32);
        if (args.needs_grad[0])
          dx = run_gemm(dy32, args.saved[1].to(DType::f32), Tensor(), {.M = B, .N = in, .K = out}).to(DType::bf16);
        if (args.needs_grad[1])
          dw = run_gemm(dy32, args.saved[0].to(DType::f32), Tensor(), {.M = out, .N = in, .K = B, .transA = true})
                   .to(DType::bf16);
      }
      if (args.needs_grad[2]) db = run_sum_rows(dy.to(DType::f32)).to(DType::bf16);
      return std::vector<Tensor>{dx, dw, db};
    });
  }
  return y;
}
#endif

}  // namespace

// Half inputs and Autocast scopes: ops/half_compute.h (matrix_op).
Tensor matmul(const Tensor& a, const Tensor& b) {
  if (!needs_matrix_half_path(a, b)) return matmul_impl(a, b);
  return matrix_op("matmul", {a, b}, [](const std::vector<Tensor>& v) { return matmul_impl(v[0], v[1]); });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  if (!needs_matrix_half_path(x, w, b)) return linear_impl(x, w, b);
  const std::vector<Tensor> lowered = autocast_lower({x, w, b});
#if TG_CUDA
  if (bf16_linear_on_gpu(lowered[0], lowered[1], lowered[2])) return linear_bf16_impl(lowered[0], lowered[1], lowered[2]);
#endif
  // Already lowered: matrix_op's own Autocast casts find no f32 operand left.
  return matrix_op("linear", lowered, [](const std::vector<Tensor>& v) { return linear_impl(v[0], v[1], v[2]); });
}

}  // namespace tg
