// The engine's stride-1 convolution grad-weight on Hopper over shifted rows (TF32, FP32 as
// split TF32, or BF16 products): the TMA matrix product without written-out columns.
//
// dw[k][c][t] = sum over images n and output pixels o of dy[n][k][o] x[n][c][o - pad + t dil].
// Place each image's input inside its zero border (extents E = in + 2 pad per dim) and number
// the positions of that padded grid q = (z E_h + y) E_w + x, image after image (V = E_d E_h E_w
// per image). Output pixel o's window corner is grid position q(o), and its input at tap t is
// at q(o) + shift(t), shift(t) = sum over dims of the tap's index * dil * the dim's grid pitch:
// one constant per tap. So with
//   xp[c][n V + q]  = x inside its border (zeros in the border), and
//   dyp[k][n V + q] = dy[n][k][o] where q = q(o), zero at the grid positions that are no output
//                     pixel (the last dil (k - 1) of each dim),
// dw[k][c][t] = sum_r dyp[k][r] xp[c][r + shift(t)]: a product whose xp rows are read from
// column shift(t) on. Both operands keep the reduction contiguous, as the TMA kernel reads
// them; where dyp is zero, whatever the shifted read finds (the next row's border, the next
// image) adds nothing, and reads past the end arrive as the TMA unit's zeros.
//
// A TMA box must start at a 16-byte-aligned column (4 floats, 8 bf16: an unaligned start is an
// illegal instruction), and shift(t) mostly is not. So xp is kept in J copies, copy j shifted by
// the residue res_j (one of the J distinct values of shift(t) mod 4 or 8 over the taps):
// xs[j][c][r] = xp[c][r + res_j], and tap t reads copy j(t) from column shift(t) - res_j, a
// whole number of 16 bytes. The copies are flat shifts of copy 0, written in the same pass
// (ColumnCopies): a row's last columns hold the next row's first ones, which only meet dyp's
// zeros. The
// copies cost J (V / P) |x| + (V / P) |dy| (J <= 4 for f32, <= 8 for bf16) against the columns'
// kvol |x| (conv_wgrad_sm90_tma.cu); the product runs over N V positions instead of N P, so a
// grid that pads the output by a large fraction (small images) wastes that fraction of the
// products.
//
// The rows of the (t, c) side are t * rows_per_tap + c, the channels padded to whole boxes of
// `group_rows` so that each box lies within one tap (rows past C are outside xp: zeros). With 64
// or fewer output channels the (t, c) side is A (m = (t, c), n = k: 64-wide tiles on few K),
// else B (m = k, n = (t, c)). The result lands in a (t, c)-ordered scratch, which one small pass
// permutes into dw (K, C, kvol), after the engine's fixed-order split reduction where the
// reduction is split (deterministic). Design note: docs/kernels/gemm_tma.md.
#include <algorithm>
#include <vector>

#include "core/cuda_context.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/gemm/columns.cuh"
#include "ops/cuda/gemm/planning.h"
#include "ops/cuda/gemm/tma_mainloop_sm90.cuh"

namespace tg::cuda::engine {

// The TMA kernel's producer: the plain operand (dyp) as one box per k-tile at the tile's rows,
// the (t, c) operand (xs) as `groups` boxes of `group_rows` rows, each from its tap's copy at its
// tap's aligned shift. Rows past C in a group read the next copy's first rows: their products
// land in rows of the result that are never read.
template <bool kBf16Elements>
struct ShiftedRowsBoxes {
  static constexpr bool kBf16 = kBf16Elements;  // bf16 boxes and BF16 products
  static constexpr int kMaxGroups = 8;
  CUtensorMap plain, tapped;
  bool taps_on_a;  // the (t, c) side is A (else B)
  int32_t group_rows, groups, taps, channels;
  FastDivmod div_rows_per_tap, div_kernel_w, div_kernel_h;
  int32_t pitch[3];  // grid positions per tap index step in d, h, w (dilation included)
  int32_t copy_of_residue[ColumnCopies::kMaxCopies];  // shift mod (16 bytes' elements) -> its copy j
  struct Cursor {
    int32_t plain_row;
    int32_t row[kMaxGroups], shift[kMaxGroups];
  };

