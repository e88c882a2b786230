// Experiment (not built by CMake): a direct FP32 grad-input kernel for first layers (1-4 input
// channels, NCHW, 2-D, strides 1-2, dilation 1), against the routed pass (the engine's columns
// pass or the 3x3 kernels). The 7x7 s2 RGB stem's grad-input takes ~0.39 ms TF32 on the columns
// path, against a floor of ~15 us of memory and ~57 us of FP32 FMAs (2.4M dx values x ~12 taps x
// 64 channels) at the H200's FMA rate.
//
// The kernel: dx's pixels split into stride phases (iy = a sy + ry, ix = b sx + rx); within a
// phase the taps that reach a pixel are ky = ky0 + j sy, kx = kx0 + i sx, reading dy at
// (a + oyoff - j, b + oxoff - i): a stride-1 correlation over dy with a jy x jx sub-kernel. A block
// takes a tile of 32 x 32 phase pixels for every phase at once (so dy's tile is loaded once for
// all of them), chunks of 8 dy channels staged in shared memory with the chunk's weights (as
// float4 over the <= 4 input channels: one broadcast load per tap). Thread (warp q, lane l) owns
// phase column b0 + l and rows a0 + 4 q .. + 3 of every phase: per (channel, phase, x tap) it
// loads the 4 + kMaxJ - 1 dy values its rows and the phase's y taps need, then runs
// jy x 4 rows x C FMAs on them. FP32 sums in a fixed order (deterministic).
//
// Per problem and precision: the routed pass's ms, this kernel's ms, and its relative L2 distance
// to the routed output (FP32-accurate both: expect ~1e-7 at FP32, the TF32 error at TF32); at
// stride 2 also the variant that takes one phase at a time (fewer registers, dy staged per phase).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <algorithm>
#include <cstdio>

#include "conv_rows.h"
#include "core/cuda_context.h"

using namespace tg;
using conv_rows::Problem;

namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps, kRows = 4, kTileA = kWarps * kRows, kTileB = 32, kChunk = 8;

struct PhaseTaps {
  int ky0, jy, oyoff, kx0, jx, oxoff;
};

struct DgradGeometry {
  int N, C, K, H, W, OH, OW, KH, KW;
  int lo_y, lo_x, tile_rows, tile_cols;  // the dy tile: rows a0 + lo_y .., tile_rows x tile_cols
  int tiles_b;                           // phase-column tiles per image row of tiles
  PhaseTaps phase[4];                    // [ry * SX + rx]
};

