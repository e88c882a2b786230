// Backward of the fused Conv3d(3x3x3) -> GroupNorm -> mean (workload C) through the conv on FFMA:
// conv3d_gn_mean_grad_conv, which takes the tensor-core kernel (conv3d_gn_mean/grad_sm80.cu) for
// dW without dx, these FFMA kernels for the fused shape class, else the materialized path.
// y is recomputed per tile and never written. Design: docs/kernels/conv3d_gn_mean.md.
//
//  grad_conv_kernel  persistent: phase A writes dy = A + B y to smem; phase B accumulates dW in
//                    registers (thread-private slots between tiles); phase C (dx wanted) writes
//                    the transposed conv of the footprint as a per-tile partial.
//  dw_reduce         per-block dW partials in block order -> dw.
//  dx_reduce         every x element sums the tile footprints that cover it, in order.
//  affine_dy_kernel  the materialized path's dL/dy = A + B y, in place.
// Deterministic: no atomics; every reduction has a fixed order for a given device.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "core/precision.h"
#include "ops/cuda/conv3d_gn_mean/mma_sm80.h"
#include "ops/cuda/conv3d_gn_mean/tiles_ffma.cuh"

namespace tg::cuda {

using namespace conv3d_gn_mean_detail;

namespace {

// ---- materialized path (problems outside the fused shape class, and f64) -------------------

// y <- A[n,c] + B[n,g] * y, in place.   y (N, K, V)
template <class T>
__global__ void affine_dy_kernel(T* __restrict__ y, const T* __restrict__ A, const T* __restrict__ B, int64_t total,
                                 int64_t K, int64_t G, int64_t cpg, int64_t V) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t nc = i / V, n = nc / K, c = nc % K;
    y[i] = A[nc] + B[n * G + c / cpg] * y[i];
  }
}

// ---- backward: dW (and dx) with y recomputed per tile --------------------------------------

// Phase A of the backward: dy = A' + B z for this item into dys [kP][TH][TW][ds], zero where
// the output does not exist (so phases B and C may read the whole tile).
template <int CA, int PP>
__device__ __forceinline__ void dy_item(float* dys, const float* coef, const float* ws, const float* xs,
                                        const TileGeom& g, const TileOrigin& o, int chunk, int hh, int ww) {
  float acc[CA][PP];
  conv_tile<CA, PP>(acc, ws + chunk * CA, xs + hh * g.xs_h + ww * kXD, g);
  const bool hw_valid = o.h0 + hh < g.OH && o.w0 + ww < g.OW;
  const float* ca = coef + chunk * CA;             // A + B bias
  const float* cb = coef + g.Kpad + chunk * CA;    // B
#pragma unroll
  for (int p = 0; p < kP; ++p) {
    const bool valid = p < PP && hw_valid && o.d0 + p < g.OD;
    float* dst = dys + ((p * g.TH + hh) * g.TW + ww) * g.ds + chunk * CA;
#pragma unroll
    for (int c = 0; c < CA; c += 4) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (valid) {
        const int pp = p < PP ? p : 0;  // keeps the index in range; unused when !valid
        v.x = fmaf(cb[c + 0], acc[c + 0][pp], ca[c + 0]);
        v.y = fmaf(cb[c + 1], acc[c + 1][pp], ca[c + 1]);
        v.z = fmaf(cb[c + 2], acc[c + 2][pp], ca[c + 2]);
        v.w = fmaf(cb[c + 3], acc[c + 3][pp], ca[c + 3]);
      }
      *reinterpret_cast<float4*>(dst + c) = v;
    }
  }
}

