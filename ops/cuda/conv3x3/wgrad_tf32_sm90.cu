// Grad-weight of 3x3 stride-1 NCHW convolutions on Hopper (sm_90a), TF32, wgmma with both
// operands in shared memory:
//   dw[k][c][r][s] = sum over n, p, q of dy[n][k][p][q] * x[n][c][p+r-pad_h][q+s-pad_w].
// Design, tiling and precision: docs/kernels/conv3x3.md ("TF32 grad-weight: wgmma dw").
//
// GEMM: M = 64 output channels (A = a dy row), N = 192 = (column tap s, input channel c) (B = an
// x row in 3 column-shifted copies, rows n = 64 s + c), reduction: pixels; warpgroup r: tap row r.
// Smem images K-major, no swizzle (arch/wgmma.cuh), SBO = 128 B, LBO padded by 16 B so LBO / 4 =
// 4 mod 32 words (conflict-free fills). Rings: 6 x rows, 4 dy rows.
// Precision: x truncated by the tensor core; dy rounded to nearest in registers on its way to smem.
//
// Ordering, per output row t of a segment:
//   cp.async.wait_group 1 -> fence.proxy.async (x copies and this thread's dy stores visible to the
//   async proxy) -> __syncthreads -> wgmma.fence -> 4 wgmma -> commit -> x image t + 4 into slot
//   (t + 4) % 6, dy row t + 2 into slot (t + 2) % 4, loads of dy row t + 3 -> wgmma.wait_group 1.
//   Both refilled slots were last read at row t - 2, retired by all before row t's barrier.
// - Segment end: wait_group 0; the next segment refills slots 0-3 only after a __syncthreads.
// - Accumulators run over all of a block's segments (zeroed once), are re-bound (fence_operand)
//   after the last wait_group 0, then stored as this slice's partial; sum_partials_kernel adds
//   the slices (at most kMaxRowsPerSplit rows each) in order in f64.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/wgmma.cuh"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv3x3/staging.cuh"
#include "ops/cuda/conv3x3/wgrad_tf32_sm90.h"
#include "ops/cuda/sum_partials.cuh"

