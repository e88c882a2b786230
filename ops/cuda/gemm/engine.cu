// The engine's host side: problem checks, tile and split planning, weight packing, the
// split-reduction pass, and the public entry points of engine.h.
#include "ops/cuda/gemm/engine.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "core/cuda_context.h"
#include "ops/cuda/gemm/kernels.h"
#include "ops/cuda/arch/hopper.h"

namespace tg::cuda {
namespace {

using engine::ConvGeometry;
using engine::MainloopArgs;
using engine::OutputMap;
using engine::PhaseGeometry;
using engine::Plan;

constexpr int64_t kIndexLimit = std::numeric_limits<int32_t>::max();
// Coordinates (input size plus padding, dilated kernel extent) stay far from int32 overflow.
constexpr int64_t kCoordinateLimit = int64_t{1} << 29;
// Partial sums of a split reduction: at most this many floats of workspace.
constexpr int64_t kMaxPartialFloats = int64_t{1} << 26;
constexpr int kMaxSplits = 64;
constexpr int kMinKTilesPerSplit = 8;
constexpr int kThreads = 256;

int32_t ceil_div32(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

// The tile whose last wave wastes least: an SM holds one BigTile block or three SmallTile
// blocks (shared memory), and a SmallTile block does a quarter of the work at a lower rate
// (more shared-memory reads per product), taken as 3/4 of BigTile's.
engine::TileShape big_or_small(int64_t M, int64_t N, int sms) {
  const int64_t big = int64_t(ceil_div32(M, 128)) * ceil_div32(N, 128);
  const int64_t small = int64_t(ceil_div32(M, 64)) * ceil_div32(N, 64);
  const double big_time = double((big + sms - 1) / sms) * 4.0;
  const double small_time = double((small + 3 * sms - 1) / (3 * sms)) * 3.0 / 0.75;
  return big_time <= small_time ? engine::TileShape::Big : engine::TileShape::Small;
}

// narrow_ok: B's k is contiguous (the narrow tile's loader needs it).
// gather: a convolution (an operand is gathered), not a plain matrix product.
Plan make_plan(int64_t M, int64_t N, int64_t red, int dev, const EnginePolicy& policy, bool narrow_ok,
               Precision precision, bool gather) {
  using engine::TileShape;
  const int sms = sm_count(dev);
  Plan plan;
  if (policy.tile == 16 && narrow_ok) plan.shape = TileShape::Narrow;
  else if (policy.tile == 128) plan.shape = TileShape::Big;
  else if (policy.tile == 64) plan.shape = TileShape::Small;
  else if (N <= 16 && narrow_ok) plan.shape = TileShape::Narrow;  // few columns: 16 wide, not 64
  else plan.shape = big_or_small(M, N, sms);
  const int tile_m = plan.shape == TileShape::Small ? 64 : 128;
  const int tile_n = plan.shape == TileShape::Big ? 128 : plan.shape == TileShape::Small ? 64 : 16;
  // Hopper: BigTile plans run on the wgmma kernel, except TF32 plain matrices. There mma.sync
  // fits two blocks per SM (the wgmma kernel one) and measured faster: one block's epilogue and
  // pipeline fill hide behind the other's products. policy.arch forces either kernel.
  plan.sm90 = plan.shape == TileShape::Big && device_runs_wgmma(dev) && policy.arch != 80 &&
              (policy.arch == 90 || precision == Precision::FP32 || gather);
  plan.tiles_m = ceil_div32(M, tile_m);
  plan.tiles_n = ceil_div32(N, tile_n);
  const int64_t tiles = int64_t(plan.tiles_m) * plan.tiles_n;
  TG_CHECK(tiles <= kIndexLimit, "implicit-GEMM engine: ", M, " x ", N, " output needs too many tiles");
  const int32_t k_tiles = std::max<int32_t>(1, ceil_div32(red, engine::kBK));
  int64_t splits = 1;
  if (policy.splits > 0) {
    splits = policy.splits;
  } else if (tiles < sms) {
    // Fill about two blocks per SM, each split keeping a real share of the reduction.
    splits = std::min<int64_t>((2 * sms + tiles - 1) / tiles, k_tiles / kMinKTilesPerSplit);
  }
  splits = std::clamp<int64_t>(splits, 1, kMaxSplits);
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, kMaxPartialFloats / std::max<int64_t>(1, M * N)));
  plan.k_tiles_per_split = ceil_div32(k_tiles, splits);
  plan.splits = ceil_div32(k_tiles, plan.k_tiles_per_split);  // no empty split
  return plan;
}

// out(m, n) = sum over splits of partials[s][m][n] (+ bias), in split order.
__global__ void reduce_partials_kernel(const float* __restrict__ partials, int32_t splits, OutputMap out) {
  const int64_t total = int64_t(out.M) * out.N;
  TG_GRID_STRIDE(i, total) {
    float sum = 0.f;
    for (int32_t s = 0; s < splits; ++s) sum += partials[s * total + i];
    out.store(static_cast<int32_t>(i / out.N), static_cast<int32_t>(i % out.N), sum);
  }
}

// Runs one planned launch: straight into `out`, or into partial sums reduced afterwards.
template <class Launch>
void run(const Plan& plan, MainloopArgs args, const Device& device, Launch&& launch) {
  const int dev = device.index;
  cudaStream_t st = stream(dev);
  Tensor partials;
  if (plan.splits > 1) {
    partials = Tensor::empty({int64_t(plan.splits) * args.M * args.N}, {.dtype = DType::f32, .device = device});
    args.partials = partials.data<float>();
  }
  args.k_tiles_per_split = plan.k_tiles_per_split;
  args.tiles_n = plan.tiles_n;
  launch(args, st);
  if (plan.splits > 1) {
    reduce_partials_kernel<<<grid_for(int64_t(args.M) * args.N, kThreads), kThreads, 0, st>>>(
        args.partials, plan.splits, args.out);
    TG_LAUNCH_CHECK();
  }
}

ConvGeometry geometry(const ConvShape& s) {
  ConvGeometry g{};
  g.N = int32_t(s.N);
  g.C = int32_t(s.C);
  g.K = int32_t(s.K);
  for (int d = 0; d < 3; ++d) {
    g.in[d] = int32_t(s.in[d]);
    g.out[d] = int32_t(s.out[d]);
    g.kernel[d] = int32_t(s.kernel[d]);
    g.stride[d] = int32_t(s.stride[d]);
    g.pad[d] = int32_t(s.pad[d]);
    g.dil[d] = int32_t(s.dilation[d]);
  }
  g.in_volume = s.in_volume();
  g.out_volume = s.out_volume();
  g.div_out_w = FastDivmod(uint32_t(s.out[2]));
  g.div_out_h = FastDivmod(uint32_t(s.out[1]));
  g.div_out_volume = FastDivmod(uint32_t(s.out_volume()));
  g.div_in_w = FastDivmod(uint32_t(s.in[2]));
  g.div_in_h = FastDivmod(uint32_t(s.in[1]));
  g.div_in_volume = FastDivmod(uint32_t(s.in_volume()));
  g.div_kernel_w = FastDivmod(uint32_t(s.kernel[2]));
  g.div_kernel_h = FastDivmod(uint32_t(s.kernel[1]));
  g.div_kernel_volume = FastDivmod(uint32_t(s.kernel_volume()));
  g.div_C = FastDivmod(uint32_t(s.C));
  g.div_K = FastDivmod(uint32_t(s.K));
  return g;
}

// packed[k][t * C + c] = w[k][c][t]: the forward's B, reduction in the order its gather uses.
__global__ void pack_forward_weights_kernel(float* __restrict__ packed, const float* __restrict__ w, int64_t K,
                                            int64_t C, int64_t kvol) {
  const int64_t total = K * C * kvol;
  TG_GRID_STRIDE(e, total) {
    const int64_t t = e % kvol, c = (e / kvol) % C, k = e / (kvol * C);
    packed[(k * kvol + t) * C + c] = w[e];
  }
}

Tensor pack_forward_weights(const Tensor& w, const ConvShape& s) {
  const int64_t kvol = s.kernel_volume();
  if (kvol == 1 || s.C == 1) return w;  // already (K, kvol*C) in that order
  Tensor packed = Tensor::empty({w.numel()}, {.dtype = DType::f32, .device = w.device()});
  const int dev = w.device().index;
  pack_forward_weights_kernel<<<grid_for(w.numel(), kThreads), kThreads, 0, stream(dev)>>>(
      packed.data<float>(), w.data<float>(), s.K, s.C, kvol);
  TG_LAUNCH_CHECK();
  return packed;
}

// One dim of a grad-input stride phase: the input pixels first + stride * j (j < count) and the
// taps tap0 + idx * tap_step (idx < taps) whose outputs (o = j + base - idx * out_step) reach them.
struct DimPhase {
  int32_t first = 0, count = 0, tap0 = 0, taps = 0, tap_step = 1, base = 0, out_step = 0;
};

DimPhase dim_phase(const ConvShape& s, int d, int32_t first) {
  const int64_t in = s.in[d], k = s.kernel[d], stride = s.stride[d], pad = s.pad[d], dil = s.dilation[d];
  DimPhase p;
  p.first = first;
  p.count = first < in ? int32_t((in - 1 - first) / stride + 1) : 0;
  const int64_t gcd = std::gcd(stride, dil);
  p.tap_step = int32_t(stride / gcd);
  p.out_step = int32_t(dil / gcd);
  // Taps t with (first + pad - t * dil) divisible by stride repeat every tap_step.
  int64_t tap0 = -1;
  for (int64_t t = 0; t < std::min<int64_t>(k, p.tap_step) && tap0 < 0; ++t)
    if ((first + pad - t * dil) % stride == 0) tap0 = t;
  if (tap0 < 0) return p;  // no tap reaches these pixels: their gradient is zero
  p.tap0 = int32_t(tap0);
  p.taps = int32_t((k - 1 - tap0) / p.tap_step + 1);
  p.base = int32_t((first + pad - tap0 * dil) / stride);  // exact
  return p;
}

PhaseGeometry phase_geometry(const DimPhase (&dims)[3]) {
  PhaseGeometry ph{};
  for (int d = 0; d < 3; ++d) {
    ph.first[d] = dims[d].first;
    ph.count[d] = dims[d].count;
    ph.taps[d] = dims[d].taps;
    ph.base[d] = dims[d].base;
    ph.out_step[d] = dims[d].out_step;
  }
  ph.tap_volume = ph.taps[0] * ph.taps[1] * ph.taps[2];
  // Empty phases are skipped before use; their divisors only need to be valid.
  ph.div_count_w = FastDivmod(uint32_t(std::max(1, ph.count[2])));
  ph.div_count_h = FastDivmod(uint32_t(std::max(1, ph.count[1])));
  ph.div_count_volume = FastDivmod(uint32_t(std::max(1, ph.count[0] * ph.count[1] * ph.count[2])));
  ph.div_taps_w = FastDivmod(uint32_t(std::max(1, ph.taps[2])));
  ph.div_taps_h = FastDivmod(uint32_t(std::max(1, ph.taps[1])));
  return ph;
}

struct PhaseTaps {
  int32_t tap0[3], tap_step[3], taps[3], kernel[3];
};

// packed[c][idx * K + k] = w[k][c][tap(idx)]: one phase's weights as its GEMM's B.
__global__ void pack_phase_weights_kernel(float* __restrict__ packed, const float* __restrict__ w, int64_t K,
                                          int64_t C, PhaseTaps pt) {
  const int64_t tap_volume = int64_t(pt.taps[0]) * pt.taps[1] * pt.taps[2];
  const int64_t kvol = int64_t(pt.kernel[0]) * pt.kernel[1] * pt.kernel[2];
  const int64_t total = C * tap_volume * K;
  TG_GRID_STRIDE(e, total) {
    const int64_t k = e % K, idx = (e / K) % tap_volume, c = e / (K * tap_volume);
    const int64_t ix = idx % pt.taps[2], iy = (idx / pt.taps[2]) % pt.taps[1];
    const int64_t iz = idx / (int64_t(pt.taps[2]) * pt.taps[1]);
    const int64_t t = ((pt.tap0[0] + iz * pt.tap_step[0]) * pt.kernel[1] + (pt.tap0[1] + iy * pt.tap_step[1])) *
                          pt.kernel[2] +
                      (pt.tap0[2] + ix * pt.tap_step[2]);
    packed[e] = w[(k * C + c) * kvol + t];
  }
}

OutputMap output_map(float* data, const float* bias, int64_t M, int64_t N) {
  OutputMap out{};
  out.data = data;
  out.bias = bias;
  out.M = int32_t(M);
  out.N = int32_t(N);
  out.mode = OutputMap::kPlain;
  out.kvol = 1;
  return out;
}

bool fits(int64_t v) { return v >= 0 && v <= kIndexLimit; }

// Grad-input for few input channels in two steps: the columns g = dy^T w over dy read once
// (a plain product, cheap loads), then each dx element gathers its taps' columns. The phase
// GEMMs would give each output only C columns of a 16-wide tile and gather dy once per tap.
constexpr int64_t kColumnsMaxChannels = 8;
constexpr int64_t kColumnsMaxFloats = int64_t{1} << 27;  // 512 MB of columns at most

bool columns_pay(const ConvShape& s) {
  const int64_t cols = s.C * s.kernel_volume();
  return s.C <= kColumnsMaxChannels && s.kernel_volume() > 1 && fits(cols) &&
         s.N * s.out_volume() <= kColumnsMaxFloats / cols;
}

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
  run(plan, args, dx.device(), [&](const MainloopArgs& a, cudaStream_t st) {
    engine::launch_conv_dgrad_columns(g1, s.channels_last(), dy.data<float>(), w.data<float>(), plan, a,
                                      precision == Precision::FP32, st);
  });
  gather_columns_kernel<<<grid_for(dx.numel(), kThreads), kThreads, 0, stream(dev)>>>(
      dx.data<float>(), cols.data<float>(), gather_geometry(s), s.channels_last());
  TG_LAUNCH_CHECK();
}

}  // namespace