// Persistent blocks over consecutive tiles (any samples). Outputs:
//   dw_partial (gridDim.x, owners, kCG, 3): this block's dW, position subsets summed in order;
//   dx_partial (tiles, C, kP + 2, FH, FW) when g.with_dx: each tile's transposed conv.
template <int CA>
__global__ void __launch_bounds__(kThreads, 2)
grad_conv_kernel(float* __restrict__ dw_partial, float* __restrict__ dx_partial, const float* __restrict__ x,
                 const float* __restrict__ w, const float* __restrict__ bias, const float* __restrict__ A,
                 const float* __restrict__ B, TileGeom g) {
  extern __shared__ float4 smem_grad[];
  float* ws = reinterpret_cast<float*>(smem_grad);  // [C][3][3][3][Kpad]
  float* coef = ws + g.off_coef;                     // [2][Kpad]: A + B bias, and B, per channel
  float* xs = ws + g.off_x;                          // [C][kP+2][FH][FW], padded strides
  float* slots = ws + g.off_slots;                   // [kCG * 3][kThreads]: phase-B accumulators
  float* dys = ws + g.off_dy;                        // [kP][TH][TW][ds]
  stage_weights(ws, w, g);

  const int tid = threadIdx.x;
  const int chunk = tid / g.plane, pos = tid % g.plane, hh = pos / g.TW, ww = pos % g.TW;
  // Phase-B ownership, fixed for the block: rows r = 9 ci + 3 kd + kh are consecutive across
  // lanes (the x tile's channel stride is chosen to spread those rows over the banks).
  const bool owner = tid < g.owners * g.PS;
  const int o_id = tid % g.owners, ps = tid / g.owners;
  const int r = o_id % g.R, cg = o_id / g.R;
  const int ci_b = r / 9, kd_b = (r / 3) % 3, kh_b = r % 3;
  for (int k = 0; k < 3 * kCG; ++k) slots[k * kThreads + tid] = 0.f;

  const int64_t t_begin = blockIdx.x * g.tiles / gridDim.x, t_end = (blockIdx.x + 1) * g.tiles / gridDim.x;
  for (int64_t t = t_begin; t < t_end; ++t) {
    const TileOrigin o = tile_origin(t, g);
    __syncthreads();  // the previous tile's readers are done with xs, dys and coef
    stage_x_tile(xs, x, o, g);
    for (int c = tid; c < g.Kpad; c += kThreads) {
      float a = 0.f, b = 0.f;
      if (c < g.K) {
        b = B[o.n * g.G + c / g.cpg];
        a = fmaf(b, bias ? bias[c] : 0.f, A[o.n * g.K + c]);  // dy = A + B (z + bias)
      }
      coef[c] = a;
      coef[g.Kpad + c] = b;
    }
    __syncthreads();

    if (tid < g.items) {
      if (g.OD - o.d0 > 2) dy_item<CA, kP>(dys, coef, ws, xs, g, o, chunk, hh, ww);
      else dy_item<CA, 2>(dys, coef, ws, xs, g, o, chunk, hh, ww);
    }
    __syncthreads();

    // Phase B: dW[c][ci][kd][kh][kw] += sum over the tile of dy[c] * x, sliding along w.
    if (owner) {
      const int vw = static_cast<int>(min64(g.TW, g.OW - o.w0));
      const int vd = static_cast<int>(min64(kP, g.OD - o.d0)), vh = static_cast<int>(min64(g.TH, g.OH - o.h0));
      const int w_lo = ps * vw / g.PS, w_hi = (ps + 1) * vw / g.PS;
      // Per-tile sums first, then added to the slots: two short f32 sums instead of one of
      // thousands of terms per thread.
      float acc[kCG][3];
#pragma unroll
      for (int c = 0; c < kCG; ++c)
#pragma unroll
        for (int k = 0; k < 3; ++k) acc[c][k] = 0.f;
      if (w_lo < w_hi) {
        for (int dd = 0; dd < vd; ++dd)
          for (int h = 0; h < vh; ++h) {
            const float* xr = xs + ci_b * g.xs_c + (h + kh_b) * g.xs_h + dd + kd_b;
            const float* dr = dys + (dd * g.TH + h) * g.TW * g.ds + cg * kCG;
            float x0 = xr[w_lo * kXD], x1 = xr[(w_lo + 1) * kXD];
            for (int wq = w_lo; wq < w_hi; ++wq) {
              const float x2 = xr[(wq + 2) * kXD];
              const float4 lo = *reinterpret_cast<const float4*>(dr + wq * g.ds);
              const float4 hi = *reinterpret_cast<const float4*>(dr + wq * g.ds + 4);
              const float dv[kCG] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
              for (int c = 0; c < kCG; ++c) {
                acc[c][0] = fmaf(dv[c], x0, acc[c][0]);
                acc[c][1] = fmaf(dv[c], x1, acc[c][1]);
                acc[c][2] = fmaf(dv[c], x2, acc[c][2]);
              }
              x0 = x1;
              x1 = x2;
            }
          }
      }
#pragma unroll
      for (int c = 0; c < kCG; ++c)
#pragma unroll
        for (int k = 0; k < 3; ++k) slots[(c * 3 + k) * kThreads + tid] += acc[c][k];
    }

    // Phase C: dx over the tile's input footprint, gathered from dy in shared memory:
    // dx[ci][fd][fh][fw] = sum_{c,kd,kh,kw} w[c][ci][kd][kh][kw] dy[c][fd-kd][fh-kh][fw-kw].
    if (g.with_dx) {
      const int fplane = g.FH * g.FW;
      for (int i = tid; i < fplane; i += kThreads) {
        const int fh = i / g.FW, fw = i % g.FW;
        for (int ci0 = 0; ci0 < g.C; ci0 += kCinChunk) {
          float acc[kCinChunk][kP + 2];
#pragma unroll
          for (int a = 0; a < kCinChunk; ++a)
#pragma unroll
            for (int fd = 0; fd < kP + 2; ++fd) acc[a][fd] = 0.f;
          for (int kh = 0; kh < 3; ++kh) {
            const int h = fh - kh;
            if (h < 0 || h >= g.TH) continue;
            for (int kw = 0; kw < 3; ++kw) {
              const int wq = fw - kw;
              if (wq < 0 || wq >= g.TW) continue;
              const float* dp = dys + (h * g.TW + wq) * g.ds;
              for (int q = 0; q < g.Kpad; q += 4) {
                float4 dv[kP];
#pragma unroll
                for (int dd = 0; dd < kP; ++dd) dv[dd] = *reinterpret_cast<const float4*>(dp + dd * g.plane * g.ds + q);
#pragma unroll
                for (int a = 0; a < kCinChunk; ++a) {
                  const int ci = ci0 + a;
                  if (ci >= g.C) break;
#pragma unroll
                  for (int kd = 0; kd < 3; ++kd) {
                    const float4 wv =
                        *reinterpret_cast<const float4*>(ws + (((ci * 3 + kh) * 3 + kw) * 3 + kd) * g.Kpad + q);
#pragma unroll
                    for (int dd = 0; dd < kP; ++dd) {
                      float s = acc[a][dd + kd];
                      s = fmaf(wv.x, dv[dd].x, s);
                      s = fmaf(wv.y, dv[dd].y, s);
                      s = fmaf(wv.z, dv[dd].z, s);
                      s = fmaf(wv.w, dv[dd].w, s);
                      acc[a][dd + kd] = s;
                    }
                  }
                }
              }
            }
          }
          for (int a = 0; a < kCinChunk && ci0 + a < g.C; ++a) {
            float* dst = dx_partial + ((t * g.C + ci0 + a) * (kP + 2) * g.FH + fh) * g.FW + fw;
#pragma unroll
            for (int fd = 0; fd < kP + 2; ++fd) dst[static_cast<int64_t>(fd) * fplane] = acc[a][fd];
          }
        }
      }
    }
  }

  // The block's dW: the PS position subsets of each owner, added in order.
  __syncthreads();
  const int e_count = g.owners * kCG * 3;
  for (int e = tid; e < e_count; e += kThreads) {
    const int oo = e / (kCG * 3), ck = e % (kCG * 3);
    float s = 0.f;
    for (int k = 0; k < g.PS; ++k) s += slots[ck * kThreads + k * g.owners + oo];
    dw_partial[static_cast<int64_t>(blockIdx.x) * e_count + e] = s;
  }
}

