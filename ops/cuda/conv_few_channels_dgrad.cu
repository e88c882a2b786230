// Grad-input of first layers (1-4 input channels, channels-first 2-D, strides 1 or 2, dilation 1)
// on FP32 FMAs. dx has only C channels: a tensor-core tile would hold C of its 8-128 columns, and
// the engine's columns pass writes C kvol columns per dy pixel first (118 MB for a 7x7 RGB stem at
// batch 16). Here each dy value is read once into shared memory and multiplied into every dx
// pixel and channel it reaches. Design note: docs/kernels/few_channels.md.
//
// dx's pixels split into stride phases (iy = a s + ry, ix = b s + rx). Within a phase the taps that
// reach a pixel are ky = ky0 + j s, kx = kx0 + i s, reading dy at (a + oyoff - j, b + oxoff - i): a
// stride-1 correlation over dy with a jy x jx sub-kernel. A block takes 32 x 32 phase pixels of
// every phase at once (dy's tile is staged once for all of them), in chunks of 8 dy channels
// staged in shared memory with their weights (float4 over the input channels: one broadcast load
// per tap). Thread (warp q, lane l) owns phase column b0 + l and rows a0 + 4 q .. + 3 of every
// phase: per (channel, phase, x tap) it loads the 4 + kMaxJ - 1 dy values its rows and the
// phase's y taps read, then runs jy x 4 rows x C FMAs on them. FP32 sums in a fixed order:
// FP32-accurate at either precision, the same bits run to run.
#include <algorithm>

#include "core/cuda_context.h"
#include "core/error.h"
#include "ops/cuda/conv_few_channels.h"

namespace tg::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps, kRows = 4, kTileA = kWarps * kRows, kTileB = 32, kChunk = 8;
constexpr int kMaxSubTaps = 8;                       // taps of a phase's sub-kernel per dim
constexpr int64_t kCoordinateLimit = int64_t{1} << 29;  // coordinates and offsets formed in int

struct PhaseTaps {
  int ky0, jy, oyoff, kx0, jx, oxoff;
};

struct DgradGeometry {
  int N, C, K, H, W, OH, OW, KH, KW;
  int lo_y, lo_x, tile_rows, tile_cols;  // the dy tile: rows a0 + lo_y .., tile_rows x tile_cols
  int tiles_b;                           // tiles along the phase columns
  PhaseTaps phase[4];                    // [ry * S + rx]
};