bool engine_conv_can_implement(const ConvShape& s, DType dtype) {
  if (dtype != DType::f32) return false;
  const int64_t kvol = s.kernel_volume();
  if (!(fits(s.N * s.out_volume()) && fits(s.N * s.in_volume()) && fits(s.C * kvol) && fits(s.K * kvol))) return false;
  for (int d = 0; d < 3; ++d) {
    if (s.in[d] + 2 * s.pad[d] >= kCoordinateLimit) return false;
    if (s.dilation[d] * (s.kernel[d] - 1) >= kCoordinateLimit) return false;
    if (s.stride[d] >= kCoordinateLimit) return false;
  }
  return s.N >= 1 && s.C >= 1 && s.K >= 1;
}

bool engine_gemm_can_implement(const GemmProblem& p, DType dtype) {
  return dtype == DType::f32 && fits(p.M) && fits(p.N) && fits(p.K) && p.M >= 1 && p.N >= 1;
}

void engine_conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                         Precision precision, const EnginePolicy& policy) {
  TG_CHECK(engine_conv_can_implement(s, y.dtype()), "engine_conv_forward: problem x ", s.x_shape(), ", w ",
           s.w_shape(), " (", dtype_name(y.dtype()), ") is outside the engine's limits");
  const int dev = y.device().index;
  set_device(dev);
  const ConvGeometry g = geometry(s);
  const int64_t M = s.N * s.out_volume(), N = s.K, red = s.C * s.kernel_volume();
  const Tensor packed = pack_forward_weights(w, s);
  MainloopArgs args{};
  args.M = int32_t(M);
  args.N = int32_t(N);
  args.red = int32_t(red);
  args.out = output_map(y.data<float>(), b.defined() ? b.data<float>() : nullptr, M, N);
  if (!s.channels_last()) {
    args.out.mode = OutputMap::kChannelsFirst;
    args.out.div = FastDivmod(uint32_t(s.out_volume()));
  }
  const Plan plan = make_plan(M, N, red, dev, policy, /*narrow_ok=*/true, precision, /*gather=*/true);
  run(plan, args, y.device(), [&](const MainloopArgs& a, cudaStream_t st) {
    engine::launch_conv_fprop(g, s.channels_last(), x.data<float>(), packed.data<float>(), plan, a,
                              precision == Precision::FP32, st);
  });
}

