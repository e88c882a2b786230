// Weight gradient of the fused Conv3d(3x3x3) -> GroupNorm -> mean (workload C) on tensor cores,
// y recomputed per tile on mma.sync m16n8k8 TF32 and never written.
// Design, precision contract and the floor: docs/kernels/conv3d_gn_mean.md.
//
//  grad_w_mma        (1) y^T = W^T patch^T, (2) dy = A' + B z in place (its accumulator fragment
//                    is (3)'s B fragment, positions 2t -> t, 2t+1 -> t+4), (3) dW += patch^T dy;
//                    per-tile chains into thread-private smem slots (the tensor core truncates).
//  dw_blocks_reduce  block partials in block order, f64.
// Deterministic: no atomics; every sum has a fixed order.
#include <algorithm>
#include <cstdint>

#include "core/cuda_context.h"
#include "ops/cuda/conv3d_gn_mean/mma_sm80.h"
#include "ops/cuda/conv3d_gn_mean/launch_sm80.cuh"

namespace tg::cuda {

using namespace conv3d_gn_mean_mma_detail;

namespace {

// ---- backward: dW with y recomputed --------------------------------------------------------

// Persistent blocks over consecutive tiles; dw_partial (gridDim.x, K, 27 C): the block's dW.
// dy = A[n,c] + B[n,g] (z + bias[c]) with z = conv without bias.
template <int C, int NT, int TERMS>
__global__ void __launch_bounds__(128, 2)
grad_w_mma_kernel(float* __restrict__ dw_partial, const float* __restrict__ x, const float4* __restrict__ wfrag,
                  const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias, int G,
                  int cpg, MmaGeom g) {
  using T = Taps<C>;
  constexpr int MC = (NT + 1) / 2, MT = T::kTapTiles, NSLOT = MT * NT * 4;
  extern __shared__ float4 smem_bwd[];
  float4* wf = smem_bwd;                                            // [kSteps][MC][2][32]
  int2* tab_k = reinterpret_cast<int2*>(wf + T::kSteps * MC * 64);  // [kSteps][4]
  int2* tab_m = tab_k + T::kSteps * 4;                              // [MT][8]
  float* xs0 = reinterpret_cast<float*>(tab_m + MT * 8);            // [2][xs_floats] x tiles
  float* slots = xs0 + 2 * g.xs_floats;                             // [NSLOT][nthreads]
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5, gq = lane >> 2, tq = lane & 3;

  for (int i = tid; i < T::kSteps * MC * 64; i += nthreads) cp_async_16_full(wf + i, wfrag + i);
  stage_tap_tables<C>(tab_k, tab_m, g);
  for (int i = 0; i < NSLOT; ++i) slots[i * nthreads + tid] = 0.f;
  zero_x_tiles(xs0, g);
  __syncthreads();  // zeros before the first copies

  // As in the forward: the next tile's footprint is copied (cp.async) into the other buffer
  // while this one computes; one barrier per tile.
  const int64_t t_begin = blockIdx.x * g.tiles / gridDim.x, t_end = (blockIdx.x + 1) * g.tiles / gridDim.x;
  if (t_begin < t_end) stage_x_async<C>(xs0, x, tile_at(t_begin, g), g);
  cp_async_commit();
  for (int64_t t = t_begin; t < t_end; ++t) {
    const int buf = static_cast<int>((t - t_begin) & 1);
    const TileAt o = tile_at(t, g);
    // dy = ca + cb z for this lane's channels 16 mc + 8 r + g.
    float ca[MC][2], cb[MC][2];
#pragma unroll
    for (int mc = 0; mc < MC; ++mc)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int c = 16 * mc + 8 * r + gq;
        ca[mc][r] = cb[mc][r] = 0.f;
        if (c < g.K) {
          const float bg = B[o.n * G + c / cpg];
          cb[mc][r] = bg;
          ca[mc][r] = fmaf(bg, bias ? bias[c] : 0.f, A[o.n * g.K + c]);
        }
      }
    cp_async_wait<0>();
    __syncthreads();  // tile t's footprint is visible; every warp is done with tile t - 1's buffer
    if (t + 1 < t_end) stage_x_async<C>(xs0 + (buf ^ 1) * g.xs_floats, x, tile_at(t + 1, g), g);
    cp_async_commit();
    const float* xs = xs0 + buf * g.xs_floats;

    float accw[MT][NT][4];  // dW (taps 16 mt + g (+8), channels 8 nt + 2t (+1))
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int k = 0; k < 4; ++k) accw[mt][nt][k] = 0.f;