template <int C, int S, int kMaxJ>
__global__ void __launch_bounds__(kThreads, 1) few_channels_dgrad_kernel(float* __restrict__ dx,
                                                                     const float* __restrict__ dy,
                                                                     const float* __restrict__ w,
                                                                     const DgradGeometry g) {
  constexpr int P = S * S;
  constexpr int V = kRows + kMaxJ - 1;
  extern __shared__ float4 smem4[];
  const int taps = g.KH * g.KW, plane = g.tile_rows * g.tile_cols;
  float4* ws = smem4;                                        // [kChunk][KH][KW], channels in x .. w
  float* ys = reinterpret_cast<float*>(smem4 + kChunk * taps);  // [kChunk][tile_rows][tile_cols]
  const int a0 = (blockIdx.x / g.tiles_b) * kTileA, b0 = (blockIdx.x % g.tiles_b) * kTileB;
  const int q = threadIdx.x >> 5, l = threadIdx.x & 31;

  for (int n = blockIdx.z; n < g.N; n += gridDim.z) {
    float acc[P][kRows][C];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) acc[p][r][c] = 0.f;

    for (int k0 = 0; k0 < g.K; k0 += kChunk) {
      __syncthreads();  // the previous chunk's readers are done
      for (int e = threadIdx.x; e < kChunk * plane; e += kThreads) {
        const int kk = e / plane, rc = e - kk * plane, r = rc / g.tile_cols, cc = rc - r * g.tile_cols;
        const int k = k0 + kk, oy = a0 + g.lo_y + r, ox = b0 + g.lo_x + cc;
        float v = 0.f;
        if (k < g.K && oy >= 0 && oy < g.OH && ox >= 0 && ox < g.OW)
          v = dy[((int64_t(n) * g.K + k) * g.OH + oy) * g.OW + ox];
        ys[e] = v;
      }
      for (int e = threadIdx.x; e < kChunk * taps; e += kThreads) {
        const int kk = e / taps, t = e - kk * taps, k = k0 + kk;
        float f[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int c = 0; c < C; ++c) f[c] = k < g.K ? w[(int64_t(k) * C + c) * taps + t] : 0.f;
        ws[e] = make_float4(f[0], f[1], f[2], f[3]);
      }
      __syncthreads();
      for (int kk = 0; kk < kChunk; ++kk) {
        const float* yk = ys + kk * plane;
        const float4* wk = ws + kk * taps;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const PhaseTaps ph = g.phase[p];
          // v[u] holds the row that tap j of this thread's row r reads when u = r - j + kMaxJ - 1.
          const int row0 = kRows * q + ph.oyoff - g.lo_y - (kMaxJ - 1);
          for (int i = 0; i < ph.jx; ++i) {
            const int col = l + ph.oxoff - i - g.lo_x;
            float v[V];
#pragma unroll
            for (int u = 0; u < V; ++u) {
              // Rows outside the tile belong to taps past jy (never used): clamped, not read past it.
              const int row = min(max(row0 + u, 0), g.tile_rows - 1);
              v[u] = yk[row * g.tile_cols + col];
            }
            const float4* wcol = wk + ph.kx0 + i * S;
#pragma unroll
            for (int j = 0; j < kMaxJ; ++j) {
              if (j >= ph.jy) break;
              const float4 wv = wcol[(ph.ky0 + j * S) * g.KW];
              const float wc[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
              for (int r = 0; r < kRows; ++r)
#pragma unroll
                for (int c = 0; c < C; ++c) acc[p][r][c] = fmaf(v[r - j + kMaxJ - 1], wc[c], acc[p][r][c]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int ry = p / S, rx = p % S;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int iy = (a0 + kRows * q + r) * S + ry, ix = (b0 + l) * S + rx;
        if (iy >= g.H || ix >= g.W) continue;
#pragma unroll
        for (int c = 0; c < C; ++c) dx[((int64_t(n) * C + c) * g.H + iy) * g.W + ix] = acc[p][r][c];
      }
    }
  }
}

// The phases of s and the dy tile they need (s must satisfy few_channels_grad_input_applies but
// for the sub-kernel's size, which this returns).
int plan_phases(const ConvShape& s, DgradGeometry& g) {
  const int S = int(s.stride[1]), py = int(s.pad[1]), px = int(s.pad[2]);
  int lo_y = 1 << 30, hi_y = -(1 << 30), lo_x = 1 << 30, hi_x = -(1 << 30), max_j = 1;
  for (int ry = 0; ry < S; ++ry)
    for (int rx = 0; rx < S; ++rx) {
      PhaseTaps& ph = g.phase[ry * S + rx];
      ph.ky0 = (ry + py) % S;
      ph.jy = ph.ky0 < g.KH ? (g.KH - ph.ky0 + S - 1) / S : 0;
      ph.oyoff = (ry + py - ph.ky0) / S;
      ph.kx0 = (rx + px) % S;
      ph.jx = ph.kx0 < g.KW ? (g.KW - ph.kx0 + S - 1) / S : 0;
      ph.oxoff = (rx + px - ph.kx0) / S;
      lo_y = std::min(lo_y, ph.oyoff - std::max(ph.jy - 1, 0));
      hi_y = std::max(hi_y, ph.oyoff);
      lo_x = std::min(lo_x, ph.oxoff - std::max(ph.jx - 1, 0));
      hi_x = std::max(hi_x, ph.oxoff);
      max_j = std::max({max_j, ph.jy, ph.jx});
    }
  g.lo_y = lo_y;
  g.lo_x = lo_x;
  g.tile_rows = kTileA + hi_y - lo_y;
  g.tile_cols = kTileB + hi_x - lo_x;
  return max_j;
}

int smem_bytes(const DgradGeometry& g) {
  return kChunk * g.KH * g.KW * 16 + kChunk * g.tile_rows * g.tile_cols * 4;
}

template <int C, int S, int kMaxJ>
void launch(const Tensor& dx, const Tensor& dy, const Tensor& w, const DgradGeometry& g, dim3 grid,
            cudaStream_t st) {
  auto kernel = few_channels_dgrad_kernel<C, S, kMaxJ>;
  const int smem = smem_bytes(g);
  allow_dynamic_smem(kernel, smem);
  kernel<<<grid, kThreads, smem, st>>>(dx.data<float>(), dy.data<float>(), w.data<float>(), g);
  TG_LAUNCH_CHECK();
}

template <int S, int kMaxJ>
void launch_for_channels(const Tensor& dx, const Tensor& dy, const Tensor& w, const DgradGeometry& g, dim3 grid,
                         cudaStream_t st) {
  switch (g.C) {
    case 1: return launch<1, S, kMaxJ>(dx, dy, w, g, grid, st);
    case 2: return launch<2, S, kMaxJ>(dx, dy, w, g, grid, st);
    case 3: return launch<3, S, kMaxJ>(dx, dy, w, g, grid, st);
    default: return launch<4, S, kMaxJ>(dx, dy, w, g, grid, st);
  }
}

DgradGeometry geometry_of(const ConvShape& s) {
  DgradGeometry g{};
  g.N = int(std::min<int64_t>(s.N, kCoordinateLimit));
  g.C = int(s.C);
  g.K = int(std::min<int64_t>(s.K, kCoordinateLimit));
  g.H = int(s.in[1]);
  g.W = int(s.in[2]);
  g.OH = int(s.out[1]);
  g.OW = int(s.out[2]);
  g.KH = int(s.kernel[1]);
  g.KW = int(s.kernel[2]);
  return g;
}

}  // namespace

bool few_channels_grad_input_applies(const ConvShape& s) {
  if (s.channels_last() || s.C < 1 || s.C > 4 || s.K < 1 || s.N < 1) return false;
  // 2-D: the depth dim is the identity.
  if (s.in[0] != 1 || s.kernel[0] != 1 || s.stride[0] != 1 || s.pad[0] != 0 || s.dilation[0] != 1) return false;
  const int64_t stride = s.stride[1];
  if (s.stride[2] != stride || (stride != 1 && stride != 2) || s.dilation[1] != 1 || s.dilation[2] != 1) return false;
  for (int d = 1; d < 3; ++d)
    if (s.in[d] >= kCoordinateLimit || s.out[d] >= kCoordinateLimit || s.pad[d] >= kCoordinateLimit ||
        s.kernel[d] > kMaxSubTaps * stride)
      return false;
  if (s.N >= kCoordinateLimit || s.K >= kCoordinateLimit) return false;
  DgradGeometry g = geometry_of(s);
  if (plan_phases(s, g) > kMaxSubTaps) return false;
  const int64_t tiles = ((s.in[1] + stride - 1) / stride + kTileA - 1) / kTileA *
                        (((s.in[2] + stride - 1) / stride + kTileB - 1) / kTileB);
  return tiles < (int64_t{1} << 31) && smem_bytes(g) <= 160 * 1024;
}

void few_channels_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s) {
  TG_CHECK(few_channels_grad_input_applies(s), "conv_grad_input (few channels): not applicable to x ", s.x_shape(),
           ", w ", s.w_shape());
  if (dx.numel() == 0) return;
  DgradGeometry g = geometry_of(s);
  const int max_j = plan_phases(s, g);
  const int S = int(s.stride[1]);
  const int64_t tiles_a = ((s.in[1] + S - 1) / S + kTileA - 1) / kTileA;
  g.tiles_b = int(((s.in[2] + S - 1) / S + kTileB - 1) / kTileB);
  const dim3 grid(unsigned(tiles_a * g.tiles_b), 1, unsigned(std::min<int64_t>(s.N, 65535)));
  const int dev = dx.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  if (S == 1) {
    if (max_j <= 4) launch_for_channels<1, 4>(dx, dy, w, g, grid, st);
    else launch_for_channels<1, 8>(dx, dy, w, g, grid, st);
  } else {
    if (max_j <= 4) launch_for_channels<2, 4>(dx, dy, w, g, grid, st);
    else launch_for_channels<2, 8>(dx, dy, w, g, grid, st);
  }
}

}  // namespace tg::cuda