void engine_conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                            Precision precision, const EnginePolicy& policy) {
  TG_CHECK(engine_conv_can_implement(s, dx.dtype()), "engine_conv_grad_input: problem x ", s.x_shape(), ", w ",
           s.w_shape(), " (", dtype_name(dx.dtype()), ") is outside the engine's limits");
  const int dev = dx.device().index;
  set_device(dev);
  if (columns_pay(s)) return grad_input_by_columns(dx, dy, w, s, precision, policy);
  cudaStream_t st = stream(dev);
  const ConvGeometry g = geometry(s);
  const bool unit_stride = s.stride[0] == 1 && s.stride[1] == 1 && s.stride[2] == 1;
  // Every tap belongs to exactly one phase per dim: the phases' packed weights fill w's size.
  const Tensor packed = Tensor::empty({w.numel()}, {.dtype = DType::f32, .device = w.device()});
  int64_t packed_offset = 0;
  for (int32_t fz = 0; fz < s.stride[0]; ++fz)
    for (int32_t fy = 0; fy < s.stride[1]; ++fy)
      for (int32_t fx = 0; fx < s.stride[2]; ++fx) {
        const DimPhase dims[3] = {dim_phase(s, 0, fz), dim_phase(s, 1, fy), dim_phase(s, 2, fx)};
        const PhaseGeometry ph = phase_geometry(dims);
        const int64_t rows = s.N * int64_t(ph.count[0]) * ph.count[1] * ph.count[2];
        if (rows == 0) continue;
        const int64_t red = int64_t(ph.tap_volume) * s.K;  // 0: these pixels get no gradient
        float* phase_w = packed.data<float>() + packed_offset;
        if (red > 0) {
          const PhaseTaps pt{{dims[0].tap0, dims[1].tap0, dims[2].tap0},
                             {dims[0].tap_step, dims[1].tap_step, dims[2].tap_step},
                             {dims[0].taps, dims[1].taps, dims[2].taps},
                             {g.kernel[0], g.kernel[1], g.kernel[2]}};
          pack_phase_weights_kernel<<<grid_for(s.C * red, kThreads), kThreads, 0, st>>>(phase_w, w.data<float>(), s.K,
                                                                                         s.C, pt);
          TG_LAUNCH_CHECK();
          packed_offset += s.C * red;
        }
        MainloopArgs args{};
        args.M = int32_t(rows);
        args.N = int32_t(s.C);
        args.red = int32_t(red);
        args.out = output_map(dx.data<float>(), nullptr, rows, s.C);
        if (!unit_stride) {
          args.out.mode = OutputMap::kPhase;
          auto& po = args.out.phase;
          po.div_count_volume = ph.div_count_volume;
          po.div_count_w = ph.div_count_w;
          po.div_count_h = ph.div_count_h;
          for (int d = 0; d < 3; ++d) {
            po.first[d] = ph.first[d];
            po.stride[d] = g.stride[d];
            po.in[d] = g.in[d];
          }
          po.in_volume = s.in_volume();
          po.channels_last = s.channels_last();
        } else if (!s.channels_last()) {
          args.out.mode = OutputMap::kChannelsFirst;
          args.out.div = FastDivmod(uint32_t(s.in_volume()));
        }
        const Plan plan = make_plan(rows, s.C, red, dev, policy, /*narrow_ok=*/true, precision, /*gather=*/true);
        run(plan, args, dx.device(), [&](const MainloopArgs& a, cudaStream_t stm) {
          engine::launch_conv_dgrad(g, ph, s.channels_last(), dy.data<float>(), phase_w, plan, a,
                                    precision == Precision::FP32, stm);
        });
      }
}

