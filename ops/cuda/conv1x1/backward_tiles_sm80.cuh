// The per-tile GEMMs of the 1x1 backward kernel (conv1x1/backward_sm80.cu): the fused variant's
// dx tile = w^T dy from the resident weight, and the dw block's product of a dy tile and an x
// tile, each in a general version (guards for ragged channel counts) and a full-tile version.
// Design: docs/kernels/conv1x1.md.
#pragma once
#include "tiles_sm80.cuh"

namespace tg::cuda::conv1x1_detail {

// dx tile (fused backward) = M dy_tile, M(c, k) = w[k][c] resident. NCHW: rows = C (2 warps x 2
// m-tiles), columns = pixels (4 warps x 4 n-tiles); NHWC: rows = pixels (4 x 2), columns = C
// (2 x 4). This general version serves C < 64 (kGuard skips fragments past C) and NHWC K side
// not a multiple of 32; it adds to acc.
template <bool kNHWC, bool kGuard, int kMode, int kTiles>
__device__ __forceinline__ void dx_tile_mma(float (&acc)[2][4][4], const Resident<kMode, kTiles>& res,
                                            const SmemTile& DY, int KS1, int Cpad, int wm, int wn, int lane) {
  constexpr bool kSplit = kMode != kTf32;
  constexpr int kMT = 2, kNT = 4;
  const int g = lane >> 2, t = lane & 3;
  const RowsKQuads pb(DY.stride, wn, lane);  // NCHW
  auto kstep = [&](int ks) {
    FragB b[kNT];
    if constexpr (kNHWC) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        if (!kGuard || (wn * kNT + nt) * 8 < Cpad) b[nt] = res.b(wn * kNT + nt, ks, lane);
    } else {
      quad_b_fragments<kSplit>(b, DY.base, pb, 8 * ks * DY.stride);
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      if (kGuard && !kNHWC && (wm * kMT + mt) * 16 >= Cpad) continue;  // rows past C
      FragA a;
      if constexpr (kNHWC) a = tile_a_rows_m<kSplit>(DY, (wm * kMT + mt) * 16, ks * 8, g, t);
      else a = res.a(wm * kMT + mt, ks, lane);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        if (!kGuard || !kNHWC || (wn * kNT + nt) * 8 < Cpad) mma<kSplit>(acc[mt][nt], a, b[nt]);
    }
  };
  for (int ks = 0; ks < KS1; ks += 2) {  // KS1 is even (Kpad is a multiple of 16)
    kstep(ks);
    kstep(ks + 1);
  }
}

// The same for C = 64 (NHWC: and a K side that is a multiple of 32), the hot path: writes acc.
// NHWC reads its A fragments (pixels x K) with ldmatrix; NCHW its B fragments (K x pixels)
// through per-lane offsets.
template <bool kNHWC, int kMode, int kTiles>
__device__ __forceinline__ void dx_tile_mma_full(float (&acc)[2][4][4], const Resident<kMode, kTiles>& res,
                                                 const float* dy, int KS1, int wm, int wn, int lane) {
  constexpr bool kSplit = kMode != kTf32;
  constexpr int kMT = 2, kNT = 4, S = kBwdDyStride;
  if constexpr (kNHWC) {
    uint32_t a_off[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) a_off[u] = shared_address(dy) + ldmatrix_offset(S, wm * kMT * 16, u, true, lane);
    auto kstep = [&](int ks, int u, int jj, auto first) {
      FragB b[kNT];
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) res.b_pair(b[2 * np], b[2 * np + 1], wn * kNT / 2 + np, ks, lane);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        uint32_t r[4];
        ldmatrix_x4(r, a_off[u] + mt * 16 * S * 4 + jj * 128);
        const FragA a = make_a<kSplit>(r);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mma<kSplit, decltype(first)::value>(acc[mt][nt], a, b[nt]);
      }
    };
    kstep(0, 0, 0, First{});
    kstep(1, 1, 0, Later{});
    kstep(2, 2, 0, Later{});
    kstep(3, 3, 0, Later{});
    auto group = [&](int jj) {
      kstep(4 * jj, 0, jj, Later{});
      kstep(4 * jj + 1, 1, jj, Later{});
      kstep(4 * jj + 2, 2, jj, Later{});
      kstep(4 * jj + 3, 3, jj, Later{});
    };
    // 128 output channels (workload B): every offset a constant. (Rolled, each group's address
    // was an IMAD on the loop counter, waited for: ~2% of the NHWC backward's stall samples.)
    if (KS1 == 16) {
#pragma unroll
      for (int jj = 1; jj < 4; ++jj) group(jj);
    } else {
      for (int jj = 1; jj < KS1 / 4; ++jj) group(jj);
    }
  } else {
    const RowsKQuads pb(S, wn, lane);
    auto kstep = [&](int ks, auto first) {
      FragB b[kNT];
      quad_b_fragments<kSplit>(b, dy, pb, 8 * ks * S);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const FragA a = res.a(wm * kMT + mt, ks, lane);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mma<kSplit, decltype(first)::value>(acc[mt][nt], a, b[nt]);
      }
    };
    kstep(0, First{});
    if (KS1 == 16) {  // 128 output channels (workload B): every offset a constant
#pragma unroll
      for (int ks = 1; ks < 16; ++ks) kstep(ks, Later{});
    } else {
      kstep(1, Later{});
      for (int ks = 2; ks < KS1; ks += 2) {  // KS1 is even
        kstep(ks, Later{});
        kstep(ks + 1, Later{});
      }
    }
  }
}

