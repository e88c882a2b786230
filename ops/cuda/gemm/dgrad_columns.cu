// Grad-input for few input channels: the columns w^T dy as one plain engine_gemm product, then
// a gather of each dx element's taps. Called by engine_conv_grad_input (engine.cu) when
// columns_pay(). Design note: docs/kernels/gemm.md ("Grad-input for few input channels").
#include <numeric>

#include "core/cuda_context.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/conv_dims32.h"
#include "ops/cuda/gemm/planning.h"

namespace tg::cuda::engine {
namespace {

// Grad-input for few input channels in two steps: the columns g = w^T dy, a plain matrix
// product over dy read once (on Hopper the TMA matmul, which loads both operands as boxes),
// then each dx element gathers its taps' columns. The phase GEMMs would give each output only
// C columns of a 16-wide tile and gather dy once per tap.
constexpr int64_t kColumnsMaxChannels = 8;
constexpr int64_t kColumnsMaxFloats = int64_t{1} << 27;  // 512 MB of columns at most


// Per dim, the taps that reach an input coordinate q are t = t0 + i * tap_step (i = 0, 1, ...),
// reading output o = o0 - i * out_step (tap_step = stride / gcd(stride, dilation), out_step =
// dilation / gcd): found with at most tap_step remainders, no division per tap.
struct GatherGeometry {
  ConvDims32 d;
  int32_t tap_step[3], out_step[3];
  int32_t C;
  int64_t N;
};

struct TapRun {
  int32_t t0, o0, count;  // count = 0: no tap reaches q
};

__device__ __forceinline__ TapRun tap_run(const GatherGeometry& g, int d, int32_t q) {
  TapRun r{0, 0, 0};
  const int32_t first = q + g.d.pad[d];
  for (int32_t t = 0; t < g.tap_step[d] && t < g.d.kernel[d]; ++t) {
    const int32_t v = first - t * g.d.dil[d];
    if (v % g.d.stride[d] == 0) {
      r.t0 = t;
      r.o0 = v / g.d.stride[d];
      r.count = (g.d.kernel[d] - 1 - t) / g.tap_step[d] + 1;
      return r;
    }
  }
  return r;
}

// dx[n, c, q] = sum over the taps t reaching q from an output o of cols[c * kvol + t][(n, o)].
// Columns are (C*kvol, N*P) for both layouts: a warp's threads take neighbouring q (of one
// channel for NCDHW, of C channels for NDHWC), which read neighbouring o of a few column rows
// rather than one element per row. Taps in a fixed order: deterministic.
__global__ void gather_columns_kernel(float* __restrict__ dx, const float* __restrict__ cols,
                                      const GatherGeometry g, bool channels_last) {
  const int64_t V = int64_t(g.d.in[0]) * g.d.in[1] * g.d.in[2], P = int64_t(g.d.out[0]) * g.d.out[1] * g.d.out[2];
  const int64_t pixels = g.N * P;  // the columns' row length
  const int32_t kvol = g.d.kernel[0] * g.d.kernel[1] * g.d.kernel[2];
  const int64_t total = g.N * g.C * V;
  TG_GRID_STRIDE(i, total) {
    int64_t n, c, q;
    if (channels_last) {
      c = i % g.C;
      q = (i / g.C) % V;
      n = i / (g.C * V);
    } else {
      q = i % V;
      c = (i / V) % g.C;
      n = i / (V * g.C);
    }
    const int32_t qx = int32_t(q % g.d.in[2]), qy = int32_t((q / g.d.in[2]) % g.d.in[1]);
    const int32_t qz = int32_t(q / (int64_t(g.d.in[2]) * g.d.in[1]));
    const TapRun rz = tap_run(g, 0, qz), ry = tap_run(g, 1, qy), rx = tap_run(g, 2, qx);
    const float* base = cols + c * kvol * pixels + n * P;
    float acc = 0.f;
    for (int32_t iz = 0; iz < rz.count; ++iz) {
      const int32_t oz = rz.o0 - iz * g.out_step[0], tz = rz.t0 + iz * g.tap_step[0];
      if (uint32_t(oz) >= uint32_t(g.d.out[0])) continue;
      for (int32_t iy = 0; iy < ry.count; ++iy) {
        const int32_t oy = ry.o0 - iy * g.out_step[1], ty = ry.t0 + iy * g.tap_step[1];
        if (uint32_t(oy) >= uint32_t(g.d.out[1])) continue;
        for (int32_t ix = 0; ix < rx.count; ++ix) {
          const int32_t ox = rx.o0 - ix * g.out_step[2], tx = rx.t0 + ix * g.tap_step[2];
          if (uint32_t(ox) >= uint32_t(g.d.out[2])) continue;
          const int64_t o = (int64_t(oz) * g.d.out[1] + oy) * g.d.out[2] + ox;
          const int32_t t = (tz * g.d.kernel[1] + ty) * g.d.kernel[2] + tx;
          acc += base[int64_t(t) * pixels + o];
        }
      }
    }
    dx[i] = acc;
  }
}

GatherGeometry gather_geometry(const ConvShape& s) {
  GatherGeometry g{};
  g.d = conv_dims32(s);
  g.C = int32_t(s.C);
  g.N = s.N;
  for (int d = 0; d < 3; ++d) {
    const int64_t common = std::gcd(s.stride[d], s.dilation[d]);
    g.tap_step[d] = int32_t(s.stride[d] / common);
    g.out_step[d] = int32_t(s.dilation[d] / common);
  }
  return g;
}

// The columns product, cols (C*kvol, N*P) = w^T dy, as engine_gemm's c = a b^T: a = w
// transposed to (C*kvol, red) and b = dy as (N*P, red) rows, both with the reduction over dy's
// channels contiguous, as the TMA matmul reads its operands in place. NDHWC dy is those rows
// already (red = K: no copy; K % 4 != 0 keeps the product off the TMA kernel); NCDHW dy is
// transposed into them with red = K rounded up to 16 bytes, the pad zeros in both operands.
GemmProblem columns_product(const ConvShape& s) {
  const int64_t red = s.channels_last() ? s.K : round_up(s.K, int64_t{4});
  return {.M = s.C * s.kernel_volume(), .N = s.N * s.out_volume(), .K = red, .transA = false, .transB = true};
}

}  // namespace

// NCDHW dy's rows are a second scratch beside the columns, held to the same cap.
bool columns_pay(const ConvShape& s) {
  const int64_t cols = s.C * s.kernel_volume();
  if (!(s.C >= 1 && s.C <= kColumnsMaxChannels && s.K >= 1 && s.kernel_volume() > 1 && fits(cols))) return false;
  const GemmProblem p = columns_product(s);
  return p.N <= kColumnsMaxFloats / cols && (s.channels_last() || p.N <= kColumnsMaxFloats / p.K) &&
         engine_gemm_can_implement(p, DType::f32);
}

void grad_input_by_columns(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                           Precision precision, const EnginePolicy& policy) {
  const int dev = dx.device().index;
  cudaStream_t st = stream(dev);
  const GemmProblem p = columns_product(s);
  const TensorOptions f32{.dtype = DType::f32, .device = dx.device()};
  // w (K, C*kvol) row-major (the weights viewed flat) into a (C*kvol, red), pad rows zero.
  const Tensor wt = Tensor::empty({p.M, p.K}, f32);
  transpose_into(wt.data<float>(), w.data<float>(), 1, s.K, p.M, p.K, st);
  // engine_gemm reads b's data only: NDHWC dy is passed as it is, not as a (N*P, K) view.
  Tensor dy_rows = dy;
  if (!s.channels_last()) {
    dy_rows = Tensor::empty({p.N, p.K}, f32);
    transpose_into(dy_rows.data<float>(), dy.data<float>(), s.N, s.K, s.out_volume(), p.K, st);
  }
  // Scratch freed at the end of this function is stream-ordered: safe once the launches are queued.
  const Tensor cols = Tensor::empty({p.M, p.N}, f32);
  engine_gemm(cols, wt, dy_rows, Tensor(), p, precision, policy);
  gather_columns_kernel<<<grid_for(dx.numel(), kThreads), kThreads, 0, st>>>(
      dx.data<float>(), cols.data<float>(), gather_geometry(s), s.channels_last());
  TG_LAUNCH_CHECK();
}
}  // namespace tg::cuda::engine
