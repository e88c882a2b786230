// CUDA kernels of the linear family: the dispatcher's table (gemm_variants.h: streaming
// kernels for matrix-vector shapes, the 1x1-convolution kernels for short reductions, the
// implicit-GEMM engine of ops/cuda/gemm/, then a tiled shared-memory FFMA GEMM for f64 and every
// transpose combination), and the deterministic column sum used for the bias gradient.
#include <array>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "ops/checks.h"
#include "core/tensor_kernels.h"
#include "ops/cuda/conv1x1/conv1x1.h"
#include "ops/cuda/gemm/engine.h"
#include "ops/cuda/gemm_variants.h"
#include "ops/cuda/linear.h"
#include "ops/cuda/policy.h"
#include "ops/cuda/skinny_gemm.h"
#include "ops/elementwise.h"

namespace tg::cuda {
namespace {

// One block computes a BM x BN tile of C, stepping through K in slices of BK. Each of the
// 16x16 threads owns a 4x4 sub-tile spread with stride 16 (rows ty + 16i, cols tx + 16j):
// shared-memory reads of B are then consecutive across a warp, and the final stores coalesce.
constexpr int BM = 64, BN = 64, BK = 16;
constexpr int TX = 16, TY = 16, THREADS = TX * TY;
constexpr int TM = BM / TY, TN = BN / TX;
constexpr int PAD = 4;  // breaks the 16-way bank conflict of k-contiguous tile stores

template <class T, bool TRANS_A, bool TRANS_B>
__global__ void __launch_bounds__(THREADS)
gemm_kernel(T* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ bias,
            int64_t M, int64_t N, int64_t K) {
  __shared__ T As[BK][BM + PAD];  // op(A) slice, k-major: As[k][m]
  __shared__ T Bs[BK][BN + PAD];  // op(B) slice, k-major: Bs[k][n]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * TX + tx;
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  const int64_t tiles_m = (M + BM - 1) / BM;

  // gridDim.y is capped at 65535: larger M loops over row tiles.
  for (int64_t tile_m = blockIdx.y; tile_m < tiles_m; tile_m += gridDim.y) {
    const int64_t m0 = tile_m * BM;
    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

    for (int64_t k0 = 0; k0 < K; k0 += BK) {
      // Each thread loads BM*BK/THREADS elements of each slice, walking along whichever
      // dimension is contiguous in memory so that a warp's loads coalesce.
#pragma unroll
      for (int r = 0; r < BM * BK / THREADS; ++r) {
        const int l = tid + r * THREADS;
        int mm, kk;
        if (TRANS_A) { mm = l % BM; kk = l / BM; }  // A stored (K, M)
        else { kk = l % BK; mm = l / BK; }          // A stored (M, K)
        const int64_t m = m0 + mm, k = k0 + kk;
        T v = T(0);
        if (m < M && k < K) v = TRANS_A ? a[k * M + m] : a[m * K + k];
        As[kk][mm] = v;
      }
#pragma unroll
      for (int r = 0; r < BN * BK / THREADS; ++r) {
        const int l = tid + r * THREADS;
        int nn, kk;
        if (TRANS_B) { kk = l % BK; nn = l / BK; }  // B stored (N, K)
        else { nn = l % BN; kk = l / BN; }          // B stored (K, N)
        const int64_t n = n0 + nn, k = k0 + kk;
        T v = T(0);
        if (n < N && k < K) v = TRANS_B ? b[n * K + k] : b[k * N + n];
        Bs[kk][nn] = v;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        T af[TM], bf[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) af[i] = As[kk][ty + TY * i];
#pragma unroll
        for (int j = 0; j < TN; ++j) bf[j] = Bs[kk][tx + TX * j];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] = fma(af[i], bf[j], acc[i][j]);
      }
      __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int64_t m = m0 + ty + TY * i;
      if (m >= M) continue;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int64_t n = n0 + tx + TX * j;
        if (n < N) c[m * N + n] = acc[i][j] + (bias ? bias[n] : T(0));
      }
    }
  }
}

// Column sums of a (rows, cols) matrix: 32 columns per block, 8 row-strided partial sums
// per column combined in a fixed order, so the result never depends on scheduling.
constexpr int SUM_COLS = 32, SUM_ROWS = 8;

template <class T>
__global__ void sum_rows_kernel(T* __restrict__ out, const T* __restrict__ g, int64_t rows, int64_t cols) {
  __shared__ double part[SUM_ROWS][SUM_COLS];
  const int64_t col = int64_t(blockIdx.x) * SUM_COLS + threadIdx.x;
  double acc = 0;
  if (col < cols)
    for (int64_t r = threadIdx.y; r < rows; r += SUM_ROWS) acc += g[r * cols + col];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    double s = 0;
    for (int i = 0; i < SUM_ROWS; ++i) s += part[i][threadIdx.x];
    out[col] = static_cast<T>(s);
  }
}