// dw tile += dy_tile (K side x 128 pixels) x_tile^T: rows = K side (4 warps x 2 m-tiles),
// columns = C side (2 warps x 4 n-tiles). kGuard skips fragments past K or C (blocks smaller
// than 128 x 64).
template <bool kNHWC, bool kSplit, bool kGuard>
__device__ __forceinline__ void dw_tile_mma(float (&acc)[2][4][4], const SmemTile& DY, const SmemTile& X, int Kpad,
                                            int Cpad, int wm, int wn, int lane) {
  constexpr int kMT = 2, kNT = 4;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll 4
  for (int ks = 0; ks < kTilePixels / 8; ++ks) {
    FragB b[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      if (kGuard && (wn * kNT + nt) * 8 >= Cpad) continue;
      if constexpr (kNHWC) b[nt] = tile_b_rows_k<kSplit>(X, ks * 8, (wn * kNT + nt) * 8, g, t);
      else b[nt] = tile_b_rows_n<kSplit>(X, ks * 8, (wn * kNT + nt) * 8, g, t);
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      if (kGuard && (wm * kMT + mt) * 16 >= Kpad) continue;
      FragA a;
      if constexpr (kNHWC) a = tile_a_rows_k<kSplit>(DY, (wm * kMT + mt) * 16, ks * 8, g, t);
      else a = tile_a_rows_m<kSplit>(DY, (wm * kMT + mt) * 16, ks * 8, g, t);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        if (!kGuard || (wn * kNT + nt) * 8 < Cpad) mma<kSplit>(acc[mt][nt], a, b[nt]);
    }
  }
}

// The same product for a full 128 x 64 block (the hot path); writes acc. NCHW: both operands'
// rows are their M / N index and their 16-byte chunks run along the pixels, so ldmatrix.x4
// loads an A fragment or two B fragments at once. NHWC: the tiles' rows are pixels (the
// reduction index); both operands come as 16-byte loads in RowsKQuads order.
template <bool kNHWC, bool kSplit>
__device__ __forceinline__ void dw_tile_mma_full(float (&acc)[2][4][4], const float* dy, const float* x, int wm,
                                                 int wn, int lane) {
  constexpr int kMT = 2, kNT = 4;
  constexpr int SA = kBwdDyStride, SB = kNHWC ? kBwdXStrideNhwc : kTilePixels;
  if constexpr (!kNHWC) {
    uint32_t a_off[4], b_off[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      a_off[u] = shared_address(dy) + ldmatrix_offset(SA, 32 * wm, u, true, lane);
      b_off[u] = shared_address(x) + ldmatrix_offset(SB, 32 * wn, u, false, lane);
    }
    auto kstep = [&](int u, int jj, auto first) {
      FragB b[kNT];
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, b_off[u] + np * 16 * SB * 4 + jj * 128);
        b[2 * np] = make_b<kSplit>(as_float(r[0]), as_float(r[1]));
        b[2 * np + 1] = make_b<kSplit>(as_float(r[2]), as_float(r[3]));
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        uint32_t r[4];
        ldmatrix_x4(r, a_off[u] + mt * 16 * SA * 4 + jj * 128);
        const FragA a = make_a<kSplit>(r);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mma<kSplit, decltype(first)::value>(acc[mt][nt], a, b[nt]);
      }
    };
    kstep(0, 0, First{});
    kstep(1, 0, Later{});
    kstep(2, 0, Later{});
    kstep(3, 0, Later{});
    constexpr int kUnroll = kSplit ? 1 : 3;  // FP32: rolled, or it spills running dw sums
#pragma unroll kUnroll
    for (int jj = 1; jj < kTilePixels / 32; ++jj) {
      kstep(0, jj, Later{});
      kstep(1, jj, Later{});
      kstep(2, jj, Later{});
      kstep(3, jj, Later{});
    }
  } else {
    // A(m, k) = dy[k][m], B(k, n) = x[k][n], both in RowsKQuads order (16-byte loads): the
    // warp's 32 dw rows and 32 dw columns are permuted (virtual 8 v + g = channel 4 g + v; an
    // A m-tile mt holds v = 2 mt (rows g) and 2 mt + 1 (rows g + 8)); the partial is written
    // back in channel order (the partial's store at the end of backward_kernel).
    const RowsKQuads pa(SA, wm, lane), pb(SB, wn, lane);
    auto kstep = [&](int ks, auto first) {
      FragB b[kNT];
      quad_b_fragments<kSplit>(b, x, pb, 8 * ks * SB);
      const float4 a0 = *reinterpret_cast<const float4*>(dy + pa.off[0] + 8 * ks * SA);
      const float4 a1 = *reinterpret_cast<const float4*>(dy + pa.off[1] + 8 * ks * SA);
      const FragA a[kMT] = {make_a<kSplit>(a0.x, a0.y, a1.x, a1.y), make_a<kSplit>(a0.z, a0.w, a1.z, a1.w)};
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mma<kSplit, decltype(first)::value>(acc[mt][nt], a[mt], b[nt]);
    };
    kstep(0, First{});
    // Fully unrolled (partial unrolling keeps more running dw sums in local memory).
#pragma unroll
    for (int ks = 1; ks < kTilePixels / 8; ++ks) kstep(ks, Later{});
  }
}

}  // namespace tg::cuda::conv1x1_detail