    // Rows (d, h) = warp, warp + nwarps, ... of TD x TH without divisions; the valid depths
    // and rows packed in one register (kept across the row loop instead of recomputed).
    const uint32_t limits = static_cast<uint32_t>(g.OD - o.d0 < g.TD ? g.OD - o.d0 : g.TD) |
                            static_cast<uint32_t>(g.OH - o.h0 < g.TH ? g.OH - o.h0 : g.TH) << 8;
    int d = 0, h = warp;
    for (;; h += nwarps) {
      while (h >= g.TH) h -= g.TH, ++d;
      if (d >= g.TD) break;
      if (d >= static_cast<int>(limits & 0xffu) || h >= static_cast<int>(limits >> 8)) continue;  // warp-uniform
      const float* row = xs + d * g.PS + h * kRS;

      // (1) y^T (channels x 32 positions) = W^T (channels x taps) . patch^T (taps x positions).
      float accy[MC][kNP][4];  // (channels 16 mc + g (+8), positions 8q + 2t (+1))
#pragma unroll
      for (int mc = 0; mc < MC; ++mc)
#pragma unroll
        for (int q = 0; q < kNP; ++q)
#pragma unroll
          for (int k = 0; k < 4; ++k) accy[mc][q][k] = 0.f;
#pragma unroll
      for (int s = 0; s < T::kSteps; ++s) {
        const int2 off = tab_k[s * 4 + tq];
        const float* p0 = row + off.x + gq;  // (tap 8s + t,     position g)
        const float* p1 = row + off.y + gq;  // (tap 8s + t + 4, position g)
        uint32_t ah[MC][4], al[MC][4];
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) {
          const float4 vh = wf[(s * MC + mc) * 64 + lane], vl = wf[(s * MC + mc) * 64 + 32 + lane];
          ah[mc][0] = __float_as_uint(vh.x), ah[mc][1] = __float_as_uint(vh.y);
          ah[mc][2] = __float_as_uint(vh.z), ah[mc][3] = __float_as_uint(vh.w);
          al[mc][0] = __float_as_uint(vl.x), al[mc][1] = __float_as_uint(vl.y);
          al[mc][2] = __float_as_uint(vl.z), al[mc][3] = __float_as_uint(vl.w);
        }
#pragma unroll
        for (int q = 0; q < kNP; ++q) {
          uint32_t bh[2], bl[2];
          split<TERMS>(p0[8 * q], bh[0], bl[0]);
          split<TERMS>(p1[8 * q], bh[1], bl[1]);
#pragma unroll
          for (int mc = 0; mc < MC; ++mc) mma_terms<TERMS>(accy[mc][q], ah[mc], al[mc], bh, bl);
        }
      }

      // (2) dy, zero at positions past OW. accy[mc][q][2r + e] is channel 16 mc + 8 r + g at
      // position 8q + 2t + e: the B fragment (k = t + 4e, n = g) of n-tile 2 mc + r in (3).
      uint32_t dh[kNP][NT][2], dl[kNP][NT][2];
#pragma unroll
      for (int q = 0; q < kNP; ++q) {
        const int64_t wpos = o.w0 + 8 * q + 2 * tq;
        const float v0 = wpos < g.OW ? 1.f : 0.f, v1 = wpos + 1 < g.OW ? 1.f : 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int mc = nt >> 1, r = nt & 1;
          const float y0 = fmaf(cb[mc][r], accy[mc][q][2 * r], ca[mc][r]) * v0;
          const float y1 = fmaf(cb[mc][r], accy[mc][q][2 * r + 1], ca[mc][r]) * v1;
          split<TERMS>(y0, dh[q][nt][0], dl[q][nt][0]);
          split<TERMS>(y1, dh[q][nt][1], dl[q][nt][1]);
        }
      }