void engine_conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                             Precision precision, const EnginePolicy& policy) {
  TG_CHECK(engine_conv_can_implement(s, dw.dtype()), "engine_conv_grad_weight: problem x ", s.x_shape(), ", w ",
           s.w_shape(), " (", dtype_name(dw.dtype()), ") is outside the engine's limits");
  const int dev = dw.device().index;
  set_device(dev);
  const ConvGeometry g = geometry(s);
  const int64_t M = s.K, N = s.C * s.kernel_volume(), red = s.N * s.out_volume();
  MainloopArgs args{};
  args.M = int32_t(M);
  args.N = int32_t(N);
  args.red = int32_t(red);
  args.out = output_map(dw.data<float>(), nullptr, M, N);
  if (s.channels_last() && s.kernel_volume() > 1) {
    args.out.mode = OutputMap::kWeightsChannelsLast;
    args.out.div = FastDivmod(uint32_t(s.C));
    args.out.kvol = int32_t(s.kernel_volume());
  }
  const Plan plan = make_plan(M, N, red, dev, policy, /*narrow_ok=*/false, precision, /*gather=*/true);
  run(plan, args, dw.device(), [&](const MainloopArgs& a, cudaStream_t st) {
    engine::launch_conv_wgrad(g, s.channels_last(), dy.data<float>(), x.data<float>(), plan, a,
                              precision == Precision::FP32, st);
  });
}

