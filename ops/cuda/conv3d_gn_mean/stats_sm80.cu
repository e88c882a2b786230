// Forward statistics of the fused Conv3d(3x3x3) -> GroupNorm -> mean (workload C) on tensor cores:
// the conv as an implicit GEMM on mma.sync m16n8k8 TF32; y lives in accumulator registers only.
// Design, precision contract and the floor: docs/kernels/conv3d_gn_mean.md.
//
//  stats_mma         persistent; per tile one barrier; per-lane sums of z and z^2 (z = y - bias)
//                    from the accumulators, warp butterfly, warps in order (f64) -> (tile, 2, K).
//  tile_stats_reduce tiles of a sample in order -> S1, S2 (bias folded back in).
// Deterministic: no atomics; every sum has a fixed order.
#include <algorithm>
#include <cstdint>

#include "core/cuda_context.h"
#include "ops/cuda/conv3d_gn_mean/mma_sm80.h"
#include "ops/cuda/conv3d_gn_mean/launch_sm80.cuh"

namespace tg::cuda {

using namespace conv3d_gn_mean_mma_detail;

namespace {

// ---- forward: statistics ------------------------------------------------------------------

// One unit's conv GEMM in w's tap order: acc[m] (m16 tile m: row h + m / 2, columns
// 16 (m % 2) + 0..15, from base = position (row h, column g)) += x patch . W. Per k8 step a
// lane gathers its taps 8s + t and 8s + t + 4 (offsets from the per-lane table) for 4 tiles
// x 2 positions: 16 gathers per 4 NT tensor-op products.
template <int C, int NT, int TERMS>
__device__ __forceinline__ void forward_unit(float (&acc)[4][NT][4], const float* base, const int2* tab,
                                             const float4* wf, int lane) {
  using T = Taps<C>;
  const int tq = lane & 3;
#pragma unroll
  for (int s = 0; s < T::kSteps; ++s) {
    const int2 off = tab[s * 4 + tq];
    const float* p0 = base + off.x;  // tap 8s + t
    const float* p1 = base + off.y;  // tap 8s + t + 4
    uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float4 v = wf[(s * NT + n) * 32 + lane];
      bh[n][0] = __float_as_uint(v.x), bh[n][1] = __float_as_uint(v.y);
      bl[n][0] = __float_as_uint(v.z), bl[n][1] = __float_as_uint(v.w);
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int mo = (m >> 1) * kRS + (m & 1) * 16;
      uint32_t ah[4], al[4];
      split<TERMS>(p0[mo], ah[0], al[0]);      // (position g,     tap t)
      split<TERMS>(p0[mo + 8], ah[1], al[1]);  // (position g + 8, tap t)
      split<TERMS>(p1[mo], ah[2], al[2]);      // (position g,     tap t + 4)
      split<TERMS>(p1[mo + 8], ah[3], al[3]);  // (position g + 8, tap t + 4)
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_terms<TERMS>(acc[m][n], ah, al, bh[n], bl[n]);
    }
  }
}

// The same in the grouped tap order (TapGroups3, C_in = 3; gtab[4 i + t] = lane t's group i).
// F(r, ch) of a group pair is gathered and split once and is the A fragment of tile (row hr,
// half ch) at step kh = r - hr, i.e. twice for r = 1, 2 (checked in SASS: 112 LDS per unit).
template <int NT, int TERMS>
__device__ __forceinline__ void forward_unit_grouped(float (&acc)[4][NT][4], const float* base, const int* gtab,
                                                     const float4* wf, int lane) {
  const int* gt = gtab + (lane & 3);
  auto weights = [&](int s, uint32_t (&bh)[NT][2], uint32_t (&bl)[NT][2]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float4 v = wf[(s * NT + n) * 32 + lane];
      bh[n][0] = __float_as_uint(v.x), bh[n][1] = __float_as_uint(v.y);
      bl[n][0] = __float_as_uint(v.z), bl[n][1] = __float_as_uint(v.w);
    }
  };
  // Fragment elements 2 e, 2 e + 1 (K column t + 4 e; positions g, g + 8) from group row r.
  auto gather = [&](const float* pgr, int r, int ch, uint32_t (&ah)[4], uint32_t (&al)[4], int e) {
    split<TERMS>(pgr[r * kRS + 16 * ch], ah[2 * e], al[2 * e]);
    split<TERMS>(pgr[r * kRS + 16 * ch + 8], ah[2 * e + 1], al[2 * e + 1]);
  };
  // FP32 (2 ops) rolls the pair loop: fully unrolled, the 128-register cap spills (the
  // compiler hoists the next pair's gathers); TF32 unrolls it (fewer instructions, no spills).
#pragma unroll(TERMS == 1 ? 3 : 1)
  for (int p = 0; p < 3; ++p) {
    const float* pa = base + gt[4 * (2 * p)];
    const float* pb = base + gt[4 * (2 * p + 1)];
#pragma unroll
    for (int kh = 0; kh < 3; ++kh) {
      uint32_t bh[NT][2], bl[NT][2];
      weights(3 * p + kh, bh, bl);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        uint32_t ah[4], al[4];
        gather(pa, (m >> 1) + kh, m & 1, ah, al, 0);
        gather(pb, (m >> 1) + kh, m & 1, ah, al, 1);
#pragma unroll
        for (int n = 0; n < NT; ++n) mma_terms<TERMS>(acc[m][n], ah, al, bh[n], bl[n]);
      }
    }
  }
  // G6: step 9 = (kh 0 | kh 1), step 10 = (kh 2 | padding).
  const float* p6 = base + gt[4 * 6];