  __device__ __forceinline__ void prefetch() const {
    tma::prefetch_map(&plain);
    tma::prefetch_map(&tapped);
  }
  __device__ __forceinline__ int32_t shift_of(uint32_t t) const {
    uint32_t q, tw, td, th;
    div_kernel_w.divmod(t, q, tw);
    div_kernel_h.divmod(q, td, th);
    return int32_t(td) * pitch[0] + int32_t(th) * pitch[1] + int32_t(tw) * pitch[2];
  }
  // The boxes' rows and shifts are fixed for the block: decoded once here.
  __device__ __forceinline__ Cursor start(int32_t, int32_t m0, int32_t n0) const {
    Cursor c{};
    c.plain_row = taps_on_a ? n0 : m0;
    const int32_t first = taps_on_a ? m0 : n0;
#pragma unroll
    for (int i = 0; i < kMaxGroups; ++i) {
      if (i < groups) {
        uint32_t t, channel;
        div_rows_per_tap.divmod(uint32_t(first + i * group_rows), t, channel);
        const int32_t shift = shift_of(min(t, uint32_t(taps - 1)));  // rows past the last tap: any finite data
        constexpr int32_t kAlign = kBf16Elements ? 8 : 4;  // elements per 16 bytes
        const int32_t residue = shift & (kAlign - 1);
        c.row[i] = copy_of_residue[residue] * channels + int32_t(channel);
        c.shift[i] = shift - residue;
      }
    }
    return c;
  }
  __device__ __forceinline__ void advance(Cursor&) const {}
  __device__ __forceinline__ void load(unsigned char* a_dst, unsigned char* b_dst, uint64_t* bar, const Cursor& at,
                                       int32_t kt, int32_t) const {
    constexpr int kRowBytes = 128;
    const int32_t col = kt * kTileK<kBf16Elements>;
    tma::load_box(taps_on_a ? b_dst : a_dst, &plain, bar, col, at.plain_row);
    unsigned char* dst = taps_on_a ? a_dst : b_dst;
#pragma unroll
    for (int i = 0; i < kMaxGroups; ++i)
      if (i < groups) tma::load_box(dst + i * group_rows * kRowBytes, &tapped, bar, col + at.shift[i], at.row[i]);
  }
};

namespace {

constexpr int64_t kMinInputChannels = 16;  // fewer: most of each box would be padding rows
// Each copy (xp, dyp) may take at most this many elements; beyond, the columns or cp.async
// kernels serve.
constexpr int64_t kMaxCopyElements = int64_t(1) << 28;
// Where it beats the columns (dev/wgrad_shifted_probe.cu, H200, TF32 time against the columns
// product's): on 32x32 images and larger, 3-D volumes and 5x5 kernels (a grid at most 1.2x the
// output pixels: 0.47-0.85, Conv3d 64 at 32^3 0.540 -> 0.255 ms); with 25+ taps up to 1.45x
// (Conv3d 128 at 16^3: 0.73); at 16x16 (1.27x) up to 256 channels (128: 0.88, 256: 0.86) but not
// 384 (1.16); not on 8x8 images (1.56x: 0.91-1.38) nor smaller. Fewer than 32 output channels are
// the 3x3 / cp.async kernels' (the probe's sweep).
constexpr double kGridWaste = 1.2, kGridWasteManyTaps = 1.45, kGridWasteNarrow = 1.3;
constexpr int64_t kManyTaps = 25, kNarrowChannels = 256, kMinOutputChannels = 32;

struct ShiftedGrid {
  int64_t extent[3] = {1, 1, 1};  // the padded input per dim
  int64_t volume = 1;             // positions per image
  int64_t red = 0;                // N * volume, rounded up to whole 16-byte rows
  int64_t max_shift = 0;
  int32_t pitch[3] = {0, 0, 0};
};

ShiftedGrid shifted_grid(const ConvShape& s, int64_t row_multiple) {
  ShiftedGrid g;
  for (int d = 0; d < 3; ++d) {
    g.extent[d] = s.in[d] + 2 * s.pad[d];
    g.volume *= g.extent[d];
  }
  const int64_t pitch[3] = {g.extent[1] * g.extent[2], g.extent[2], 1};
  for (int d = 0; d < 3; ++d) {
    const int64_t step = s.dilation[d] * pitch[d];
    g.max_shift += (s.kernel[d] - 1) * step;
    g.pitch[d] = int32_t(std::min<int64_t>(step, kIndexLimit));
  }
  g.red = round_up(s.N * g.volume, row_multiple);
  return g;
}

// The distinct values of shift(t) mod `align` over the taps, 0 first: the copies' residues.
std::vector<int32_t> shift_residues(const ConvShape& s, const ShiftedGrid& g, int32_t align) {
  std::vector<bool> seen(size_t(align), false);
  for (int64_t td = 0; td < s.kernel[0]; ++td)
    for (int64_t th = 0; th < s.kernel[1]; ++th)
      for (int64_t tw = 0; tw < s.kernel[2]; ++tw)
        seen[size_t((td * g.pitch[0] + th * g.pitch[1] + tw * g.pitch[2]) % align)] = true;
  std::vector<int32_t> residues = {0};
  for (int32_t r = 1; r < align; ++r)
    if (seen[size_t(r)]) residues.push_back(r);
  return residues;
}

// The padded input xp as the columns of a 1x1 "convolution" whose output is the padded grid.
ConvShape padded_input_shape(const ConvShape& s, const ShiftedGrid& g) {
  ConvShape p = s;
  for (int d = 0; d < 3; ++d) {
    p.out[d] = g.extent[d];
    p.kernel[d] = p.stride[d] = p.dilation[d] = 1;
  }
  return p;
}
// dyp the same way: dy (K channels) at the grid's corner, no offset, zeros past its extents.
ConvShape placed_dy_shape(const ConvShape& s, const ShiftedGrid& g) {
  ConvShape p = padded_input_shape(s, g);
  p.C = s.K;
  for (int d = 0; d < 3; ++d) {
    p.in[d] = s.out[d];
    p.pad[d] = 0;
  }
  return p;
}

// Rows per box of the (t, c) side: the widest of 64, 32, 16 (at most the tile's rows) that pads
// C no further than 16 does.
int group_rows_for(int64_t C, int tile_rows) {
  for (int g : {64, 32, 16})
    if (g <= tile_rows && round_up(C, int64_t(g)) == round_up(C, int64_t(16))) return g;
  return 16;
}

// dw[k][c][t] from the (t, c)-ordered product's partial sums, added in split order (the same
// bits every run): rows (t, c) x columns k, or the transpose.
__global__ void tap_rows_to_weights(float* __restrict__ dw, const float* __restrict__ partials, int32_t splits,
                                    int64_t plane, int32_t K, int32_t C, int32_t taps, int32_t rows_per_tap,
                                    bool taps_on_rows) {
  const int64_t per_k = int64_t(C) * taps, total = int64_t(K) * per_k;
  TG_GRID_STRIDE(i, total) {
    const int64_t k = i / per_k, rem = i % per_k, c = rem / taps, t = rem % taps;
    const int64_t row = t * rows_per_tap + c;
    const int64_t at = taps_on_rows ? row * K + k : k * (int64_t(taps) * rows_per_tap) + row;
    float sum = 0.f;
    for (int32_t sp = 0; sp < splits; ++sp) sum += partials[sp * plane + at];
    dw[i] = sum;
  }
}

// Whether it serves s: within its index and copy limits, and (policy 0) where its rule says it
// pays.
template <class T>
bool shifted_takes(const ConvShape& s, int dev, const EnginePolicy& policy) {
  if (policy.wgrad_shifted < 0 || !device_runs_wgmma(dev) || s.C < kMinInputChannels) return false;
  for (int d = 0; d < 3; ++d)
    if (s.stride[d] != 1) return false;
  const ShiftedGrid g = shifted_grid(s, kRowMultiple<T>);
  const int64_t rows = round_up(s.C, int64_t(16)) * s.kernel_volume();
  const int64_t copies = int64_t(shift_residues(s, g, int32_t(kRowMultiple<T>)).size());
  const bool fit = fits(g.red + g.max_shift + 2 * kBK) && fits(rows * std::max<int64_t>(s.K, 128)) &&
                   copies * s.C <= kMaxCopyElements / g.red && s.K <= kMaxCopyElements / g.red;
  if (!fit) return false;
  if (policy.wgrad_shifted > 0) return true;
  const double waste = double(g.volume) / double(s.out_volume());
  return s.K >= kMinOutputChannels &&
         (waste <= kGridWaste || (s.kernel_volume() >= kManyTaps && waste <= kGridWasteManyTaps) ||
          (s.C <= kNarrowChannels && waste <= kGridWasteNarrow));
}

template <class T>
void wgrad_shifted(const Tensor& dw, const T* dy, const T* x, const ConvShape& s, Precision precision,
                   const EnginePolicy& policy) {
  constexpr bool kBf16 = sizeof(T) == 2;
  const int dev = dw.device().index;
  cudaStream_t st = stream(dev);
  const ShiftedGrid grid = shifted_grid(s, kRowMultiple<T>);
  const std::vector<int32_t> residues = shift_residues(s, grid, int32_t(kRowMultiple<T>));
  const int64_t copies = int64_t(residues.size()), copy_elements = s.C * grid.red;
  const TensorOptions copy_type{.dtype = kBf16 ? DType::bf16 : DType::f32, .device = dw.device()};
  Tensor xs = Tensor::empty({copies * copy_elements}, copy_type), dyp = Tensor::empty({s.K * grid.red}, copy_type);
  T* xs_data = static_cast<T*>(xs.raw_data());
  T* dyp_data = static_cast<T*>(dyp.raw_data());
  ColumnCopies xs_copies;
  xs_copies.count = int32_t(copies);
  for (size_t j = 0; j < residues.size(); ++j) xs_copies.residue[j] = residues[j];
  xs_copies.copy_elements = copy_elements;
  write_columns(xs_data, x, padded_input_shape(s, grid), grid.red, st, xs_copies);
  write_columns(dyp_data, dy, placed_dy_shape(s, grid), grid.red, st);

  const bool taps_on_a = s.K <= 64;
  const bool split = !kBf16 && precision == Precision::FP32;
  const int cols = split && policy.tile == 128 ? 128 : taps_on_a ? 64 : 128;
  const int group_rows = group_rows_for(s.C, taps_on_a ? kTmaBM : cols);
  const int64_t rows_per_tap = round_up(s.C, int64_t(group_rows)), taps = s.kernel_volume();
  const int64_t M = taps_on_a ? taps * rows_per_tap : s.K, N = taps_on_a ? s.K : taps * rows_per_tap;
  const Plan plan = make_tma_plan(M, N, grid.red, cols, dev, policy, precision, kBf16);

  ShiftedRowsBoxes<kBf16> boxes{};
  constexpr int kBoxCols = kTileK<kBf16>;
  const TmaBox plain_box{.rows = taps_on_a ? cols : kTmaBM, .cols = kBoxCols, .swizzle128 = true};
  const TmaBox tapped_box{.rows = group_rows, .cols = kBoxCols, .swizzle128 = true};
  if constexpr (kBf16) {
    boxes.plain = bf16_matrix_map("conv grad-weight (dy rows)", dyp_data, s.K, grid.red, plain_box);
    boxes.tapped = bf16_matrix_map("conv grad-weight (padded input)", xs_data, copies * s.C, grid.red, tapped_box);
  } else {
    boxes.plain = f32_matrix_map("conv grad-weight (dy rows)", dyp_data, s.K, grid.red, plain_box);
    boxes.tapped = f32_matrix_map("conv grad-weight (padded input)", xs_data, copies * s.C, grid.red, tapped_box);
  }
  boxes.taps_on_a = taps_on_a;
  boxes.group_rows = group_rows;
  boxes.groups = (taps_on_a ? kTmaBM : cols) / group_rows;
  boxes.taps = int32_t(taps);
  boxes.channels = int32_t(s.C);
  for (size_t j = 0; j < residues.size(); ++j) boxes.copy_of_residue[residues[j]] = int32_t(j);
  boxes.div_rows_per_tap = FastDivmod(uint32_t(rows_per_tap));
  boxes.div_kernel_w = FastDivmod(uint32_t(s.kernel[2]));
  boxes.div_kernel_h = FastDivmod(uint32_t(s.kernel[1]));
  for (int d = 0; d < 3; ++d) boxes.pitch[d] = grid.pitch[d];

  // The product always leaves partial sums (one plane when unsplit), which one pass adds and
  // permutes into dw.
  Tensor partials = Tensor::empty({int64_t(plan.splits) * M * N}, {.dtype = DType::f32, .device = dw.device()});
  MainloopArgs args{};
  args.M = int32_t(M);
  args.N = int32_t(N);
  args.red = int32_t(grid.red);
  args.tiles_n = plan.tiles_n;
  args.k_tiles_per_split = plan.k_tiles_per_split;
  args.partials = partials.data<float>();  // every tile goes there: args.out stays unset
  launch_tma_wgmma(boxes, plan, args, st);
  tap_rows_to_weights<<<grid_for(s.K * s.C * taps, kThreads), kThreads, 0, st>>>(
      dw.data<float>(), partials.data<float>(), plan.splits, M * N, int32_t(s.K), int32_t(s.C), int32_t(taps),
      int32_t(rows_per_tap), taps_on_a);
  TG_LAUNCH_CHECK();
}

}  // namespace

bool conv_wgrad_shifted_applies(const ConvShape& s, int dev, const EnginePolicy& policy, bool bf16) {
  return bf16 ? shifted_takes<uint16_t>(s, dev, policy) : shifted_takes<float>(s, dev, policy);
}

void conv_wgrad_shifted(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s, Precision precision,
                        const EnginePolicy& policy) {
  if (dy.dtype() == DType::bf16)
    wgrad_shifted<uint16_t>(dw, bf16_bits(dy), bf16_bits(x), s, Precision::TF32, policy);
  else
    wgrad_shifted<float>(dw, dy.data<float>(), x.data<float>(), s, precision, policy);
}

}  // namespace tg::cuda::engine
