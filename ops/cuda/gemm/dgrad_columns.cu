// Grad-input for few input channels: the columns product over dy read once, then a gather of
// each dx element's taps. Called by engine_conv_grad_input (engine.cu) when columns_pay().
// Design note: docs/kernels/gemm.md ("Grad-input for few input channels").
#include <numeric>

#include "core/cuda_context.h"
#include "ops/cuda/gemm/planning.h"

namespace tg::cuda::engine {
namespace {

// Grad-input for few input channels in two steps: the columns g = dy^T w over dy read once
// (a plain product, cheap loads), then each dx element gathers its taps' columns. The phase
// GEMMs would give each output only C columns of a 16-wide tile and gather dy once per tap.
constexpr int64_t kColumnsMaxChannels = 8;
constexpr int64_t kColumnsMaxFloats = int64_t{1} << 27;  // 512 MB of columns at most


// Per dim, the taps that reach an input coordinate q are t = t0 + i * tap_step (i = 0, 1, ...),
// reading output o = o0 - i * out_step (tap_step = stride / gcd(stride, dilation), out_step =
// dilation / gcd): found with at most tap_step remainders, no division per tap.
struct GatherGeometry {
  int32_t in[3], out[3], kernel[3], stride[3], pad[3], dil[3], tap_step[3], out_step[3];
  int32_t C;
  int64_t N;
};

struct TapRun {
  int32_t t0, o0, count;  // count = 0: no tap reaches q
};

__device__ __forceinline__ TapRun tap_run(const GatherGeometry& g, int d, int32_t q) {
  TapRun r{0, 0, 0};
  const int32_t first = q + g.pad[d];
  for (int32_t t = 0; t < g.tap_step[d] && t < g.kernel[d]; ++t) {
    const int32_t v = first - t * g.dil[d];
    if (v % g.stride[d] == 0) {
      r.t0 = t;
      r.o0 = v / g.stride[d];
      r.count = (g.kernel[d] - 1 - t) / g.tap_step[d] + 1;
      return r;
    }
  }
  return r;
}

// dx[n, c, q] = sum over the taps t reaching q from an output o of columns[(n, o)][c * kvol + t].
// Columns are (N, C*kvol, P) for NCDHW (consecutive q read consecutive o) and (N*P, C*kvol) for
// NDHWC. Taps in a fixed order: deterministic.
__global__ void gather_columns_kernel(float* __restrict__ dx, const float* __restrict__ cols,
                                      const GatherGeometry g, bool channels_last) {
  const int64_t V = int64_t(g.in[0]) * g.in[1] * g.in[2], P = int64_t(g.out[0]) * g.out[1] * g.out[2];
  const int32_t kvol = g.kernel[0] * g.kernel[1] * g.kernel[2];
  const int64_t ncols = int64_t(g.C) * kvol, total = g.N * g.C * V;
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
    const int32_t qx = int32_t(q % g.in[2]), qy = int32_t((q / g.in[2]) % g.in[1]);
    const int32_t qz = int32_t(q / (int64_t(g.in[2]) * g.in[1]));
    const TapRun rz = tap_run(g, 0, qz), ry = tap_run(g, 1, qy), rx = tap_run(g, 2, qx);
    const float* base = channels_last ? cols + n * P * ncols + c * kvol : cols + (n * ncols + c * kvol) * P;
    float acc = 0.f;
    for (int32_t iz = 0; iz < rz.count; ++iz) {
      const int32_t oz = rz.o0 - iz * g.out_step[0], tz = rz.t0 + iz * g.tap_step[0];
      if (uint32_t(oz) >= uint32_t(g.out[0])) continue;
      for (int32_t iy = 0; iy < ry.count; ++iy) {
        const int32_t oy = ry.o0 - iy * g.out_step[1], ty = ry.t0 + iy * g.tap_step[1];
        if (uint32_t(oy) >= uint32_t(g.out[1])) continue;
        for (int32_t ix = 0; ix < rx.count; ++ix) {
          const int32_t ox = rx.o0 - ix * g.out_step[2], tx = rx.t0 + ix * g.tap_step[2];
          if (uint32_t(ox) >= uint32_t(g.out[2])) continue;
          const int64_t o = (int64_t(oz) * g.out[1] + oy) * g.out[2] + ox;
          const int32_t t = (tz * g.kernel[1] + ty) * g.kernel[2] + tx;
          acc += channels_last ? base[o * ncols + t] : base[int64_t(t) * P + o];
        }
      }
    }
    dx[i] = acc;
  }
}

GatherGeometry gather_geometry(const ConvShape& s) {
  GatherGeometry g{};
  g.C = int32_t(s.C);
  g.N = s.N;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = int32_t(s.in[d]);
    g.out[d] = int32_t(s.out[d]);
    g.kernel[d] = int32_t(s.kernel[d]);
    g.stride[d] = int32_t(s.stride[d]);
    g.pad[d] = int32_t(s.pad[d]);
    g.dil[d] = int32_t(s.dilation[d]);
    const int64_t common = std::gcd(s.stride[d], s.dilation[d]);
    g.tap_step[d] = int32_t(s.stride[d] / common);
    g.out_step[d] = int32_t(s.dilation[d] / common);
  }
  return g;
}

}  // namespace

bool columns_pay(const ConvShape& s) {
  const int64_t cols = s.C * s.kernel_volume();
  return s.C <= kColumnsMaxChannels && s.kernel_volume() > 1 && fits(cols) &&
         s.N * s.out_volume() <= kColumnsMaxFloats / cols;
}

void grad_input_by_columns(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                           Precision precision, const EnginePolicy& policy) {
  const int dev = dx.device().index;
  const int64_t M = s.N * s.out_volume(), ncols = s.C * s.kernel_volume();
  // dy as the input of a 1x1 convolution with K channels over the output grid.
  ConvShape s1 = s;
  s1.C = s.K;
  s1.K = ncols;
  for (int d = 0; d < 3; ++d) {
    s1.in[d] = s.out[d];
    s1.kernel[d] = s1.stride[d] = s1.dilation[d] = 1;
    s1.pad[d] = 0;
  }
  const ConvGeometry g1 = geometry(s1);
  const Tensor cols = Tensor::empty({M * ncols}, {.dtype = DType::f32, .device = dx.device()});
  MainloopArgs args{};
  args.M = int32_t(M);
  args.N = int32_t(ncols);
  args.red = int32_t(s.K);
  args.out = output_map(cols.data<float>(), nullptr, M, ncols);
  if (!s.channels_last()) {
    args.out.mode = OutputMap::kChannelsFirst;
    args.out.div = FastDivmod(uint32_t(s.out_volume()));
  }
  const Plan plan = make_plan(M, ncols, s.K, dev, policy, /*narrow_ok=*/false, precision, /*gather=*/true);
  run_plan(plan, args, dx.device(), [&](const MainloopArgs& a, cudaStream_t st) {
    launch_conv_dgrad_columns(g1, s.channels_last(), dy.data<float>(), w.data<float>(), plan, a,
                                      precision == Precision::FP32, st);
  });
  gather_columns_kernel<<<grid_for(dx.numel(), kThreads), kThreads, 0, stream(dev)>>>(
      dx.data<float>(), cols.data<float>(), gather_geometry(s), s.channels_last());
  TG_LAUNCH_CHECK();
}
}  // namespace tg::cuda::engine