namespace tg::cuda {
namespace {

// ---- kernels (primitives: ops/cuda/arch/ and conv3x3/staging.cuh) ----

struct DwTile {
  static constexpr int kWarpgroups = 3, kThreads = 128 * kWarpgroups;  // warpgroup r: tap row r
  static constexpr int kM = 64;         // output channels per tile: the wgmma M
  static constexpr int kC = 64;         // input channels per tile
  static constexpr int kShifts = 3;     // column taps
  static constexpr int kN = kShifts * kC;  // the wgmma N: rows n = 64 s + c of an x image
  static constexpr int kAcc = kN / 2;      // f32 accumulators per thread
  static constexpr int kCols = 32;         // output columns per strip: pixels of one row image
  static constexpr int kUnits = kCols / 4;  // 16-byte pixel units along the reduction
  static constexpr int kSteps = kCols / 8;  // k8 wgmma per row
  static constexpr uint32_t kSbo = 128;                       // next 8 rows (n or k)
  static constexpr uint32_t kXLbo = kN * 16 + 16;             // next pixel unit of an x image (3088 B)
  static constexpr uint32_t kDyLbo = kM * 16 + 16;            // next pixel unit of a dy image (1040 B)
  static constexpr int kXSlotFloats = kUnits * kXLbo / 4;     // 6176
  static constexpr int kDySlotFloats = kUnits * kDyLbo / 4;   // 2080
  static constexpr int kXSlots = 6, kDySlots = 4;
  static constexpr int kDyBase = kXSlots * kXSlotFloats;      // dy ring after the x ring
  static constexpr size_t kSmemBytes = sizeof(float) * (kXSlots * kXSlotFloats + kDySlots * kDySlotFloats);
  static constexpr int kXRowsPerWarp = kN / (kThreads / 32);  // 16: one shift per 4 warps
  static_assert(kXRowsPerWarp * (kThreads / 32) == kN && kC % kXRowsPerWarp == 0,
                "x rows split evenly, one shift per warp");
  static_assert(kCols == 32, "one lane per pixel of a row image");
  static_assert((kXLbo / 4) % 32 == 4 && (kDyLbo / 4) % 32 == 4, "consecutive pixel units 4 banks apart");
  static_assert((kXSlotFloats * 4) % 128 == 0 && (kDySlotFloats * 4) % 128 == 0, "images on 128-byte boundaries");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
};
using T = DwTile;

struct DwParams {
  int64_t N, C, H, W;  // x
  int64_t K, Ho, Wo;   // dy
  int64_t pad_h, pad_w;
  int64_t k_tiles, c_tiles, strips;  // strips: ceil(Wo / kCols)
  int64_t rows;                      // N x strips x Ho: output rows of one tile's reduction
  int64_t rows_per_split, splits;
  int x_vec[3];  // floats per copy of x rows for column shift s (4, 2 or 1)
  int dy_vec;    // floats per copy of dy rows
};

// One run of consecutive output rows of one column strip of one image.
struct Segment {
  int64_t n, p0, q0;  // image, first output row, first output column
  int64_t len;        // output rows
};

// Issues the copies of x image v of the segment (x row p0 + v - pad_h, the 3 shifts of the
// tile's 64 channels) into `slot`, kVec floats per copy (p.x_vec[s]: the widest that the shift's
// global rows allow). Warp w copies rows n = 16 w .. 16 w + 15 (shift s = w / 4); a copy
// instruction covers kVec rows of 32 pixels, lane (row rho, pixel j = kVec (lane % (32 / kVec))).
template <int kVec>
__device__ __forceinline__ void load_x_rows(float* slot, const float* __restrict__ x, const DwParams& p,
                                            const Segment& seg, int64_t v, int64_t c0, int warp, int lane) {
  constexpr int kLanesPerRow = 32 / kVec;
  const int rho = lane / kLanesPerRow, j = kVec * (lane % kLanesPerRow);
  const int s = warp / 4, c_first = T::kXRowsPerWarp * (warp % 4) + rho;  // channel of copy 0
  const int64_t ih = seg.p0 + v - p.pad_h, iw = seg.q0 + j + s - p.pad_w;
  // With kVec > 1, iw and W are multiples of kVec: a vector lies wholly inside or outside the row.
  const bool pixel_ok = ih >= 0 && ih < p.H && iw >= 0 && iw < p.W;
  const int64_t plane = p.H * p.W;
  // (c0 + c_first, ih, iw); only read through where the copy is valid.
  const float* src = x + (pixel_ok ? ((seg.n * p.C + c0 + c_first) * p.H + ih) * p.W + iw : 0);
  // Copy i is channel c_first + kVec i (32-bit compares against constants in the unrolled loop).
  const int channels_left = static_cast<int>(min_i64(p.C - c0 - c_first, T::kXRowsPerWarp));
  float* dst = slot + (j / 4) * (T::kXLbo / 4) + 4 * (T::kXRowsPerWarp * warp + rho) + j % 4;
#pragma unroll
  for (int i = 0; i < T::kXRowsPerWarp / kVec; ++i) {
    const bool ok = pixel_ok && kVec * i < channels_left;
    cp_async<4 * kVec>(dst + 4 * kVec * i, ok ? src : x, ok);
    src += kVec * plane;  // (past the tensor once the channels run out: not read then)
  }
}
__device__ __forceinline__ void load_x_image(float* slot, const float* __restrict__ x, const DwParams& p,
                                             const Segment& seg, int64_t v, int64_t c0) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int vec = p.x_vec[warp / 4];  // uniform over the warp: no divergence
  if (vec == 4) load_x_rows<4>(slot, x, p, seg, v, c0, warp, lane);
  else if (vec == 2) load_x_rows<2>(slot, x, p, seg, v, c0, warp, lane);
  else load_x_rows<1>(slot, x, p, seg, v, c0, warp, lane);
}

// dy rows pass through registers, a row ahead of their store, and are rounded to TF32 on the way
// into shared memory (cheaper than an in-place rounding pass over cp.async-landed data).
// Copy instruction m (= warp +
// 12 i) covers rows k = kVec m + rho: kVec floats per lane (2 where Wo and the tensor allow 8-byte
// loads, else 1), 32 pixels per row. DyRegs holds one thread's share of a row (zero outside the
// tensor).
struct DyRegs {
  static constexpr int kMax = 6;  // 64 rows x 32 pixels / 384 threads, rounded up to whole loads
  float v[kMax];
};
template <int kVec>
struct DyLanes {
  static constexpr int kLanesPerRow = 32 / kVec, kWarps = T::kThreads / 32, kInstructions = T::kM / kVec;
  static constexpr int kRounds = (kInstructions + kWarps - 1) / kWarps;
  static_assert(kRounds * kVec <= DyRegs::kMax, "a thread's share of a dy row fits DyRegs");
  int rho, j, k_first;
  __device__ DyLanes(int warp, int lane)
      : rho(lane / kLanesPerRow), j(kVec * (lane % kLanesPerRow)), k_first(kVec * warp + lane / kLanesPerRow) {}
  // Round i exists for this warp (the last round covers only some warps).
  __device__ bool has(int i, int warp) const {
    return kInstructions % kWarps == 0 || i < kRounds - 1 || warp + kWarps * i < kInstructions;
  }
};

template <int kVec>
__device__ __forceinline__ void load_dy_rows(DyRegs& r, const float* __restrict__ dy, const DwParams& p,
                                             const Segment& seg, int64_t t, int64_t k0, int warp, int lane) {
  using L = DyLanes<kVec>;
  const L l(warp, lane);
  const int64_t oh = seg.p0 + t, ow = seg.q0 + l.j;
  const bool pixel_ok = ow < p.Wo;  // (with kVec = 2, Wo is even)
  const int64_t plane = p.Ho * p.Wo;
  const float* src = dy + (pixel_ok ? ((seg.n * p.K + k0 + l.k_first) * p.Ho + oh) * p.Wo + ow : 0);
  const int rows_left = static_cast<int>(min_i64(p.K - k0, T::kM)) - l.k_first;
#pragma unroll
  for (int i = 0; i < L::kRounds; ++i) {
    const bool ok = l.has(i, warp) && pixel_ok && kVec * L::kWarps * i < rows_left;
    if constexpr (kVec == 2) {
      const float2 q = ok ? __ldg(reinterpret_cast<const float2*>(src)) : make_float2(0.f, 0.f);
      r.v[2 * i] = q.x;
      r.v[2 * i + 1] = q.y;
    } else {
      r.v[i] = ok ? __ldg(src) : 0.f;
    }
    src += kVec * L::kWarps * plane;  // (past the tensor once the rows run out: not read then)
  }
}
template <int kVec>
__device__ __forceinline__ void store_dy_rows(float* slot, const DyRegs& r, int warp, int lane) {
  using L = DyLanes<kVec>;
  const L l(warp, lane);
  float* dst = slot + (l.j / 4) * (T::kDyLbo / 4) + 4 * l.k_first + l.j % 4;
#pragma unroll
  for (int i = 0; i < L::kRounds; ++i) {
    if (!l.has(i, warp)) break;
    float* d = dst + 4 * kVec * L::kWarps * i;
    if constexpr (kVec == 2) {
      *reinterpret_cast<float2*>(d) =
          make_float2(__uint_as_float(tf32_round(r.v[2 * i])), __uint_as_float(tf32_round(r.v[2 * i + 1])));
    } else {
      *d = __uint_as_float(tf32_round(r.v[i]));
    }
  }
}
// p.dy_vec: 2 (8-byte loads) or 1, uniform over the block.
__device__ __forceinline__ void load_dy_row(DyRegs& r, const float* __restrict__ dy, const DwParams& p,
                                            const Segment& seg, int64_t t, int64_t k0) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (p.dy_vec == 2) load_dy_rows<2>(r, dy, p, seg, t, k0, warp, lane);
  else load_dy_rows<1>(r, dy, p, seg, t, k0, warp, lane);
}
__device__ __forceinline__ void store_dy_row(float* slot, const DyRegs& r, const DwParams& p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (p.dy_vec == 2) store_dy_rows<2>(slot, r, warp, lane);
  else store_dy_rows<1>(slot, r, warp, lane);
}