void engine_gemm(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmProblem& p,
                 Precision precision, const EnginePolicy& policy) {
  TG_CHECK(engine_gemm_can_implement(p, c.dtype()), "engine_gemm: ", p.M, " x ", p.N, " x ", p.K, " (",
           dtype_name(c.dtype()), ") is outside the engine's limits");
  const int dev = c.device().index;
  set_device(dev);
  MainloopArgs args{};
  args.M = int32_t(p.M);
  args.N = int32_t(p.N);
  args.red = int32_t(p.K);
  args.out = output_map(c.data<float>(), bias.defined() ? bias.data<float>() : nullptr, p.M, p.N);
  // a is (M, K) or, transposed, (K, M); b is (K, N) or, transposed, (N, K).
  const bool a_k = !p.transA, b_k = p.transB;
  const int64_t lda = a_k ? p.K : p.M, ldb = b_k ? p.K : p.N;
  const Plan plan = make_plan(p.M, p.N, p.K, dev, policy, /*narrow_ok=*/b_k, precision, /*gather=*/false);
  run(plan, args, c.device(), [&](const MainloopArgs& ma, cudaStream_t st) {
    engine::launch_matmul(a.data<float>(), a_k, lda, b.data<float>(), b_k, ldb, plan, ma,
                          precision == Precision::FP32, st);
  });
}

}  // namespace tg::cuda