// dw (K, C, 3, 3, 3) = sum over blocks, in block order, of (owners, kCG, 3) partials.
__global__ void dw_reduce_kernel(float* __restrict__ dw, const float* __restrict__ partial, int64_t blocks, TileGeom g) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= g.K * g.C * 27) return;
  const int kw = i % 3, kh = (i / 3) % 3, kd = (i / 9) % 3, ci = (i / 27) % g.C, c = i / (27 * g.C);
  const int r = (ci * 3 + kd) * 3 + kh, o = (c / kCG) * g.R + r;
  const int e = (o * kCG + c % kCG) * 3 + kw, e_count = g.owners * kCG * 3;
  double s = 0;  // a long sum of f32 partials: accumulate in f64
  for (int64_t b = 0; b < blocks; ++b) s += partial[b * e_count + e];
  dw[i] = static_cast<float>(s);
}

// dx (N, C, D, H, W): each element sums the footprints of the tiles that cover it, in order.
__global__ void dx_reduce_kernel(float* __restrict__ dx, const float* __restrict__ partial, TileGeom g) {
  const int64_t total = g.N * g.C * g.D * g.H * g.W;
  const int fplane = g.FH * g.FW;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t xw = i % g.W, xh = (i / g.W) % g.H, xd = (i / (g.W * g.H)) % g.D;
    const int64_t ci = (i / (g.W * g.H * g.D)) % g.C, n = i / (g.W * g.H * g.D * g.C);
    // Tile dt covers depths [dt kP, dt kP + kP + 2), tile ht rows [ht TH, ht TH + TH + 2): at
    // most three tiles per dim (two unless a tile is one wide).
    const int64_t dt1 = min64(g.NDT - 1, xd / kP), ht1 = min64(g.NHT - 1, xh / g.TH), wt1 = min64(g.NWT - 1, xw / g.TW);
    float s = 0.f;
    for (int64_t dt = max64(0, dt1 - 2); dt <= dt1; ++dt) {
      const int64_t fd = xd - dt * kP;
      if (fd >= kP + 2) continue;
      for (int64_t ht = max64(0, ht1 - 2); ht <= ht1; ++ht) {
        const int64_t fh = xh - ht * g.TH;
        if (fh >= g.FH) continue;
        for (int64_t wt = max64(0, wt1 - 2); wt <= wt1; ++wt) {
          const int64_t fw = xw - wt * g.TW;
          if (fw >= g.FW) continue;
          const int64_t t = ((n * g.NDT + dt) * g.NHT + ht) * g.NWT + wt;
          s += partial[((t * g.C + ci) * (kP + 2) + fd) * fplane + fh * g.FW + fw];
        }
      }
    }
    dx[i] = s;
  }
}