#pragma unroll
  for (int s = 9; s < 11; ++s) {
    uint32_t bh[NT][2], bl[NT][2];
    weights(s, bh, bl);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      uint32_t ah[4], al[4];
      gather(p6, (m >> 1) + 2 * (s - 9), m & 1, ah, al, 0);
      if (s == 9) {
        gather(p6, (m >> 1) + 1, m & 1, ah, al, 1);
      } else {
        ah[2] = ah[3] = al[2] = al[3] = 0u;
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_terms<TERMS>(acc[m][n], ah, al, bh[n], bl[n]);
    }
  }
}

// Group offsets for forward_unit_grouped: gtab[4 i + t] = offset of lane t's group i in the x
// tile (0 for the absent group: any finite x, zero weights).
__device__ void stage_group_table(int* gtab, const MmaGeom& g) {
  for (int i = threadIdx.x; i < TapGroups3::kPerLane * 4; i += blockDim.x) {
    const int q = TapGroups3::group(i / 4, i % 4);
    gtab[i] = q < TapGroups3::kGroups ? (q / 9) * g.CS + (q % 9 / 3) * g.PS + q % 3 : 0;
  }
}

// Persistent blocks: block b computes tiles b, b + grid, ...; partial (tiles, 2, K) f64: a
// tile's sums of z and z^2 per channel, independent of the grid.
//
// Pipeline, one barrier per tile: [wait for my copies of tile t; barrier] -> the previous
// tile's cross-warp sums (warps in order, from red[buf ^ 1]) -> cp.async of the next tile's
// footprint into xs[buf ^ 1] (every warp has passed the barrier, so none still reads it) ->
// the units of tile t from xs[buf] -> warp sums by shuffles into red[buf]. The weights are
// staged once per block (in the first copy group).
template <int C, int NT, int TERMS>
__global__ void __launch_bounds__(kMaxForwardWarps * 32, 3)
stats_mma_kernel(double* __restrict__ partial, const float* __restrict__ x, const float4* __restrict__ wfrag,
                 MmaGeom g) {
  using T = Taps<C>;
  constexpr int K = 8 * NT;
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5, gq = lane >> 2, tq = lane & 3;
  extern __shared__ float4 smem_fwd[];
  float4* wf = smem_fwd;                                          // [kSteps][NT][32]
  int2* tab = reinterpret_cast<int2*>(wf + T::kSteps * NT * 32);  // [kSteps][4]
  double* red = reinterpret_cast<double*>(tab + T::kSteps * 4);   // [2][nwarps][2][K] warp sums
  float* xs0 = reinterpret_cast<float*>(red + 2 * nwarps * 2 * K);  // [2][xs_floats] x tiles

  for (int i = tid; i < T::kSteps * NT * 32; i += nthreads) cp_async_16_full(wf + i, wfrag + i);
  if constexpr (kGroupedTaps<C>) {
    static_assert(TapGroups3::kPerLane * 4 * sizeof(int) <= T::kSteps * 4 * sizeof(int2), "fits the table space");
    stage_group_table(reinterpret_cast<int*>(tab), g);
  } else {
    stage_tap_tables<C>(tab, nullptr, g);
  }
  zero_x_tiles(xs0, g);
  __syncthreads();  // zeros before the first copies
  int64_t t = blockIdx.x;
  stage_x_async<C>(xs0, x, tile_at(t, g), g);  // the grid never exceeds the tile count
  cp_async_commit();

  int buf = 0;
  for (; t < g.tiles; t += gridDim.x, buf ^= 1) {
    cp_async_wait<0>();
    __syncthreads();
    if (t != blockIdx.x)
      for (int i = tid; i < 2 * K; i += nthreads) {
        double sum = 0;
        for (int w = 0; w < nwarps; ++w) sum += red[((buf ^ 1) * nwarps + w) * 2 * K + i];
        partial[(t - gridDim.x) * 2 * K + i] = sum;
      }
    if (t + gridDim.x < g.tiles) stage_x_async<C>(xs0 + (buf ^ 1) * g.xs_floats, x, tile_at(t + gridDim.x, g), g);
    cp_async_commit();

    // The tile's valid output depths, rows and columns (all its own at the interior).
    const TileAt o = tile_at(t, g);
    // Packed in one register (depths <= 4, rows <= 16, cols <= 32): unpacked, the compiler
    // recomputed them from the tile index in every unit (~40 instructions) for lack of registers.
    const uint32_t limits = static_cast<uint32_t>(g.OD - o.d0 < g.TD ? g.OD - o.d0 : g.TD) |
                            static_cast<uint32_t>(g.OH - o.h0 < g.TH ? g.OH - o.h0 : g.TH) << 8 |
                            static_cast<uint32_t>(g.OW - o.w0 < kTW ? g.OW - o.w0 : kTW) << 16;
    const float* xs = xs0 + buf * g.xs_floats;
    float s1[NT][2], s2[NT][2];  // channels 8n + 2t + e
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) s1[n][e] = s2[n][e] = 0.f;

    // Units (depth d, row pair h / 2) = warp, warp + nwarps, ... of TD x TH / 2, walked without
    // divisions (h advances by 2 nwarps, carrying into d).
    const int pairs = g.TH / 2;
    int d = warp / pairs, h = 2 * (warp % pairs);
    for (; d < g.TD; h += 2 * nwarps) {
      while (h >= g.TH) h -= g.TH, ++d;
      if (d >= g.TD) break;
      const int depths = static_cast<int>(limits & 0xffu), rows = static_cast<int>(limits >> 8 & 0xffu);
      const int cols = static_cast<int>(limits >> 16);
      if (d >= depths || h >= rows) continue;  // warp-uniform
      const bool row1 = h + 1 < rows;
      const float* base = xs + d * g.PS + h * kRS + gq;  // position (row h, column g)
      float acc[4][NT][4];  // m16 tile m: row h + m / 2, columns 16 (m % 2) + 0..15
#pragma unroll
      for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int k = 0; k < 4; ++k) acc[m][n][k] = 0.f;
      if constexpr (kGroupedTaps<C>) {
        forward_unit_grouped<NT, TERMS>(acc, base, reinterpret_cast<const int*>(tab), wf, lane);
      } else {
        forward_unit<C, NT, TERMS>(acc, base, tab, wf, lane);
      }
      // acc[m][n] = z at (positions g, g + 8 of m16 tile m) x (channels 8n + 2t, 8n + 2t + 1);
      // columns past OW masked.
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        if (m >= 2 && !row1) break;
        const float mlo = 16 * (m & 1) + gq < cols ? 1.f : 0.f, mhi = 16 * (m & 1) + 8 + gq < cols ? 1.f : 0.f;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float z0 = acc[m][n][e] * mlo, z1 = acc[m][n][2 + e] * mhi;
            s1[n][e] += z0 + z1;
            s2[n][e] = fmaf(z0, z0, fmaf(z1, z1, s2[n][e]));
          }
      }
    }

    // Channel c's sums are spread over the 8 lanes g of t = (c % 8) / 2: a fixed butterfly
    // (every lane ends with the same bits), then lane g = 0 keeps the warp's sum.
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int mask = 4; mask < 32; mask *= 2) {
          s1[n][e] += shfl_xor(s1[n][e], mask);
          s2[n][e] += shfl_xor(s2[n][e], mask);
        }
    if (gq == 0) {
      double* r = red + (buf * nwarps + warp) * 2 * K;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          r[8 * n + 2 * tq + e] = s1[n][e];
          r[K + 8 * n + 2 * tq + e] = s2[n][e];
        }
    }
  }
  __syncthreads();
  for (int i = tid; i < 2 * K; i += nthreads) {
    double sum = 0;
    for (int w = 0; w < nwarps; ++w) sum += red[((buf ^ 1) * nwarps + w) * 2 * K + i];
    partial[(t - gridDim.x) * 2 * K + i] = sum;
  }
}