// Issues the 4 k8 steps of one output row for this warpgroup as one commit group.
// x_addr / dy_addr: shared addresses of its x image and of the row's dy image.
__device__ __forceinline__ void issue_row(float (&acc)[T::kAcc], uint32_t x_addr, uint32_t dy_addr) {
  const uint64_t desc_a = wgmma::kmajor_desc(dy_addr, T::kDyLbo, T::kSbo);
  const uint64_t desc_b = wgmma::kmajor_desc(x_addr, T::kXLbo, T::kSbo);
  wgmma::fence();  // the accumulators were written by this thread before (zeroing)
#pragma unroll
  for (int u = 0; u < T::kSteps; ++u) {
    wgmma::mma_ss_tf32<T::kN>(acc, wgmma::desc_advance(desc_a, 2 * u * T::kDyLbo),
                              wgmma::desc_advance(desc_b, 2 * u * T::kXLbo), true);
  }
  wgmma::commit();
}

// Accumulates one segment: a prologue that loads x images 0-3 (two cp.async groups) and stores dy
// rows 0-1, then one output row per iteration (the ordering in the header).
__device__ __forceinline__ void run_segment(float (&acc)[T::kAcc], float* smem, const float* __restrict__ dy,
                                            const float* __restrict__ x, const DwParams& p, const Segment& seg,
                                            int64_t k0, int64_t c0, int wg) {
  const uint32_t smem_addr = shared_address(smem);
  float* dy_ring = smem + T::kDyBase;
  __syncthreads();  // every warpgroup drained the previous segment (wait_group 0): every slot is free
  for (int v = 0; v < 3; ++v) load_x_image(smem + v * T::kXSlotFloats, x, p, seg, v, c0);
  cp_async_commit();
  if (seg.len > 1) load_x_image(smem + 3 * T::kXSlotFloats, x, p, seg, 3, c0);
  cp_async_commit();
  DyRegs dy_next;  // dy row t + 2 between its load (row t - 1) and its store (row t)
  for (int r = 0; r < 3 && r < seg.len; ++r) {
    load_dy_row(dy_next, dy, p, seg, r, k0);
    if (r < 2) store_dy_row(dy_ring + r * T::kDySlotFloats, dy_next, p);
  }
  int x_read = wg, x_load = 4, dy_read = 0, dy_store = 2;  // slots: (t + wg) % 6, (t + 4) % 6, t % 4, (t + 2) % 4
#pragma unroll 1
  for (int64_t t = 0; t < seg.len; ++t) {
    cp_async_wait<1>();          // this thread's x copies of row t have landed (row t + 1's may be open)
    wgmma::fence_proxy_async();  // ... and, with its dy stores, are visible to the wgmma's operand reads
    __syncthreads();             // everyone's are; row t - 2 retired by every warpgroup: its slots are free
    issue_row(acc, smem_addr + 4u * x_read * T::kXSlotFloats,
              smem_addr + 4u * (T::kDyBase + dy_read * T::kDySlotFloats));
    if (t + 2 < seg.len) {
      load_x_image(smem + x_load * T::kXSlotFloats, x, p, seg, t + 4, c0);
      store_dy_row(dy_ring + dy_store * T::kDySlotFloats, dy_next, p);  // row t + 2, loaded at row t - 1
      if (t + 3 < seg.len) load_dy_row(dy_next, dy, p, seg, t + 3, k0);
    }
    cp_async_commit();
    x_read = x_read == T::kXSlots - 1 ? 0 : x_read + 1;
    x_load = x_load == T::kXSlots - 1 ? 0 : x_load + 1;
    dy_read = dy_read == T::kDySlots - 1 ? 0 : dy_read + 1;
    dy_store = dy_store == T::kDySlots - 1 ? 0 : dy_store + 1;
    wgmma::wait<1>();  // row t - 1 retired: its slots may be refilled after the next barrier
  }
  wgmma::wait<0>();
}