template <int CA>
void launch_grad_conv(const Tensor& dw, const Tensor& dx, const Tensor& x, const Tensor& w, const Tensor& b,
                      const Tensor& A, const Tensor& B, TileGeom g, int dev, cudaStream_t st) {
  g.with_dx = dx.defined();
  const int smem = g.grad_smem_floats * static_cast<int>(sizeof(float));
  const int64_t blocks = std::min(g.tiles, resident_blocks(grad_conv_kernel<CA>, kThreads, smem, dev));
  const TensorOptions f32_opts{.dtype = DType::f32, .device = x.device()};
  Tensor dw_partial = Tensor::empty({blocks * g.owners * kCG * 3}, f32_opts);
  Tensor dx_partial;
  if (g.with_dx) dx_partial = Tensor::empty({g.tiles * g.C * (kP + 2) * g.FH * g.FW}, f32_opts);
  grad_conv_kernel<CA><<<static_cast<unsigned>(blocks), kThreads, smem, st>>>(
      dw_partial.data<float>(), g.with_dx ? dx_partial.data<float>() : nullptr, x.data<float>(), w.data<float>(),
      ptr_or_null(b), A.data<float>(), B.data<float>(), g);
  TG_LAUNCH_CHECK();
  if (dw.defined()) {
    dw_reduce_kernel<<<item_blocks(int64_t{g.K} * g.C * 27, kThreads), kThreads, 0, st>>>(
        dw.data<float>(), dw_partial.data<float>(), blocks, g);
    TG_LAUNCH_CHECK();
  }
  if (g.with_dx) {
    dx_reduce_kernel<<<grid_for(x.numel(), kThreads), kThreads, 0, st>>>(dx.data<float>(), dx_partial.data<float>(), g);
    TG_LAUNCH_CHECK();
  }
}


}  // namespace

void conv3d_gn_mean_grad_conv(const Tensor& dw, const Tensor& dx, const Tensor& x, const Tensor& w,
                              const Tensor& b, const Tensor& A, const Tensor& B, const Conv3dGnMeanProblem& p,
                              Conv3dGnMeanKernels kernels) {
  if (!dw.defined() && !dx.defined()) return;
  const int dev = x.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  if (p.conv.N == 0) {  // nothing to sum: the gradients are zero
    if (dw.defined()) TG_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), st));
    if (dx.defined()) TG_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), st));
    return;
  }
  // Tensor cores compute dw only; with dx wanted the FFMA kernel does both in one pass
  // (unless tensor cores are forced: then dx comes from the FFMA or materialized path below).
  Tensor dw_rest = dw;
  const bool mma = dw.defined() && use_tensor_cores(p, x.dtype(), kernels) &&
                   (!dx.defined() || kernels == Conv3dGnMeanKernels::tensor_core);
  if (mma) {
    conv3d_gn_mean_mma_grad_weight(dw, x, w, b, A, B, p, p.precision == Precision::TF32);
    if (!dx.defined()) return;
    dw_rest = Tensor();
  }
  if (kernels == Conv3dGnMeanKernels::tensor_core ? conv3d_gn_mean_applies(p, x.dtype())
                                                  : use_ffma(p, x.dtype(), kernels)) {
    const TileGeom g = make_tile_geom(p, kThreads);
    if (g.CA == 12) launch_grad_conv<12>(dw_rest, dx, x, w, b, A, B, g, dev, st);
    else launch_grad_conv<8>(dw_rest, dx, x, w, b, A, B, g, dev, st);
    return;
  }
  Tensor dy = conv_output(x, w, b, p);  // y, turned into dL/dy in place
  dispatch_floating("conv3d_gn_mean_grad_conv", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    affine_dy_kernel<T><<<grid_for(dy.numel(), kThreads), kThreads, 0, st>>>(
        dy.data<T>(), A.data<T>(), B.data<T>(), dy.numel(), p.conv.K, p.groups, p.channels_per_group(), p.volume());
    TG_LAUNCH_CHECK();
  });
  if (dw_rest.defined()) conv_grad_weight(dw_rest, dy, x, p.conv, p.precision);
  if (dx.defined()) conv_grad_input(dx, dy, w, p.conv, p.precision);
}

}  // namespace tg::cuda