// One thread per (n, c): the tiles of sample n in order; y = z + b folded back in exactly.
__global__ void tile_stats_reduce_kernel(double* __restrict__ S1, double* __restrict__ S2,
                                         const double* __restrict__ partial, const float* __restrict__ bias,
                                         int64_t N, int K, int64_t tiles_per_sample, double V) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * K) return;
  const int64_t n = i / K;
  const int c = static_cast<int>(i % K);
  const double* pp = partial + n * tiles_per_sample * 2 * K + c;
  double a = 0, q = 0;
  for (int64_t t = 0; t < tiles_per_sample; ++t) {
    a += pp[2 * K * t];
    q += pp[2 * K * t + K];
  }
  const double bc = bias ? static_cast<double>(bias[c]) : 0.0;
  S1[i] = a + V * bc;
  S2[i] = q + 2.0 * bc * a + V * bc * bc;
}

template <int C, int NT, int TERMS>
void launch_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                  const Conv3dGnMeanProblem& p, int dev, cudaStream_t st) {
  const MmaGeom g = geom_of(p);
  TG_CHECK(g.tiles < (int64_t{1} << 31), "conv3d_gn_mean: ", g.tiles, " tiles exceed one grid");
  const int threads = 32 * forward_warps(g.TD * g.TH / 2);
  const int smem = forward_smem_bytes<C, NT>(g, threads);
  auto kernel = stats_mma_kernel<C, NT, TERMS>;
  allow_shared_memory(kernel, smem);
  const int64_t blocks = persistent_blocks(kernel, threads, smem, g.tiles, dev);
  Tensor frags = weight_fragments<C, NT>(w, TERMS, st);
  Tensor partial = Tensor::empty({g.tiles * 2 * g.K}, {.dtype = DType::f64, .device = x.device()});
  kernel<<<static_cast<unsigned>(blocks), threads, smem, st>>>(
      partial.data<double>(), x.data<float>(), reinterpret_cast<const float4*>(frags.data<float>()), g);
  TG_LAUNCH_CHECK();
  tile_stats_reduce_kernel<<<item_blocks(g.N * g.K, 256), 256, 0, st>>>(
      S1.data<double>(), S2.data<double>(), partial.data<double>(), b.defined() ? b.data<float>() : nullptr, g.N,
      g.K, g.tiles_per_sample, static_cast<double>(p.volume()));
  TG_LAUNCH_CHECK();
}

template <int C, int NT, int TERMS>
struct StatsLaunch {
  template <class... Args>
  static void run(Args&&... args) { launch_stats<C, NT, TERMS>(args...); }
};

}  // namespace

void conv3d_gn_mean_mma_stats(const Tensor& S1, const Tensor& S2, const Tensor& x, const Tensor& w, const Tensor& b,
                              const Conv3dGnMeanProblem& p, bool tf32) {
  const int dev = x.device().index;
  set_device(dev);
  if (p.conv.N == 0) return;
  dispatch_shape<StatsLaunch, 2>(p, tf32, S1, S2, x, w, b, p, dev, stream(dev));
}

}  // namespace tg::cuda