// Writes the block's partial tile: this thread holds output channel k0 + 16 wi + g + 8 h, input
// channel c0 + 2 t + 8 (j % 8) + e, tap (wg, j / 8) in acc[4 j + 2 h + e]. The element offsets
// from the thread's first (k, c) are constants, so the 96 stores need one pointer per h.
// Addresses are formed for channels past K or C too, and never stored to.
__device__ __forceinline__ void store_partial(float* __restrict__ dst, const DwParams& p, int64_t k0, int64_t c0,
                                              const float (&acc)[T::kAcc], int wg, int wi, int lane) {
  const int g = lane / 4, t = lane % 4;
  const int c_left = static_cast<int>(min_i64(p.C - c0, T::kC)) - 2 * t;  // this thread's channels: 2 t + i < ...
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t k = k0 + 16 * wi + g + 8 * h;
    const bool k_ok = k < p.K;
    float* first = dst + ((k * p.C + c0 + 2 * t) * 3 + wg) * 3;
#pragma unroll
    for (int j = 0; j < T::kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ci = 8 * (j % 8) + e;  // channel offset from c0 + 2 t
        store_if(first + ci * 9 + j / 8, acc[4 * j + 2 * h + e], k_ok && ci < c_left);
      }
    }
  }
}

// part[split] (K, C, 3, 3) = the block's slice of the reduction over its (k tile, c tile).
// Block b: tile b % tiles (the k tiles of one slice run side by side and share x in L2), slice
// b / tiles.
__global__ void __launch_bounds__(T::kThreads, 1)
    conv3x3_wgmma_dw_kernel(float* __restrict__ part,      // (splits, K, C, 3, 3)
                            const float* __restrict__ dy,  // (N, K, Ho, Wo)
                            const float* __restrict__ x,   // (N, C, H, W)
                            DwParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float* smem = dynamic_smem<128>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wg = warp / 4, wi = warp % 4;  // warpgroup (= tap row), warp within it
  const int64_t tiles = p.k_tiles * p.c_tiles;
  const int64_t tile = blockIdx.x % tiles, split = blockIdx.x / tiles;
  const int64_t k0 = tile % p.k_tiles * T::kM, c0 = tile / p.k_tiles * T::kC;

  float acc[T::kAcc];
#pragma unroll
  for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.f;

  const int64_t end = min_i64(p.rows, (split + 1) * p.rows_per_split);
#pragma unroll 1
  for (int64_t row = split * p.rows_per_split; row < end;) {
    const int64_t column = row / p.Ho, p0 = row % p.Ho;  // column = n * strips + strip
    const Segment seg{column / p.strips, p0, column % p.strips * T::kCols, min_i64(end - row, p.Ho - p0)};
    run_segment(acc, smem, dy, x, p, seg, k0, c0, wg);
    row += seg.len;
  }
#pragma unroll
  for (int i = 0; i < T::kAcc; ++i) wgmma::fence_operand(acc[i]);
  store_partial(part + split * p.K * p.C * 9, p, k0, c0, acc, wg, wi, lane);
  cp_async_wait<0>();  // nothing outstanding at exit (the last groups are empty)
#else
  __trap();  // conv3x3_wgmma_dw_applies is false for builds without sm_90a code
#endif
}