      // (3) dW (taps x channels) += patch^T (taps x positions) . dy (positions x channels),
      // positions of each chunk in the order 2t -> k = t, 2t + 1 -> k = t + 4.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int2 off = tab_m[mt * 8 + gq];
        const float* q0 = row + off.x + 2 * tq;  // tap 16 mt + g
        const float* q1 = row + off.y + 2 * tq;  // tap 16 mt + g + 8
#pragma unroll
        for (int q = 0; q < kNP; ++q) {
          uint32_t ah[4], al[4];
          split<TERMS>(q0[8 * q], ah[0], al[0]);      // (tap g,     position 2t)
          split<TERMS>(q1[8 * q], ah[1], al[1]);      // (tap g + 8, position 2t)
          split<TERMS>(q0[8 * q + 1], ah[2], al[2]);  // (tap g,     position 2t + 1)
          split<TERMS>(q1[8 * q + 1], ah[3], al[3]);  // (tap g + 8, position 2t + 1)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_terms<TERMS>(accw[mt][nt], ah, al, dh[q][nt], dl[q][nt]);
        }
      }
    }

    // The tile's dW into the thread's slots: FP32 adds of short per-tile chains.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int k = 0; k < 4; ++k) slots[((mt * NT + nt) * 4 + k) * nthreads + tid] += accw[mt][nt][k];
  }

  // Block partial: dW (c, tap) sits in slot (mt, nt, 2 (tap % 16 / 8) + c % 2) of lane
  // 4 (tap % 8) + (c % 8) / 2 in every warp; warps added in order.
  __syncthreads();
  const int count = 8 * NT * T::kTaps;
  for (int e = tid; e < count; e += nthreads) {
    const int c = e / T::kTaps, tap = e % T::kTaps;
    const int slot = ((tap / 16) * NT + c / 8) * 4 + 2 * (tap % 16 / 8) + c % 2;
    const float* src = slots + slot * nthreads + 4 * (tap % 8) + (c % 8) / 2;
    float sum = 0.f;
    for (int w = 0; w < nwarps; ++w) sum += src[32 * w];
    dw_partial[static_cast<int64_t>(blockIdx.x) * count + e] = sum;
  }
}

// dw[e] = sum over blocks, in block order, of dw_partial[b][e] (f64: hundreds of terms).
__global__ void dw_blocks_reduce_kernel(float* __restrict__ dw, const float* __restrict__ partial, int64_t blocks,
                                        int count) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= count) return;
  double s = 0;
  for (int64_t b = 0; b < blocks; ++b) s += partial[b * count + e];
  dw[e] = static_cast<float>(s);
}

template <int C, int NT, int TERMS>
void launch_grad_weight(const Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& A,
                        const Tensor& B, const Conv3dGnMeanProblem& p, int dev, cudaStream_t st) {
  using T = Taps<C>;
  constexpr int kThreads = 128;
  const MmaGeom g = geom_of(p);
  const int smem = backward_smem_bytes<C, NT>(g, kThreads);
  auto kernel = grad_w_mma_kernel<C, NT, TERMS>;
  allow_shared_memory(kernel, smem);
  int per_sm = 0;
  TG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  const int sms = sm_count(dev);
  const int64_t blocks = std::clamp<int64_t>(int64_t{per_sm} * sms, 1, g.tiles);
  const int count = g.K * T::kTaps;
  Tensor frags = weight_fragments<C, NT>(w, TERMS, st);
  Tensor partial = Tensor::empty({blocks * count}, {.dtype = DType::f32, .device = x.device()});
  const float4* wf_bwd = reinterpret_cast<const float4*>(frags.data<float>()) + T::kSteps * NT * 32;
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, st>>>(
      partial.data<float>(), x.data<float>(), wf_bwd, A.data<float>(), B.data<float>(),
      b.defined() ? b.data<float>() : nullptr, static_cast<int>(p.groups), static_cast<int>(p.channels_per_group()),
      g);
  TG_LAUNCH_CHECK();
  dw_blocks_reduce_kernel<<<(count + 255) / 256, 256, 0, st>>>(dw.data<float>(), partial.data<float>(), blocks, count);
  TG_LAUNCH_CHECK();
}


template <int C, int NT, int TERMS>
struct GradWeightLaunch {
  template <class... Args>
  static void run(Args&&... args) { launch_grad_weight<C, NT, TERMS>(args...); }
};

}  // namespace


void conv3d_gn_mean_mma_grad_weight(const Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& b,
                                    const Tensor& A, const Tensor& B, const Conv3dGnMeanProblem& p, bool tf32) {
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  if (p.conv.N == 0) {
    TG_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), st));
    return;
  }
  dispatch_shape<GradWeightLaunch, 3>(p, tf32, dw, x, w, b, A, B, p, dev, st);
}

}  // namespace tg::cuda