template <class T, bool TA, bool TB>
void launch_gemm(T* c, const T* a, const T* b, const T* bias, const GemmProblem& p, cudaStream_t s) {
  const int64_t tiles_n = (p.N + BN - 1) / BN, tiles_m = (p.M + BM - 1) / BM;
  TG_CHECK(tiles_n <= 0x7fffffff, "gemm: N=", p.N, " needs more than 2^31-1 column tiles");
  dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m < 65535 ? tiles_m : 65535));
  gemm_kernel<T, TA, TB><<<grid, dim3(TX, TY), 0, s>>>(c, a, b, bias, p.M, p.N, p.K);
}

// A batched linear layer is a channels-last 1x1 convolution whose pixels are the rows:
// forward y = x w^T (NT), input gradient dx = dy w (NN), weight gradient dw = dy^T x (TN).
// Those forms run on conv1x1's tensor-core kernels (one pass over the rows at memory speed,
// FP32-accurate or TF32 as tg::precision() says) when the reduction of the NT / NN forms is
// short and the output has few columns: the kernels keep the weight block resident and
// re-read the rows once per 64-128 output columns and the output once per 128 reduction
// channels, so longer reductions and wider outputs stay on the general kernel.
constexpr int64_t kPointwiseMaxReduction = 128, kPointwiseMaxColumns = 512;

// ---- the rows ----

bool skinny_can_implement(const GemmCase& g, const GemmOperands& o) { return skinny_gemm_applies(o.c, g.shape); }
void skinny_run(const GemmCase& g, const GemmOperands& o) { skinny_gemm(o.c, o.a, o.b, o.bias, g.shape); }

// The 1x1 kernels take the three forms a linear layer needs, f32, any size; a bias only in
// the forward (NT) form; the NT and NN forms reduce over at least one column.
bool pointwise_can_implement(const GemmCase& g, const GemmOperands& o) {
  const GemmProblem& p = g.shape;
  if (g.dtype != DType::f32 || (p.transA && p.transB)) return false;
  if (p.transA) return !o.bias.defined();
  return p.K >= 1 && (!o.bias.defined() || p.transB);
}
bool pointwise_preferred(const GemmCase& g, const GemmOperands& o) {
  const GemmProblem& p = g.shape;
  if (!pointwise_can_implement(g, o)) return false;
  if (p.transA) return p.M <= kPointwiseMaxColumns && p.N <= kPointwiseMaxColumns;
  return p.K <= kPointwiseMaxReduction && p.N <= kPointwiseMaxColumns;
}
void pointwise_run(const GemmCase& g, const GemmOperands& o) {
  const GemmProblem& p = g.shape;
  if (p.transA) pointwise_matmul_grad_weight(o.c, o.a, o.b, g.precision);  // c (M, N) = a (K, M)^T b (K, N)
  else if (p.transB) pointwise_matmul_forward(o.c, o.a, o.b, o.bias, g.precision);  // a (M, K) b (N, K)^T + bias
  else pointwise_matmul_grad_input(o.c, o.a, o.b, g.precision);      // c (M, N) = a (M, K) b (K, N)
}

// Everything else in f32 runs on the tensor-core engine.
bool engine_can_implement(const GemmCase& g, const GemmOperands&) { return engine_gemm_can_implement(g.shape, g.dtype); }
void engine_run(const GemmCase& g, const GemmOperands& o) {
  engine_gemm(o.c, o.a, o.b, o.bias, g.shape, g.precision, kernel_policy().engine);
}

// The tiled FFMA kernel: f64, and every problem the engine cannot index.
bool always(const GemmCase&, const GemmOperands&) { return true; }
void direct_run(const GemmCase& g, const GemmOperands& o) {
  const GemmProblem& p = g.shape;
  const int dev = o.c.device().index;
  set_device(dev);
  cudaStream_t s = stream(dev);
  dispatch_floating("linear (CUDA)", o.c.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    T* pc = o.c.data<T>();
    const T *pa = o.a.data<T>(), *pb = o.b.data<T>();
    const T* pbias = o.bias.defined() ? o.bias.data<T>() : nullptr;
    if (!p.transA && !p.transB) launch_gemm<T, false, false>(pc, pa, pb, pbias, p, s);
    else if (p.transA && !p.transB) launch_gemm<T, true, false>(pc, pa, pb, pbias, p, s);
    else if (!p.transA && p.transB) launch_gemm<T, false, true>(pc, pa, pb, pbias, p, s);
    else launch_gemm<T, true, true>(pc, pa, pb, pbias, p, s);
  });
  TG_LAUNCH_CHECK();
}

// Matrix-vector products and other skinny shapes are bound by memory, not arithmetic: they
// take the streaming kernels of skinny_gemm.cu (workload D) first.
constexpr std::array<GemmVariant, 4> kVariants{{
    {"skinny", "every GPU", true, skinny_can_implement, skinny_can_implement, skinny_run},
    {"pointwise", "sm_80+ (TMA on sm_90a)", true, pointwise_can_implement, pointwise_preferred, pointwise_run},
    {"engine", "sm_80+ (wgmma and TMA on sm_90a)", false, engine_can_implement, engine_can_implement, engine_run},
    {"direct", "every GPU", false, always, always, direct_run},
}};

}  // namespace

std::span<const GemmVariant> gemm_variants() { return kVariants; }