// ---- planning (host) ----

// At most this many output rows per slice: each accumulator chain then has at most
// 4 x kMaxRowsPerSplit accumulating wgmma (~2k, as the mma.sync kernel's 8192-pixel slices);
// and at most this many bytes of partials.
constexpr int64_t kMaxRowsPerSplit = 512;
constexpr int64_t kMaxPartialBytes = int64_t(512) << 20;

// x, dy: the tensors' data (their alignment picks the copy widths).
DwParams plan_dw(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t Ho, int64_t Wo, int64_t pad_h,
                 int64_t pad_w, int64_t sms, const float* x, const float* dy) {
  DwParams p{};
  p.N = N, p.C = C, p.H = H, p.W = W;
  p.K = K, p.Ho = Ho, p.Wo = Wo;
  p.pad_h = pad_h, p.pad_w = pad_w;
  p.k_tiles = ceil_div(K, T::kM);
  p.c_tiles = ceil_div(C, T::kC);
  p.strips = ceil_div(Wo, T::kCols);
  p.rows = N * p.strips * Ho;
  for (int sh = 0; sh < T::kShifts; ++sh) p.x_vec[sh] = row_copy_width(x, W, sh - pad_w);
  p.dy_vec = row_copy_width(dy, Wo) >= 2 ? 2 : 1;  // dy goes through registers: 8-byte loads at most
  // Enough slices for bounded chains, rounded up to whole waves of one block per SM, then
  // limited by the partials' size and by the row count.
  const int64_t tiles = p.k_tiles * p.c_tiles;
  int64_t splits = ceil_div(p.rows, kMaxRowsPerSplit);
  splits = ceil_div(ceil_div(splits * tiles, sms) * sms, tiles);
  splits = std::min(splits, std::max<int64_t>(1, kMaxPartialBytes / (K * C * 9 * int64_t(sizeof(float)))));
  splits = std::max<int64_t>(1, std::min(splits, p.rows));
  p.rows_per_split = ceil_div(p.rows, splits);
  p.splits = ceil_div(p.rows, p.rows_per_split);  // no empty slices
  return p;
}