// kPhaseOuter false: every phase's accumulators at once, dy's tile staged once for all of them;
// true: one phase at a time (a quarter of the accumulators at stride 2, more blocks per SM), dy's
// tile staged again per phase (from L2 after the first).
template <int C, int SY, int SX, int kMaxJ, bool kPhaseOuter>
__global__ void __launch_bounds__(kThreads, 1) few_dgrad_kernel(float* __restrict__ dx, const float* __restrict__ dy,
                                                                const float* __restrict__ w, const DgradGeometry g) {
  constexpr int P = SY * SX;
  constexpr int PA = kPhaseOuter ? 1 : P;  // phases per pass
  constexpr int V = kRows + kMaxJ - 1;
  extern __shared__ float4 smem4[];
  float4* ws = smem4;                                                  // [kChunk][KH][KW]
  float* ys = reinterpret_cast<float*>(smem4 + kChunk * g.KH * g.KW);  // [kChunk][tile_rows][tile_cols]
  const int n = blockIdx.z;
  const int a0 = (blockIdx.x / g.tiles_b) * kTileA, b0 = (blockIdx.x % g.tiles_b) * kTileB;
  const int q = threadIdx.x >> 5, l = threadIdx.x & 31;
  const int plane = g.tile_rows * g.tile_cols;
  const int taps = g.KH * g.KW;

  for (int pass = 0; pass < P / PA; ++pass) {
    float acc[PA][kRows][C];
#pragma unroll
    for (int p = 0; p < PA; ++p)
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
        for (int pa = 0; pa < PA; ++pa) {
          const PhaseTaps ph = g.phase[kPhaseOuter ? pass : pa];
          // Row of v[u]: this thread's rows, shifted so that tap j of row r reads v[r - j + kMaxJ - 1].
          const int row0 = kRows * q + ph.oyoff - g.lo_y - (kMaxJ - 1);
          for (int i = 0; i < ph.jx; ++i) {
            const int col = l + ph.oxoff - i - g.lo_x;
            float v[V];
#pragma unroll
            for (int u = 0; u < V; ++u) {
              const int row = min(max(row0 + u, 0), g.tile_rows - 1);  // rows past the taps' reach go unused
              v[u] = yk[row * g.tile_cols + col];
            }
            const float4* wrow = wk + ph.kx0 + i * SX;
#pragma unroll
            for (int j = 0; j < kMaxJ; ++j) {
              if (j >= ph.jy) break;
              const float4 wv = wrow[(ph.ky0 + j * SY) * g.KW];
              const float wc[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
              for (int r = 0; r < kRows; ++r)
#pragma unroll
                for (int c = 0; c < C; ++c) acc[pa][r][c] = fmaf(v[r - j + kMaxJ - 1], wc[c], acc[pa][r][c]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int pa = 0; pa < PA; ++pa) {
      const int p = kPhaseOuter ? pass : pa;
      const int ry = p / SX, rx = p % SX;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int iy = (a0 + kRows * q + r) * SY + ry, ix = (b0 + l) * SX + rx;
        if (iy >= g.H || ix >= g.W) continue;
#pragma unroll
        for (int c = 0; c < C; ++c) dx[((int64_t(n) * C + c) * g.H + iy) * g.W + ix] = acc[pa][r][c];
      }
    }
  }
}

// The launch for s (2-D NCHW, C <= 4, strides 1-2, dilation 1, every sub-kernel within 8 taps a
// side); false where it does not serve s.
bool few_dgrad(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s, bool phase_outer) {
  if (s.channels_last() || s.spatial_dims != 2 || s.C > 4 || s.stride[1] > 2 || s.stride[2] > 2 ||
      s.dilation[1] != 1 || s.dilation[2] != 1)
    return false;
  DgradGeometry g{};
  g.N = int(s.N), g.C = int(s.C), g.K = int(s.K), g.H = int(s.in[1]), g.W = int(s.in[2]);
  g.OH = int(s.out[1]), g.OW = int(s.out[2]), g.KH = int(s.kernel[1]), g.KW = int(s.kernel[2]);
  const int sy = int(s.stride[1]), sx = int(s.stride[2]), py = int(s.pad[1]), px = int(s.pad[2]);
  int lo_y = 1 << 30, hi_y = -(1 << 30), lo_x = 1 << 30, hi_x = -(1 << 30), max_j = 1;
  for (int ry = 0; ry < sy; ++ry)
    for (int rx = 0; rx < sx; ++rx) {
      PhaseTaps& ph = g.phase[ry * sx + rx];
      ph.ky0 = (ry + py) % sy;
      ph.jy = ph.ky0 < g.KH ? (g.KH - ph.ky0 + sy - 1) / sy : 0;
      ph.oyoff = (ry + py - ph.ky0) / sy;
      ph.kx0 = (rx + px) % sx;
      ph.jx = ph.kx0 < g.KW ? (g.KW - ph.kx0 + sx - 1) / sx : 0;
      ph.oxoff = (rx + px - ph.kx0) / sx;
      lo_y = std::min(lo_y, ph.oyoff - std::max(ph.jy - 1, 0));
      hi_y = std::max(hi_y, ph.oyoff);
      lo_x = std::min(lo_x, ph.oxoff - std::max(ph.jx - 1, 0));
      hi_x = std::max(hi_x, ph.oxoff);
      max_j = std::max({max_j, ph.jy, ph.jx});
    }
  if (max_j > 8) return false;
  const int kMaxJ = max_j <= 4 ? 4 : 8;
  // v[u] rows reach kMaxJ - 1 above the first tap's row: the tile covers them (clamped reads).
  g.lo_y = lo_y, g.lo_x = lo_x;
  g.tile_rows = kTileA + hi_y - lo_y;
  g.tile_cols = kTileB + hi_x - lo_x;
  const int tiles_a = (g.H + sy - 1) / sy, tiles_b = (g.W + sx - 1) / sx;
  g.tiles_b = (tiles_b + kTileB - 1) / kTileB;
  const dim3 grid(unsigned(((tiles_a + kTileA - 1) / kTileA) * g.tiles_b), 1, unsigned(g.N));
  const int smem = kChunk * g.KH * g.KW * 16 + kChunk * g.tile_rows * g.tile_cols * 4;
  cudaStream_t st = cuda::stream(0);
  auto go = [&](auto kernel) {
    cuda::allow_dynamic_smem(kernel, smem);
    kernel<<<grid, kThreads, smem, st>>>(dx.data<float>(), dy.data<float>(), w.data<float>(), g);
  };
  // Instantiations the probe's problems need (phases outermost only matters at stride 2).
  if (g.C == 3 && sy == 2 && sx == 2 && kMaxJ == 4) {
    if (phase_outer) go(few_dgrad_kernel<3, 2, 2, 4, true>);
    else go(few_dgrad_kernel<3, 2, 2, 4, false>);
  } else if (g.C == 3 && sy == 1 && sx == 1 && kMaxJ == 4) go(few_dgrad_kernel<3, 1, 1, 4, false>);
  else if (g.C == 1 && sy == 1 && sx == 1 && kMaxJ == 8) go(few_dgrad_kernel<1, 1, 1, 8, false>);
  else if (g.C == 4 && sy == 1 && sx == 1 && kMaxJ == 4) go(few_dgrad_kernel<4, 1, 1, 4, false>);
  else if (g.C == 3 && sy == 1 && sx == 1 && kMaxJ == 8) go(few_dgrad_kernel<3, 1, 1, 8, false>);
  else return false;
  return cudaGetLastError() == cudaSuccess;
}

void time_problem(const Problem& pr) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", pr.x, pr.w, pr.p);
  const Tensor w = uniform(s.w_shape(), -1, 1, {.device = gpu}), dy = uniform(s.y_shape(), -1, 1, {.device = gpu});
  const Tensor dx = Tensor::empty(s.x_shape(), {.device = gpu}), check = Tensor::empty(s.x_shape(), {.device = gpu});
  for (const Precision precision : {Precision::TF32, Precision::FP32}) {
    auto time = [&](auto&& launch) { return probe_common::median_ms(10, launch, 4, cuda::stream(0)); };
    cuda::conv_grad_input(check, dy, w, s, precision);
    const float routed = time([&] { cuda::conv_grad_input(check, dy, w, s, precision); });
    if (!few_dgrad(dx, dy, w, s, false)) {
      std::printf("%s %s: routed %.4f | not served\n", pr.name, precision == Precision::FP32 ? "fp32" : "tf32",
                  routed);
      continue;
    }
    const double err = probe_common::rel_l2(dx, check);
    const float direct = time([&] { few_dgrad(dx, dy, w, s, false); });
    std::printf("%s %s: routed %.4f | few_dgrad %.4f (x%.2f), differs from the routed pass by %.1e", pr.name,
                precision == Precision::FP32 ? "fp32" : "tf32", routed, direct, direct / routed, err);
    if (s.stride[1] == 2) {
      few_dgrad(dx, dy, w, s, true);
      const double err_outer = probe_common::rel_l2(dx, check);
      const float outer = time([&] { few_dgrad(dx, dy, w, s, true); });
      std::printf(" | phases outermost %.4f (x%.2f), differs by %.1e", outer, outer / routed, err_outer);
    }
    std::printf("\n");
  }
}

}  // namespace

int main() {
  const Problem problems[] = {
      {"7x7 s2 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"7x7 s2 3->64 @223 b3 (odd)", {3, 3, 223, 221}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"7x7 s2 3->20 @64 b2 (K not a chunk multiple)", {2, 3, 64, 64}, {20, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"3x3 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 3, 3}, {.padding = {1}}},
      {"3x3 3->32 @64 b64", {64, 3, 64, 64}, {32, 3, 3, 3}, {.padding = {1}}},
      {"3x3 4->128 @64 b16", {16, 4, 64, 64}, {128, 4, 3, 3}, {.padding = {1}}},
      {"5x5 1->32 @28 b64", {64, 1, 28, 28}, {32, 1, 5, 5}, {.padding = {2}}},
      {"7x7 3->64 @64 b8 (stride 1)", {8, 3, 64, 64}, {64, 3, 7, 7}, {.padding = {3}}},
  };
  for (const Problem& p : problems) time_problem(p);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done (%s)\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