GemmCase gemm_case(const GemmProblem& p, DType dtype) {
  return GemmCase{.shape = p, .dtype = dtype, .precision = precision()};
}

const GemmVariant& choose_gemm_variant(const GemmCase& problem, const GemmOperands& operands) {
  const KernelPolicy& policy = kernel_policy();
  return choose_variant(gemm_variants(), policy.gemm_variant, policy.gemm, problem, operands, "gemm",
                        "matrix-product", [&] {
                          const GemmProblem& p = problem.shape;
                          return detail::concat("M ", p.M, ", N ", p.N, ", K ", p.K, p.transA ? ", a transposed" : "",
                                                p.transB ? ", b transposed" : "", ", ", dtype_name(problem.dtype));
                        });
}

void gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p) {
  check_gemm_operands(c, a, b, bias, p);
  if (p.M == 0 || p.N == 0) return;
  const GemmCase problem = gemm_case(p, c.dtype());
  const GemmOperands operands{.c = c, .a = a, .b = b, .bias = bias};
  choose_gemm_variant(problem, operands).run(problem, operands);
}

void linear_grad_input_weight(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                              const Tensor& w) {
  const int64_t B = dy.size(0), out = dy.size(1), in = x.size(1);
  const GemmProblem for_dx{.M = B, .N = in, .K = out}, for_dw{.M = out, .N = in, .K = B, .transA = true};
  check_gemm_operands(dx, dy, w, Tensor(), for_dx);
  check_gemm_operands(dw, dy, x, Tensor(), for_dw);
  // The 1x1 kernels read dy once for both gradients: taken wherever the table would send both
  // products to them.
  static_assert(kVariants[1].name == "pointwise");
  const GemmVariant& pointwise = kVariants[1];
  const GemmCase dx_case = gemm_case(for_dx, dx.dtype()), dw_case = gemm_case(for_dw, dw.dtype());
  if (&choose_gemm_variant(dx_case, {.c = dx, .a = dy, .b = w}) == &pointwise &&
      &choose_gemm_variant(dw_case, {.c = dw, .a = dy, .b = x}) == &pointwise) {
    pointwise_matmul_backward(dx, dw, dy, x, w, dx_case.precision);
    return;
  }
  gemm(dx, dy, w, Tensor(), for_dx);
  gemm(dw, dy, x, Tensor(), for_dw);
}

bool linear_bf16_can_implement(int64_t B, int64_t in, int64_t out) {
  return engine_gemm_can_implement({.M = B, .N = out, .K = in}, DType::f32) &&
         engine_gemm_can_implement({.M = out, .N = in, .K = B}, DType::f32);
}

void linear_bf16(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const auto bf16 = [](const Tensor& t) { return !t.defined() || t.dtype() == DType::bf16; };
  TG_CHECK_AS(DTypeError, bf16(y) && bf16(x) && bf16(w) && bf16(b), "linear_bf16: wants bf16 x, w, b and y; got ",
              describe(x), ", ", describe(w), b.defined() ? ", " + describe(b) : std::string(), " -> ", describe(y));
  const int64_t B = x.size(0), in = x.size(1), out = w.size(0);
  Tensor bias;
  if (b.defined()) {
    bias = Tensor::empty({out}, {.dtype = DType::f32, .device = y.device()});
    cast(bias, b);  // exact
  }
  engine_gemm_bf16(y, x, w, bias, {.M = B, .N = out, .K = in, .transB = true});  // each sum rounded once
}

void linear_bf16_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w) {
  const auto bf16 = [](const Tensor& t) { return !t.defined() || t.dtype() == DType::bf16; };
  TG_CHECK_AS(DTypeError, bf16(dx) && bf16(dw) && bf16(dy) && bf16(x) && bf16(w),
              "linear_bf16_backward: wants bf16 tensors; got dy ", describe(dy), ", x ", describe(x), ", w ", describe(w));
  const int64_t B = dy.size(0), out = dy.size(1), in = w.size(1);
  if (dx.defined()) engine_gemm_bf16(dx, dy, w, Tensor(), {.M = B, .N = in, .K = out});
  if (dw.defined()) engine_gemm_bf16(dw, dy, x, Tensor(), {.M = out, .N = in, .K = B, .transA = true});
}

void sum_rows(const Tensor& db, const Tensor& dy) {
  check_same_device_dtype("sum_rows", db, dy);
  TG_CHECK(dy.dim() == 2 && db.shape() == Shape({dy.size(1)}), "sum_rows: output ", db.shape(),
           " does not fit input ", dy.shape());
  const int64_t rows = dy.size(0), cols = dy.size(1);
  if (cols == 0) return;
  const int dev = db.device().index;
  set_device(dev);
  dispatch_floating("linear (CUDA)", dy.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const int64_t blocks = (cols + SUM_COLS - 1) / SUM_COLS;
    sum_rows_kernel<T><<<static_cast<unsigned>(blocks), dim3(SUM_COLS, SUM_ROWS), 0, stream(dev)>>>(
        db.data<T>(), dy.data<T>(), rows, cols);
  });
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