// ---- host ----

void check_tensors(const char* op, const ConvShape& s, Precision precision, ExpectedTensors ts) {
  check_conv3x3_tensors(op, s, precision, conv3x3_wgmma_dw_applies, kNeedsTf32Wgmma, ts);
}

}  // namespace

bool conv3x3_wgmma_dw_applies(const ConvShape& s, Device d, Precision precision) {
  return d.is_cuda() && precision == Precision::TF32 && conv3x3_applies(s, precision) && device_runs_wgmma(d.index);
}

void conv3x3_wgmma_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                               Precision precision) {
  check_tensors("conv3x3_wgmma_grad_weight", s, precision,
                {{&dw, s.w_shape()}, {&dy, s.y_shape()}, {&x, s.x_shape()}});
  const int dev = dw.device().index;
  set_device(dev);
  const DwParams p =
      plan_dw(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2], sm_count(dev),
              x.data<float>(), dy.data<float>());
  Tensor scratch;
  float* part = partial_slices(scratch, dw, p.splits);
  allow_dynamic_smem(conv3x3_wgmma_dw_kernel, int(T::kSmemBytes));
  const int64_t grid = p.k_tiles * p.c_tiles * p.splits;
  conv3x3_wgmma_dw_kernel<<<static_cast<unsigned>(grid), T::kThreads, T::kSmemBytes, stream(dev)>>>(
      part, dy.data<float>(), x.data<float>(), p);
  TG_LAUNCH_CHECK();
  sum_partials(dw.data<float>(), part, dw.numel(), p.splits, stream(dev));
}

}  // namespace tg::cuda
