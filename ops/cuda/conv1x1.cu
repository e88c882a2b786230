// 1x1 convolutions and batched linear as pointwise GEMMs on mma.sync (m16n8k8 TF32; FP32-accurate
// mode adds one m16n8k16 bf16 op per product for both cross terms). Forward / grad-input
// (pointwise_kernel), fused backward and dw-only backward (backward_kernel), pointwise_matmul_*.
// On Hopper the forward with R <= 64 and 16-byte rows runs in conv1x1_tma.cu instead.
// Design, precision contract and the floor: docs/kernels/conv1x1.md.
//
// - Persistent grids over 128-pixel tiles; activations by 16-byte cp.async (L2 evict-first,
//   zero-fill at edges; 4-byte copies for unaligned rows). Tiles carry an XOR swizzle of 16-byte
//   chunks: every fragment pattern is conflict-free without padding.
// - The weight (<= 128 x 128 per launch) stays resident in fragment order, k-step major; FP32
//   keeps tf32 hi words plus rounded bf16 lo pairs (the fused backward keeps raw f32 w^T).
// - NCHW B fragments use the RowsKQuads column permutation (one LDS.128 serves 4 n-tiles);
//   accumulator columns are permuted the same way.
// - Stores are staged through the tile's consumed stage so each instruction writes whole lines.
//   In the fused backward the dx warps reuse the stage only after the named barrier at which
//   both roles meet after their GEMMs.
// - dw: tensor-core sums flushed into fp32 every tile; block partials summed in f64 in a fixed
//   order by sum_partials_kernel. Deterministic: no atomics.
#include "ops/cuda/conv1x1.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/arch/cp_async.cuh"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/arch/mma_sync.cuh"
#include "ops/cuda/arch/named_barrier.cuh"
#include "ops/cuda/arch/shared_memory.cuh"
#include "ops/cuda/arch/tf32.cuh"
#include "ops/cuda/conv1x1_tma.h"
#include "ops/cuda/policy.h"
#include "ops/cuda/sum_partials.cuh"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;       // 8 warps: the pointwise kernel, and each role of the backward
constexpr int kTilePixels = 128;    // pixels per tile: the long dimension of every GEMM here
constexpr int kMaxStages = 4;
constexpr int kGroupChannels = 128; // reduction channels per pointwise launch when more than 64
constexpr int kDwRows = 128;        // dw block of the backward kernel: K side ...
constexpr int kDwCols = 64;         // ... and C side (the fused kernel needs K <= 128, C <= 64)
constexpr int kBwdDyStride = 128;   // backward tiles' row strides (floats): dy (NCHW: pixels, NHWC: K side)
constexpr int kBwdXStrideNhwc = 64; // x in NHWC (C side); NCHW rows are kTilePixels
constexpr int64_t kPartialBudget = int64_t(1) << 26;  // floats of dw partials (256 MB)
// Staged forward stores: each warp's scratch holds one 16 x 32 block of results, rows padded to
// 40 floats (40 = 8 mod 32 makes the fragment-order 8-byte writes conflict-free).
constexpr int kScratchStride = 40;
constexpr int kScratchFloats = 16 * kScratchStride;  // per warp

// How the operand kept in shared memory (the weight) is stored.
enum ResidentMode : int {
  kTf32 = 0,      // tf32-rounded values: plain TF32 math
  kSplitPre = 1,  // FP32-accurate: tf32 hi words and the rounded bf16 lo pairs (1.5x the bytes)
  kSplitRaw = 2,  // FP32-accurate: raw f32, split at every use (the fused backward: 1x the bytes)
};

// Activation tiles in shared memory: NCHW tiles are (channels, 128 pixels), NHWC tiles
// (128 pixels, channels). Row strides are compile-time multiples of 32 floats (the swizzle needs
// 32): NCHW 128 pixels; NHWC the most channels the kernel takes. The pointwise kernel's
// 128-channel variant takes <= 64 reduction channels, its 64-channel variant <= 128.
__host__ __device__ constexpr int pointwise_nhwc_stride(int block_channels) { return block_channels == 128 ? 64 : 128; }
// Bytes of a resident weight block of `channels` x r_pad values in fragment order.
__host__ __device__ constexpr int resident_bytes(int channels, int r_pad, int mode) {
  return channels * r_pad * (mode == kSplitPre ? 6 : 4);
}

// ---------------------------------------------------------------------------------------------
// PTX wrappers (the primitives themselves are in ops/cuda/arch/)

// Waits until at most `pending` groups are in flight (pending <= kMaxStages - 2).
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  if (pending <= 0) cp_async_wait<0>();
  else if (pending == 1) cp_async_wait<1>();
  else cp_async_wait<2>();
}
// The named barrier (named_barrier.cuh) where the fused backward's two roles meet once both
// GEMMs have read the tile (the dx warps then reuse the stage for staged stores). A plain
// __syncthreads would do too, but the roles reach it from different code paths; one id for
// both keeps them paired.
constexpr int kDwDoneBarrier = 1;

// Two bf16 values in one register, `first` in the low half (the lower k index), by truncation:
// one byte permute, used in the hot loops (the weight's, once per kernel, are rounded: bf16_pair).
__device__ __forceinline__ uint32_t bf16_pair_trunc(uint32_t first, uint32_t second) {
  return __byte_perm(first, second, 0x7632);
}
__device__ __forceinline__ uint32_t bf16_pair_trunc(float first, float second) {
  return bf16_pair_trunc(__float_as_uint(first), __float_as_uint(second));
}

// mma m16n8k8 tf32 fragments, g = lane / 4, t = lane % 4 (PTX ISA, "Matrix Fragments for
// mma.m16n8k8", .tf32):
//   A 16x8: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
//   B 8x8:  b0 (k=t, n=g), b1 (k=t+4, n=g)
//   C 16x8: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
// FP32-accurate mode: the cross terms of one k-step of 8, sum_c A_hi B_lo + A_lo B_hi, are one
// m16n8k16 bf16 op, whose fragments are A: {row g: k 2t,2t+1}, {row g+8: k 2t,2t+1},
// {row g: k 2t+8,2t+9}, {row g+8: k 2t+8,2t+9}; B: {k 2t,2t+1}, {k 2t+8,2t+9} at n = g; C as
// above. Permuting k the same way in both operands,
//   k = 2t, 2t+1    <- A_lo(c = t, t+4) * B_hi(c = t, t+4)
//   k = 2t+8, 2t+9  <- A_hi(c = t, t+4) * B_lo(c = t, t+4)
// so every lane already holds exactly the values it packs. (The lo pairs of a resident A come
// from one 8-byte load into registers 0-1 of the quad, the hi pairs are computed into 2-3.)
struct FragA {
  uint32_t hi[4], bf[4];
};
struct FragB {
  uint32_t hi[2], bf[2];
};

// v0 (g, t), v1 (g+8, t), v2 (g, t+4), v3 (g+8, t+4).
template <bool kSplit>
__device__ __forceinline__ FragA make_a(float v0, float v1, float v2, float v3) {
  FragA f{};
  if constexpr (kSplit) {
    f.hi[0] = tf32_bits(v0);
    f.hi[1] = tf32_bits(v1);
    f.hi[2] = tf32_bits(v2);
    f.hi[3] = tf32_bits(v3);
    const float h0 = __uint_as_float(f.hi[0]), h1 = __uint_as_float(f.hi[1]);
    const float h2 = __uint_as_float(f.hi[2]), h3 = __uint_as_float(f.hi[3]);
    // v - hi is exact: hi is v rounded to 11 significant bits, within a factor 2 of v.
    f.bf[0] = bf16_pair_trunc(v0 - h0, v2 - h2);    // row g:   k 2t, 2t+1
    f.bf[1] = bf16_pair_trunc(v1 - h1, v3 - h3);    // row g+8
    f.bf[2] = bf16_pair_trunc(f.hi[0], f.hi[2]);    // row g:   k 2t+8, 2t+9
    f.bf[3] = bf16_pair_trunc(f.hi[1], f.hi[3]);    // row g+8
  } else {
    f.hi[0] = tf32_operand(v0);
    f.hi[1] = tf32_operand(v1);
    f.hi[2] = tf32_operand(v2);
    f.hi[3] = tf32_operand(v3);
  }
  return f;
}
__device__ __forceinline__ float as_float(uint32_t u) { return __uint_as_float(u); }
template <bool kSplit>
__device__ __forceinline__ FragA make_a(const uint32_t (&r)[4]) {
  return make_a<kSplit>(as_float(r[0]), as_float(r[1]), as_float(r[2]), as_float(r[3]));
}
// v0 (k=t, n=g), v1 (k=t+4, n=g).
template <bool kSplit>
__device__ __forceinline__ FragB make_b(float v0, float v1) {
  FragB f{};
  if constexpr (kSplit) {
    f.hi[0] = tf32_bits(v0);
    f.hi[1] = tf32_bits(v1);
    const float h0 = __uint_as_float(f.hi[0]), h1 = __uint_as_float(f.hi[1]);
    f.bf[0] = bf16_pair_trunc(f.hi[0], f.hi[1]);  // k 2t, 2t+1: pairs with A_lo
    f.bf[1] = bf16_pair_trunc(v0 - h0, v1 - h1);  // k 2t+8, 2t+9: pairs with A_hi
  } else {
    f.hi[0] = tf32_operand(v0);
    f.hi[1] = tf32_operand(v1);
  }
  return f;
}

// kZero: the accumulator starts at zero (the first k-step of a tile), so no register has to
// be cleared: the C operand is the zero register.
template <bool kSplit, bool kZero = false>
__device__ __forceinline__ void mma(float (&d)[4], const FragA& a, const FragB& b) {
  if constexpr (kZero) mma_tf32_zero(d, a.hi, b.hi[0], b.hi[1]);
  else mma_tf32(d, a.hi, b.hi[0], b.hi[1]);
  if constexpr (kSplit) mma_bf16(d, a.bf, b.bf[0], b.bf[1]);
}
// Compile-time flag for the k-step lambdas: "this is the first k-step of the tile".
using First = std::true_type;
using Later = std::false_type;

// ---------------------------------------------------------------------------------------------
// Activation tiles in shared memory

// `stride` floats per row (a multiple of 32). Element (r, c) sits in column c ^ swz(r), which
// permutes the 16-byte chunks inside each 128-byte group: the two fragment patterns, 8 rows x
// 4 columns and 4 rows x 8 columns (row starts multiples of 8), then hit 32 distinct banks, and
// so do 8 consecutive rows' 16-byte chunks of one column group (ldmatrix); every 16-byte chunk
// stays whole for cp.async. Rows are addressed as r0 + ro with r0 a multiple of 8, so the
// swizzle depends on ro alone.
struct SmemTile {
  float* base;
  int stride;
  __host__ __device__ static constexpr int swz(int ro) { return ((ro & 3) << 3) | (ro & 4); }
  __device__ __forceinline__ int offset(int r0, int ro, int c) const { return (r0 + ro) * stride + (c ^ swz(ro)); }
  __device__ __forceinline__ float at(int r0, int ro, int c) const { return base[offset(r0, ro, c)]; }
};

// Byte offset, inside a swizzled tile of `stride` floats per row, of the row this lane hands to
// ldmatrix.x4 for k-steps ks = 4 jj + u (add 128 jj bytes): matrix j = lane / 8 covers rows
// row0 + 8 * row_sel(j) + (lane % 8) and the 4-column chunk 2 ks + col_sel(j). A fragments
// (rows m) take row_sel = j & 1, col_sel = j >> 1 (registers a0..a3); two n-tiles of B fragments
// (rows n) take row_sel = j >> 1, col_sel = j & 1 (registers b0, b1 of n-tile 0, then of 1).
// The chunk index is 8 jj + ((2u + col_sel) ^ swz/4), so jj only adds a constant.
__device__ __forceinline__ uint32_t ldmatrix_offset(int stride, int row0, int u, bool a_order, int lane) {
  const int j = lane >> 3, ro = lane & 7;
  const int row_sel = a_order ? (j & 1) : (j >> 1), col_sel = a_order ? (j >> 1) : (j & 1);
  const int chunk = (2 * u + col_sel) ^ (SmemTile::swz(ro) >> 2);
  return static_cast<uint32_t>(((row0 + 8 * row_sel + ro) * stride + 4 * chunk) * 4);
}

// Fragments read from a tile (g, t as above). "rows_m": the tile's rows are the operand's
// M (or N) index; "rows_k": its rows are the reduction index.
template <bool kSplit>
__device__ __forceinline__ FragA tile_a_rows_m(const SmemTile& T, int m0, int k0, int g, int t) {  // A(m,k) = T[m][k]
  return make_a<kSplit>(T.at(m0, g, k0 + t), T.at(m0, g + 8, k0 + t), T.at(m0, g, k0 + t + 4),
                        T.at(m0, g + 8, k0 + t + 4));
}
template <bool kSplit>
__device__ __forceinline__ FragA tile_a_rows_k(const SmemTile& T, int m0, int k0, int g, int t) {  // A(m,k) = T[k][m]
  return make_a<kSplit>(T.at(k0, t, m0 + g), T.at(k0, t, m0 + g + 8), T.at(k0, t + 4, m0 + g),
                        T.at(k0, t + 4, m0 + g + 8));
}
template <bool kSplit>
__device__ __forceinline__ FragB tile_b_rows_k(const SmemTile& T, int k0, int n0, int g, int t) {  // B(k,n) = T[k][n]
  return make_b<kSplit>(T.at(k0, t, n0 + g), T.at(k0, t + 4, n0 + g));
}
template <bool kSplit>
__device__ __forceinline__ FragB tile_b_rows_n(const SmemTile& T, int k0, int n0, int g, int t) {  // B(k,n) = T[n][k]
  return make_b<kSplit>(T.at(n0, g, k0 + t), T.at(n0, g, k0 + t + 4));
}

// NCHW B fragments 4 n-tiles at a time (the forward's activations, the grad-input's dy): the
// order of a warp's 32 pixel columns inside its GEMM is ours to choose, so n-tile v's column g
// ("virtual" column 8 v + g) is taken to be pixel 4 g + v. A lane's b0 for all four n-tiles is
// then one 16-byte load (pixels 4g..4g+3 of row t), b1 another (row t + 4): 2 LDS.128 per
// k-step instead of 8 LDS.32 (the same bytes, a quarter of the instructions; the forward is
// limited by the shared-memory instruction queue). Swizzled chunk
// g ^ (2t + h) (h: row t + 4h): each quarter-warp (g = 2i, 2i+1; t = 0..3) reads 8 distinct
// chunks, and row strides are multiples of 32 floats: conflict-free.
// The accumulators' columns are virtual too: c0..c3 of n-tile v sit at pixels 4 (2t + e) + v,
// so over v = 0..3 a lane holds pixels 8t + 4e .. + 3 of rows g (e = 0, 1: c0, c1) and g + 8
// (c2, c3) -- see store_acc_quads / store_acc_staged_quads.
struct RowsKQuads {
  int off[2];  // floats: row t + 4h, pixels 4g..4g+3 of the warp's 32 columns
  __device__ __forceinline__ RowsKQuads(int stride, int w, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) off[h] = 32 * w + (t + 4 * h) * stride + ((4 * g) ^ SmemTile::swz(t + 4 * h));
  }
};
// The four n-tiles' B fragments of k-step rows k0.. (k0 a multiple of 8) from `tile`.
template <bool kSplit>
__device__ __forceinline__ void quad_b_fragments(FragB (&b)[4], const float* tile, const RowsKQuads& q, int row_off) {
  const float4 v0 = *reinterpret_cast<const float4*>(tile + q.off[0] + row_off);
  const float4 v1 = *reinterpret_cast<const float4*>(tile + q.off[1] + row_off);
  b[0] = make_b<kSplit>(v0.x, v1.x);
  b[1] = make_b<kSplit>(v0.y, v1.y);
  b[2] = make_b<kSplit>(v0.z, v1.z);
  b[3] = make_b<kSplit>(v0.w, v1.w);
}

// Where a tile comes from: tile element (r, c) is src[r * row_stride + c] for r < valid_rows and
// c < valid_cols, zero elsewhere; fill_rows x fill_cols elements are written (fill_cols % 4 == 0).
struct TileSource {
  const float* src;
  int64_t row_stride;
  int valid_rows, valid_cols, fill_rows, fill_cols;
};

// This thread's share of the 16-byte copies of every tile of one shape (rows of `stride` <= 128
// floats, a compile-time constant in every kernel): a fixed chunk column and every row_step-th
// row from row0. row_step is a multiple of 8, so the swizzle of row0 holds for all of the
// thread's rows and shared-memory offsets are computed once. used_cols (<= stride): the columns
// actually copied; threads whose chunk lies past them idle. (Laid out for the run-time width,
// ptxas would re-derive the whole geometry from %tid.x at every tile at the 128-register cap.)
struct TileLoader {
  int col, row0, row_step, row_shift, smem_off0, smem_step;  // row_step = 2^row_shift; smem in floats
  bool active;                                                // the chunk lies inside the copied columns

  // threads: a power of two (every kernel here runs 256 or 512).
  __device__ TileLoader(int stride, int threads, int used_cols) {
    const int chunks = stride >> 2;                             // <= 32
    const int shift = chunks > 1 ? 32 - __clz(chunks - 1) : 0;  // chunks rounded up to 2^shift
    col = (static_cast<int>(threadIdx.x) & ((1 << shift) - 1)) << 2;
    row0 = static_cast<int>(threadIdx.x) >> shift;
    row_step = threads >> shift;
    row_shift = 31 - __clz(row_step);
    active = col < used_cols;
    smem_off0 = row0 * stride + (col ^ SmemTile::swz(row0 & 7));
    smem_step = row_step * stride;
  }
};

// n whole 16-byte copies, rows smem_step bytes / g_step floats apart.
template <int N>
__device__ __forceinline__ void copy_whole_rows(uint32_t smem, uint32_t smem_step, const float* g, int64_t g_step,
                                                uint64_t policy) {
#pragma unroll
  for (int i = 0; i < N; ++i) cp_async_16_full(smem + i * smem_step, g + i * g_step, policy);
}

// Issues this thread's share of the cp.async copies of one tile (no commit). `vec`: rows start
// 16-byte aligned, so 16-byte copies are legal (through `ld`); otherwise 4-byte copies.
__device__ void load_tile(const TileLoader& ld, const SmemTile& dst, const TileSource& s, const float* any_valid,
                          bool vec, uint64_t policy) {
  if (vec) {
    if (!ld.active) return;
    const int col_bytes = ld.col < s.valid_cols ? 4 * min(4, s.valid_cols - ld.col) : 0;
    const float* g = s.src + ld.row0 * s.row_stride + ld.col;
    const int64_t g_step = ld.row_step * s.row_stride;
    uint32_t smem = shared_address(dst.base + ld.smem_off0);
    const uint32_t smem_step = 4u * ld.smem_step;
    if (col_bytes == 16 && s.valid_rows >= s.fill_rows) {  // the usual case: every copy whole
      // The usual counts fully unrolled, every copy at its own address register: a loop that advances
      // one register after each copy waits until that copy has left the MIO queue and read it.
      const int copies = (s.fill_rows - ld.row0 + ld.row_step - 1) >> ld.row_shift;
      if (copies == 8) return copy_whole_rows<8>(smem, smem_step, g, g_step, policy);
      if (copies == 4) return copy_whole_rows<4>(smem, smem_step, g, g_step, policy);
      for (int r = ld.row0; r < s.fill_rows; r += ld.row_step, g += g_step, smem += smem_step)
        cp_async_16_full(smem, g, policy);
      return;
    }
    for (int r = ld.row0; r < s.fill_rows; r += ld.row_step, g += g_step, smem += smem_step) {
      const bool ok = r < s.valid_rows && col_bytes > 0;
      cp_async_16(smem, ok ? g : any_valid, ok ? col_bytes : 0, policy);
    }
  } else {
    const int shift = 32 - __clz(s.fill_cols - 1);  // fill_cols >= 4
    const int total = s.fill_rows << shift;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
      const int r = e >> shift, c = e & ((1 << shift) - 1);
      if (c >= s.fill_cols) continue;
      const bool ok = r < s.valid_rows && c < s.valid_cols;
      const float* g = ok ? s.src + r * s.row_stride + c : any_valid;
      cp_async_4(shared_address(dst.base + dst.offset(r & ~7, r & 7, c)), g, ok ? 4 : 0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The resident operand: the weight, in fragment order

// The GEMM's weight-like matrix M(m, r) (m: an output channel of this GEMM, r: a reduction
// channel) = w[(m0 + m) * stride_m + (r0 + r) * stride_r] inside m_count x r_count, else 0.
struct WeightView {
  const float* w;
  int64_t stride_m, stride_r;
  int m0, m_count, r0, r_count;
  __device__ float operator()(int m, int r) const {
    return (m < m_count && r < r_count) ? w[(m0 + m) * stride_m + (r0 + r) * stride_r] : 0.f;
  }
};

// Entry e = (ks * kTiles + tile) * 32 + lane holds one lane's fragment of 16-row (A) tile `tile`
// at k-step ks (k-step major: a warp's tiles at one k-step are neighbours, at offsets known at
// compile time); B's 8-column tiles likewise, two neighbouring tiles per lane (b_entry). First
// the hi words; then, for kSplitPre, the rounded bf16 lo pairs of all entries (A: bf[0], bf[1];
// B: bf[1]). The bf16 hi pairs are the hi words' top halves.
template <int kMode, int kTiles>
struct Resident {
  const unsigned char* base;
  int entries;

  __device__ __forceinline__ FragA a(int tile, int ks, int lane) const {
    const int e = (ks * kTiles + tile) * 32 + lane;
    if constexpr (kMode == kSplitRaw) {
      const float4 v = reinterpret_cast<const float4*>(base)[e];
      return make_a<true>(v.x, v.y, v.z, v.w);
    } else {
      FragA f{};
      const uint4 h = reinterpret_cast<const uint4*>(base)[e];
      f.hi[0] = h.x, f.hi[1] = h.y, f.hi[2] = h.z, f.hi[3] = h.w;
      if constexpr (kMode == kSplitPre) {
        const uint2 lo = reinterpret_cast<const uint2*>(base + entries * 16)[e];
        f.bf[0] = lo.x, f.bf[1] = lo.y;
        f.bf[2] = bf16_pair_trunc(h.x, h.z);
        f.bf[3] = bf16_pair_trunc(h.y, h.w);
      }
      return f;
    }
  }
  // B entries come in pairs of neighbouring tiles (2p, 2p + 1) per lane, so that b_pair is one
  // 16-byte load (b_entry says where a single tile's 8 bytes are).
  __device__ __forceinline__ static int b_entry(int tile, int ks, int lane) {
    static_assert(kTiles % 2 == 0, "B tiles come in pairs");
    return ((ks * (kTiles / 2) + (tile >> 1)) * 32 + lane) * 2 + (tile & 1);
  }
  // A lane's B fragment from its resident words: w0, w1 (tf32 hi words; raw f32 bits for
  // kSplitRaw) and, for kSplitPre, the rounded bf16 lo pair.
  __device__ __forceinline__ static FragB unpack_b(uint32_t w0, uint32_t w1, uint32_t lo) {
    if constexpr (kMode == kSplitRaw) return make_b<true>(as_float(w0), as_float(w1));
    FragB f;  // kTf32: bf is never read (mma<false> takes hi only)
    f.hi[0] = w0, f.hi[1] = w1;
    if constexpr (kMode == kSplitPre) f.bf[0] = bf16_pair_trunc(w0, w1), f.bf[1] = lo;
    return f;
  }
  __device__ __forceinline__ void b_pair(FragB& b0, FragB& b1, int pair, int ks, int lane) const {
    const int e = (ks * (kTiles / 2) + pair) * 32 + lane;  // b_entry(2 pair, ...) / 2
    const uint4 h = reinterpret_cast<const uint4*>(base)[e];
    uint2 lo{};
    if constexpr (kMode == kSplitPre) lo = reinterpret_cast<const uint2*>(base + entries * 8)[e];
    b0 = unpack_b(h.x, h.y, lo.x);
    b1 = unpack_b(h.z, h.w, lo.y);
  }
  __device__ __forceinline__ FragB b(int tile, int ks, int lane) const {
    const int e = b_entry(tile, ks, lane);
    const uint2 h = reinterpret_cast<const uint2*>(base)[e];
    uint32_t lo = 0;
    if constexpr (kMode == kSplitPre) lo = reinterpret_cast<const uint32_t*>(base + entries * 8)[e];
    return unpack_b(h.x, h.y, lo);
  }
};

// M as the A operand (rows m), kTiles * 16 rows x 8*KS. Returns the entry count.
template <int kMode, int kTiles>
__device__ int fill_resident_a(unsigned char* base, int KS, const WeightView& M) {
  const int entries = kTiles * KS * 32;
  for (int e = threadIdx.x; e < entries; e += blockDim.x) {
    const int lane = e & 31, tile = (e >> 5) % kTiles, ks = (e >> 5) / kTiles;
    const int m = tile * 16 + (lane >> 2), r = ks * 8 + (lane & 3);
    const float v0 = M(m, r), v1 = M(m + 8, r), v2 = M(m, r + 4), v3 = M(m + 8, r + 4);
    if constexpr (kMode == kSplitRaw) {
      reinterpret_cast<float4*>(base)[e] = make_float4(v0, v1, v2, v3);
    } else {
      const uint32_t h0 = tf32_bits(v0), h1 = tf32_bits(v1), h2 = tf32_bits(v2), h3 = tf32_bits(v3);
      reinterpret_cast<uint4*>(base)[e] = make_uint4(h0, h1, h2, h3);
      if constexpr (kMode == kSplitPre)
        reinterpret_cast<uint2*>(base + entries * 16)[e] =
            make_uint2(bf16_pair(v0 - as_float(h0), v2 - as_float(h2)),
                       bf16_pair(v1 - as_float(h1), v3 - as_float(h3)));
    }
  }
  return entries;
}
// M as the B operand, B(k = r, n = m), kTiles * 8 columns x 8*KS. Returns the entry count.
template <int kMode, int kTiles>
__device__ int fill_resident_b(unsigned char* base, int KS, const WeightView& M) {
  const int entries = kTiles * KS * 32;
  for (int e = threadIdx.x; e < entries; e += blockDim.x) {
    // e = Resident::b_entry(tile, ks, lane): pairs of tiles per lane.
    const int lane = (e >> 1) & 31, pair = (e >> 6) % (kTiles / 2), ks = (e >> 6) / (kTiles / 2);
    const int tile = 2 * pair + (e & 1);
    const int n = tile * 8 + (lane >> 2), r = ks * 8 + (lane & 3);
    const float v0 = M(n, r), v1 = M(n, r + 4);
    if constexpr (kMode == kSplitRaw) {
      reinterpret_cast<float2*>(base)[e] = make_float2(v0, v1);
    } else {
      const uint32_t h0 = tf32_bits(v0), h1 = tf32_bits(v1);
      reinterpret_cast<uint2*>(base)[e] = make_uint2(h0, h1);
      if constexpr (kMode == kSplitPre)
        reinterpret_cast<uint32_t*>(base + entries * 8)[e] = bf16_pair(v0 - as_float(h0), v1 - as_float(h1));
    }
  }
  return entries;
}

// ---------------------------------------------------------------------------------------------
// Epilogue: accumulators -> global memory

// GEMM tile element (i, j) (i: mma row, j: mma column, contiguous in memory in both layouts)
// lives at base[i * row_stride + j]; only i < valid_rows, j < valid_cols exist.
struct OutTile {
  float* base;
  int64_t row_stride;
  int valid_rows, valid_cols;
  bool vec;  // row starts are 16-byte aligned
};

// Stores 4 consecutive columns j..j+3 of row i (plus bias, plus the old value when
// accumulating). bias_rows / bias_cols: shared-memory bias indexed by i or by j, or null.
__device__ __forceinline__ void store4(const OutTile& o, int i, int j, float (&v)[4], const float* bias_rows,
                                       const float* bias_cols, bool accumulate) {
  if (i >= o.valid_rows) return;
  if (bias_rows != nullptr) {
    const float b = bias_rows[i];
    for (int e = 0; e < 4; ++e) v[e] += b;
  }
  if (bias_cols != nullptr)
    for (int e = 0; e < 4; ++e) v[e] += bias_cols[j + e];
  float* p = o.base + i * o.row_stride + j;
  if (o.vec && j + 3 < o.valid_cols) {
    float4 val = make_float4(v[0], v[1], v[2], v[3]);
    if (accumulate) {
      const float4 old = *reinterpret_cast<const float4*>(p);
      val.x += old.x, val.y += old.y, val.z += old.z, val.w += old.w;
    }
    __stcs(reinterpret_cast<float4*>(p), val);
  } else {
    for (int e = 0; e < 4; ++e) {
      if (j + e >= o.valid_cols) break;
      __stcs(p + e, accumulate ? v[e] + p[e] : v[e]);
    }
  }
}

// Any tile (edges, accumulation, unaligned rows): stores a warp's kMT x kNT accumulator tiles
// whose top-left is (row0, col0). Lanes t and t^1 trade halves: the even lane then holds row g,
// columns 4(t/2)..+3, the odd one row g+8.
template <int kMT, int kNT>
__device__ __forceinline__ void store_acc(float (&acc)[kMT][kNT][4], const OutTile& o, int row0, int col0, int g, int t,
                                       const float* bias_rows, const float* bias_cols, bool accumulate) {
  const bool odd = t & 1;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const float* c = acc[mt][nt];
      const float give0 = odd ? c[0] : c[2], give1 = odd ? c[1] : c[3];
      const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1), got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
      float v[4];
      v[0] = odd ? got0 : c[0];
      v[1] = odd ? got1 : c[1];
      v[2] = odd ? c[2] : got0;
      v[3] = odd ? c[3] : got1;
      store4(o, row0 + mt * 16 + g + (odd ? 8 : 0), col0 + nt * 8 + (t >> 1) * 4, v, bias_rows, bias_cols,
             accumulate);
    }
  }
}

// Shared-memory stores of values from different accumulator registers: through plain float2 /
// float4 stores ptxas split some into 4-byte stores at the 128-register cap, which conflict
// here. The PTX vector stores stay whole (the register moves
// they need are cheap): st_shared_v2 / st_shared_v4 (ops/cuda/arch/shared_memory.cuh).

// The read-back half of a staged store: one 16-row block of a warp's scratch (rows `stride`
// floats apart; this lane reads rows rr + 4i, i < 4, from rd) stored as whole rows at dst, which
// advances by `step` per row read, plus bias: bias[row0 + 4i] per row or bc per column.
enum BiasKind : int { kNoBias = 0, kBiasRows = 1, kBiasCols = 2 };
template <int kBias>
__device__ __forceinline__ void store_scratch_rows(const float* rd, int stride, float*& dst, int64_t step,
                                                   const float* bias, int row0, float4 bc) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float4 v = *reinterpret_cast<const float4*>(rd + 4 * i * stride);
    if constexpr (kBias == kBiasRows) {
      const float b = bias[row0 + 4 * i];
      v.x += b, v.y += b, v.z += b, v.w += b;
    } else if constexpr (kBias == kBiasCols) {
      v.x += bc.x, v.y += bc.y, v.z += bc.z, v.w += bc.w;
    }
    __stcs(reinterpret_cast<float4*>(dst), v);
    dst += step;
  }
}

// The 16 x 32 block (m-tile mt, n-tiles 4 cg .. 4 cg + 3) of a warp's accumulators into its
// scratch in fragment order: this lane's rows g and g + 8, columns 8 nt + 2 t, + 1 (wr: row g,
// column 2 t), two 8-byte stores per n-tile.
template <int kMT, int kNT>
__device__ __forceinline__ void write_block_fragments(const float (&acc)[kMT][kNT][4], int mt, int cg, float* wr) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const float* c = acc[mt][4 * cg + nt];
    st_shared_v2(wr + nt * 8, c[0], c[1]);
    st_shared_v2(wr + 8 * kScratchStride + nt * 8, c[2], c[3]);
  }
}

// A full tile with 16-byte-aligned rows: a warp's kMT x kNT accumulator tiles, whose top-left
// element is out[0] (rows row_stride apart), go through `scratch` (kScratchFloats of shared
// memory that only this warp touches): each 16 x 32 block is written in fragment order, then
// read back by rows, 8 lanes x 16 bytes per row, so every store instruction writes four whole
// 128-byte lines. kBias: 0 none, 1 bias[row], 2 bias[column] (shared memory, from the warp's
// first row / column); a template argument, because even a zero bias costs an add per value.
template <int kMT, int kNT, int kBias>
__device__ __forceinline__ void store_acc_staged(float (&acc)[kMT][kNT][4], float* scratch, float* out,
                                                 int64_t row_stride, int lane, const float* bias) {
  static_assert(kNT % 4 == 0, "blocks of 32 columns");
  const int g = lane >> 2, t = lane & 3;
  const int rr = lane >> 3, cc = 4 * (lane & 7);  // read-back: rows rr + 4i, columns cc..cc+3
  float* wr = scratch + g * kScratchStride + 2 * t;
  const float* rd = scratch + rr * kScratchStride + cc;
  const int64_t step = 4 * row_stride;
#pragma unroll
  for (int cg = 0; cg < kNT / 4; ++cg) {  // 32-column blocks
    float* dst = out + rr * row_stride + 32 * cg + cc;
    float4 bc;
    if constexpr (kBias == kBiasCols) bc = *reinterpret_cast<const float4*>(bias + 32 * cg + cc);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      write_block_fragments(acc, mt, cg, wr);
      __syncwarp();
      store_scratch_rows<kBias>(rd, kScratchStride, dst, step, bias, mt * 16 + rr, bc);
      __syncwarp();  // the next block overwrites what this one read
    }
  }
}

// store_acc for accumulators whose 32 columns are in RowsKQuads order (NCHW: the forward and
// the grad-input): lane (g, t) holds columns 8t..8t+7 of rows g and g + 8, so no lanes trade.
template <int kMT>
__device__ __forceinline__ void store_acc_quads(float (&acc)[kMT][4][4], const OutTile& o, int row0, int col0, int g,
                                                int t, const float* bias_rows, bool accumulate) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v[4] = {acc[mt][0][e], acc[mt][1][e], acc[mt][2][e], acc[mt][3][e]};
      store4(o, row0 + mt * 16 + g + (e >= 2 ? 8 : 0), col0 + 8 * t + 4 * (e & 1), v, bias_rows, nullptr, accumulate);
    }
}

// store_acc_staged for RowsKQuads order: each 16 x 32 block is written as 16-byte row pieces
// (row g: columns 8t + 4e, e = 0, 1; row g + 8 likewise) -- half the shared-memory store
// instructions of fragment order -- then read back and stored exactly as store_acc_staged does.
// Row stride 36 floats (4 mod 32): the 8 lanes of a quarter-warp (g = 2i, 2i+1, t = 0..3) write
// 16-byte chunks 9g + 2t + e, distinct mod 8: conflict-free.
constexpr int kQuadScratchStride = 36;
static_assert(16 * kQuadScratchStride <= kScratchFloats, "fits the warp's scratch");
template <int kMT, int kBias>
__device__ __forceinline__ void store_acc_staged_quads(float (&acc)[kMT][4][4], float* scratch, float* out,
                                                       int64_t row_stride, int lane, const float* bias) {
  static_assert(kBias != kBiasCols, "NCHW: bias per row");
  constexpr int S = kQuadScratchStride;
  const int g = lane >> 2, t = lane & 3;
  const int rr = lane >> 3, cc = 4 * (lane & 7);  // read-back: rows rr + 4i, columns cc..cc+3
  float* wr = scratch + g * S + 8 * t;
  const float* rd = scratch + rr * S + cc;
  const int64_t step = 4 * row_stride;
  float* dst = out + rr * row_stride + cc;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      st_shared_v4(wr + (e >= 2 ? 8 * S : 0) + 4 * (e & 1), acc[mt][0][e], acc[mt][1][e], acc[mt][2][e], acc[mt][3][e]);
    __syncwarp();
    store_scratch_rows<kBias>(rd, S, dst, step, bias, mt * 16 + rr, float4{});
    __syncwarp();  // the next block overwrites what this one read
  }
}

// ---------------------------------------------------------------------------------------------
// Tiles: which 128 pixels a block works on

// A block visits tiles blockIdx.x, + step, + 2 step, ... NCHW tiles are 128 pixels of one
// image (tile = n * tiles_per_image + rem); NHWC tiles are 128 rows of the (N*P, channels)
// matrix. step_n / step_rem = step / tiles_per_image and step % tiles_per_image, so that walking
// costs no division.
struct TileGrid {
  int64_t num_tiles, tiles_per_image, step, step_n, step_rem;
};
struct TileCursor {
  int64_t tile;
  int n, rem;  // NCHW only (the host checks that images and tiles per image fit in int)
};
template <bool kNHWC>
__device__ __forceinline__ TileCursor cursor_at(int64_t tile, const TileGrid& tg) {
  TileCursor c{tile, 0, 0};
  if constexpr (!kNHWC) {
    c.n = static_cast<int>(tile / tg.tiles_per_image);
    c.rem = static_cast<int>(tile - c.n * tg.tiles_per_image);
  }
  return c;
}
template <bool kNHWC>
__device__ __forceinline__ void advance(TileCursor& c, const TileGrid& tg) {
  c.tile += tg.step;
  if constexpr (!kNHWC) {
    c.n += static_cast<int>(tg.step_n);
    c.rem += static_cast<int>(tg.step_rem);
    if (c.rem >= tg.tiles_per_image) c.rem -= static_cast<int>(tg.tiles_per_image), ++c.n;
  }
}
// The tile `ahead` steps after c (the one a prefetch loads).
template <bool kNHWC>
__device__ __forceinline__ TileCursor ahead_of(TileCursor c, int ahead, const TileGrid& tg) {
  for (int i = 0; i < ahead; ++i) advance<kNHWC>(c, tg);
  return c;
}

// Where a tile lies.
struct TilePos {
  int64_t n, p0;  // NCHW: image and first pixel; NHWC: n = 0, p0 = first row of N*P
  int pixels;     // valid pixels (rows) in the tile
};
__host__ __device__ constexpr int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <bool kNHWC>
__device__ __forceinline__ TilePos tile_pos(const TileCursor& c, int64_t pixels, int64_t rows) {
  TilePos q;
  if constexpr (kNHWC) {
    q.n = 0;
    q.p0 = c.tile * kTilePixels;
    q.pixels = static_cast<int>(min64(kTilePixels, rows - q.p0));
  } else {
    q.n = c.n;
    q.p0 = int64_t(c.rem) * kTilePixels;
    q.pixels = static_cast<int>(min64(kTilePixels, pixels - q.p0));
  }
  return q;
}

// The tile of a tensor with `channels` channels, channel range [c0, c0 + count) (zero-padded
// to pad), at tile position q. NCHW: rows = channels, NHWC: rows = pixels.
__device__ __forceinline__ TileSource tile_source(bool nhwc, const float* base, const TilePos& q, int64_t channels,
                                                  int64_t pixels, int c0, int count, int pad) {
  if (nhwc) return {base + q.p0 * channels + c0, channels, q.pixels, count, kTilePixels, pad};
  return {base + (q.n * channels + c0) * pixels + q.p0, pixels, count, q.pixels, pad, kTilePixels};
}
// The matching output tile (mma rows = channels for NCHW, pixels for NHWC).
__device__ __forceinline__ OutTile out_tile(bool nhwc, float* base, const TilePos& q, int64_t channels,
                                            int64_t pixels, int c0, int count, bool vec) {
  if (nhwc) return {base + q.p0 * channels + c0, channels, q.pixels, count, vec};
  return {base + (q.n * channels + c0) * pixels + q.p0, pixels, count, q.pixels, vec};
}

// ---------------------------------------------------------------------------------------------
// Forward and grad-input: out (M channels) = weight (M x R) applied at every pixel of in (R channels)

struct PointwiseParams {
  float* out;         // (N, M, P) or (N*P, M)
  const float* in;    // (N, R, P) or (N*P, R)
  const float* bias;  // (M) or null
  WeightView weight;  // this launch's block of output channels x group of reduction channels
  int64_t images, pixels, out_channels, in_channels;
  int r_pad;          // weight.r_count rounded up to 16
  int stages;
  int stage_floats;   // one stage: the input tile, and at least the 8 warps' store scratch
  bool accumulate;    // add to out (the second and later reduction groups)
  bool vec_in, vec_out;
  TileGrid grid;
};

// The mma tile per block is (kWM * kMT * 16) x (kWN * kNT * 8): NCHW rows = output channels,
// columns = 128 pixels (weight = A, resident; activations = B); NHWC rows = 128 pixels,
// columns = output channels (activations = A; weight = B, resident). kMinBlocks = 2 caps the
// registers at 128 so that two blocks share an SM.
template <bool kNHWC, int kWM, int kWN, int kMT, int kNT, int kMode, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) pointwise_kernel(const PointwiseParams p) {
  constexpr bool kSplit = kMode != kTf32;
  constexpr int kRows = kWM * kMT * 16, kCols = kWN * kNT * 8;
  constexpr int kChannels = kNHWC ? kCols : kRows;  // output channels per block
  constexpr int kResTiles = kNHWC ? kChannels / 8 : kChannels / 16;
  static_assert(kWM * kWN == kThreads / 32, "one warp per warp tile");
  static_assert((kNHWC ? kRows : kCols) == kTilePixels, "a tile is 128 pixels");
  static_assert(kNHWC || kNT == 4, "NCHW: a warp's columns are 32 pixels (fragment offsets)");
  static_assert(kNT % 4 == 0, "staged stores take blocks of 32 columns");

  extern __shared__ __align__(16) unsigned char smem[];
  const int KS = p.r_pad / 8;
  float* bias_s = reinterpret_cast<float*>(smem + resident_bytes(kChannels, p.r_pad, kMode));  // (kChannels)
  float* stage0 = bias_s + kChannels;
  // Compile-time row strides, so that fragment addresses are per-lane offsets plus constants.
  constexpr int stride = kNHWC ? pointwise_nhwc_stride(kChannels) : kTilePixels;

  const int entries = kNHWC ? fill_resident_b<kMode, kResTiles>(smem, KS, p.weight)
                            : fill_resident_a<kMode, kResTiles>(smem, KS, p.weight);
  const Resident<kMode, kResTiles> res{smem, entries};
  for (int c = threadIdx.x; c < kChannels; c += kThreads)
    bias_s[c] = (p.bias != nullptr && c < p.weight.m_count) ? p.bias[p.weight.m0 + c] : 0.f;

  const uint64_t policy = l2_evict_first_policy();
  const int64_t rows = p.images * p.pixels;
  const TileLoader loader(stride, kThreads, kNHWC ? p.r_pad : kTilePixels);
  auto issue = [&](const TileCursor& c, int stage) {
    if (c.tile < p.grid.num_tiles) {
      const TilePos q = tile_pos<kNHWC>(c, p.pixels, rows);
      load_tile(loader, SmemTile{stage0 + stage * p.stage_floats, stride},
                tile_source(kNHWC, p.in, q, p.in_channels, p.pixels, p.weight.r0, p.weight.r_count, p.r_pad), p.in,
                p.vec_in, policy);
    }
    cp_async_commit();  // always: the wait below counts groups
  };

  {
    TileCursor c = cursor_at<kNHWC>(blockIdx.x, p.grid);
    for (int s = 0; s < p.stages - 1; ++s) {
      issue(c, s);
      advance<kNHWC>(c, p.grid);
    }
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp % kWM, wn = warp / kWM;
  const int row0 = wm * kMT * 16, col0 = wn * kNT * 8;  // the warp tile's origin
  const bool has_bias = p.bias != nullptr;
  const RowsKQuads pb(stride, wn, lane);  // NCHW: B fragments of the activation tile
  int stage = 0;
  for (TileCursor cur = cursor_at<kNHWC>(blockIdx.x, p.grid); cur.tile < p.grid.num_tiles;
       advance<kNHWC>(cur, p.grid)) {
    cp_async_wait_pending(p.stages - 2);
    __syncthreads();  // this stage has landed for every thread; the one refilled next is free
    issue(ahead_of<kNHWC>(cur, p.stages - 1, p.grid), stage == 0 ? p.stages - 1 : stage - 1);

    float* X = stage0 + stage * p.stage_floats;
    float acc[kMT][kNT][4];
    if constexpr (kNHWC) {
      if (KS % 4 == 0) {
        // A (pixels x reduction channels) with one ldmatrix.x4 per fragment.
        uint32_t a_off[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) a_off[u] = shared_address(X) + ldmatrix_offset(stride, row0, u, true, lane);
        // The warp's A fragments first, then one (resident, cheap) B fragment at a time.
        auto kstep = [&](int ks, int u, int jj, auto first) {
          FragA a[kMT];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            uint32_t r[4];
            ldmatrix_x4(r, a_off[u] + mt * 16 * stride * 4 + jj * 128);
            a[mt] = make_a<kSplit>(r);
          }
#pragma unroll
          for (int np = 0; np < kNT / 2; ++np) {
            FragB b[2];
            res.b_pair(b[0], b[1], wn * kNT / 2 + np, ks, lane);
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int mt = 0; mt < kMT; ++mt) mma<kSplit, decltype(first)::value>(acc[mt][2 * np + h], a[mt], b[h]);
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
        if (KS == 8) group(1);  // 64 reduction channels (workload B): constant offsets
        else
          for (int jj = 1; jj < KS / 4; ++jj) group(jj);
      } else {
        const SmemTile XT{X, stride};
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
        for (int ks = 0; ks < KS; ++ks) {
          FragA a[kMT];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) a[mt] = tile_a_rows_m<kSplit>(XT, row0 + mt * 16, ks * 8, g, t);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            const FragB b = res.b(wn * kNT + nt, ks, lane);
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) mma<kSplit>(acc[mt][nt], a[mt], b);
          }
        }
      }
    } else {
      // B (reduction channels x pixels) from the tile through per-lane offsets.
      auto kstep = [&](int ks, auto first) {
        FragB b[kNT];
        quad_b_fragments<kSplit>(b, X, pb, 8 * ks * stride);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const FragA a = res.a(wm * kMT + mt, ks, lane);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) mma<kSplit, decltype(first)::value>(acc[mt][nt], a, b[nt]);
        }
      };
      kstep(0, First{});
      if (!kSplit && KS == 8) {  // 64 reduction channels (workload B): every offset a constant
#pragma unroll
        for (int ks = 1; ks < 8; ++ks) kstep(ks, Later{});
      } else {
        kstep(1, Later{});
        for (int ks = 2; ks < KS; ks += 2) {  // KS is even (r_pad is a multiple of 16)
          kstep(ks, Later{});
          kstep(ks + 1, Later{});
        }
      }
    }

    const TilePos q = tile_pos<kNHWC>(cur, p.pixels, rows);
    const OutTile o = out_tile(kNHWC, p.out, q, p.out_channels, p.pixels, p.weight.m0, p.weight.m_count, p.vec_out);
    if (q.pixels == kTilePixels && p.weight.m_count == kChannels && p.vec_out && !p.accumulate) {
      __syncthreads();  // every warp is done reading this stage: it becomes the warps' store scratch
      float* scratch = X + warp * kScratchFloats;
      float* out = o.base + row0 * o.row_stride + col0;
      const int64_t rs = o.row_stride;
      if constexpr (kNHWC) {
        if (!has_bias) store_acc_staged<kMT, kNT, kNoBias>(acc, scratch, out, rs, lane, nullptr);
        else store_acc_staged<kMT, kNT, kBiasCols>(acc, scratch, out, rs, lane, bias_s + col0);
      } else {
        if (!has_bias) store_acc_staged_quads<kMT, kNoBias>(acc, scratch, out, rs, lane, nullptr);
        else store_acc_staged_quads<kMT, kBiasRows>(acc, scratch, out, rs, lane, bias_s + row0);
      }
    } else if constexpr (kNHWC) {
      store_acc(acc, o, row0, col0, g, t, nullptr, bias_s, p.accumulate);
    } else {
      store_acc_quads(acc, o, row0, col0, g, t, bias_s, p.accumulate);
    }
    stage = stage + 1 == p.stages ? 0 : stage + 1;
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------------
// Backward: dw partials over a block's tiles, and (fused) dx = w^T dy on the same dy tile

struct BackwardParams {
  float* dx;           // (N, C, P) or (N*P, C); only read by the fused variant
  float* partial;      // (gridDim.x, K, C) dw partials
  const float* dy;     // (N, K, P) or (N*P, K)
  const float* x;      // (N, C, P) or (N*P, C)
  const float* w;      // (K, C)
  int64_t images, pixels, K, C;
  int c_blocks;        // blockIdx.y = k_block * c_blocks + c_block (the fused variant: one block)
  int res_bytes;       // resident w^T (fused only)
  int dy_floats, x_floats;  // per stage, sized for the largest dw block
  int stages;
  bool vec_dx;
  TileGrid grid;
};

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

// dw block: rows = K side (4 warps x 2 m-tiles x 16 = 128), columns = C side (2 warps x 4
// n-tiles x 8 = 64), reduction over the tile's 128 pixels.
// dx (fused): NCHW rows = C (2 x 2 x 16 = 64), columns = pixels (4 x 4 x 8 = 128);
//             NHWC rows = pixels (4 x 2 x 16), columns = C (2 x 4 x 8); reduction over K.
// The fused variant runs 16 warps: warps 0-7 compute and store dx, warps 8-15 dw, on the same
// shared-memory stage (each role needs half the registers, and 4 warps per scheduler hide
// each other's latencies); the dw-only variant runs the 8 dw warps.
// kVec: dy's and x's rows start 16-byte aligned (16-byte copies), else both take 4-byte copies.
// A template flag, not a parameter: as a runtime flag ptxas kept it in a register across the tile
// loop and, at 128 registers, spilled it; its reload at every tile waited behind the tile's
// copies.
template <bool kNHWC, bool kWithDx, int kMode, bool kVec>
__global__ void __launch_bounds__(kWithDx ? 2 * kThreads : kThreads, 1) backward_kernel(const BackwardParams p) {
  constexpr bool kSplit = kMode != kTf32;
  constexpr int kBlockThreads = kWithDx ? 2 * kThreads : kThreads;
  constexpr int kResTiles = kNHWC ? kDwCols / 8 : kDwCols / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  const int kb = blockIdx.y / p.c_blocks, cb = blockIdx.y % p.c_blocks;
  const int k0 = kb * kDwRows, c0 = cb * kDwCols;
  const int Kt = static_cast<int>(min64(kDwRows, p.K - k0));
  const int Ct = static_cast<int>(min64(kDwCols, p.C - c0));
  const int Kpad = round_up(Kt, 16), Cpad = round_up(Ct, 16);
  float* stage0 = reinterpret_cast<float*>(smem + p.res_bytes);
  const int stage_floats = p.dy_floats + p.x_floats;
  // Fixed row strides (sized for the largest block) so that offsets in the hot loop are constants.
  constexpr int dy_stride = kBwdDyStride, x_stride = kNHWC ? kBwdXStrideNhwc : kTilePixels;

  // dx = M dy with M(m = c, r = k) = w[k * C + c]; the fused variant has k0 = c0 = 0.
  const int KS1 = Kpad / 8;
  int entries = 0;
  if constexpr (kWithDx) {
    const WeightView wt{p.w, 1, p.C, 0, Ct, 0, Kt};
    entries = kNHWC ? fill_resident_b<kMode, kResTiles>(smem, KS1, wt)
                    : fill_resident_a<kMode, kResTiles>(smem, KS1, wt);
  }
  const Resident<kMode, kResTiles> res{smem, entries};

  const uint64_t policy = l2_evict_first_policy();
  const int64_t rows = p.images * p.pixels;
  auto issue = [&](const TileCursor& c, int stage) {
    if (c.tile < p.grid.num_tiles) {
      // Rebuilt per tile (a few integer ops) rather than kept: the dw warps need the registers.
      const TileLoader dy_loader(dy_stride, kBlockThreads, kNHWC ? Kpad : kTilePixels);
      const TileLoader x_loader(x_stride, kBlockThreads, kNHWC ? Cpad : kTilePixels);
      const TilePos q = tile_pos<kNHWC>(c, p.pixels, rows);
      float* base = stage0 + stage * stage_floats;
      load_tile(dy_loader, SmemTile{base, dy_stride}, tile_source(kNHWC, p.dy, q, p.K, p.pixels, k0, Kt, Kpad),
                p.dy, kVec, policy);
      load_tile(x_loader, SmemTile{base + p.dy_floats, x_stride},
                tile_source(kNHWC, p.x, q, p.C, p.pixels, c0, Ct, Cpad), p.x, kVec, policy);
    }
    cp_async_commit();
  };

  {
    TileCursor c = cursor_at<kNHWC>(blockIdx.x, p.grid);
    for (int s = 0; s < p.stages - 1; ++s) {
      issue(c, s);
      advance<kNHWC>(c, p.grid);
    }
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bool dx_role = kWithDx && warp < 8;
  const int rw = warp & 7;  // the warp's index inside its role
  const bool dw_full = Kpad == kDwRows && Cpad == kDwCols;
  float dw[2][4][4] = {};  // dw warps: this thread's share of the block's dw, summed over its tiles
  int stage = 0;
  for (TileCursor cur = cursor_at<kNHWC>(blockIdx.x, p.grid); cur.tile < p.grid.num_tiles;
       advance<kNHWC>(cur, p.grid)) {
    cp_async_wait_pending(p.stages - 2);
    __syncthreads();
    issue(ahead_of<kNHWC>(cur, p.stages - 1, p.grid), stage == 0 ? p.stages - 1 : stage - 1);
    const float* dy_s = stage0 + stage * stage_floats;
    const float* x_s = dy_s + p.dy_floats;

    if (dx_role) {
      if constexpr (kWithDx) {
        constexpr int kWM = kNHWC ? 4 : 2;
        const int wm = rw % kWM, wn = rw / kWM;
        float acc[2][4][4];
        if (Cpad == kDwCols && (!kNHWC || KS1 % 4 == 0)) {
          dx_tile_mma_full<kNHWC>(acc, res, dy_s, KS1, wm, wn, lane);
        } else {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
          const SmemTile DY{const_cast<float*>(dy_s), dy_stride};
          if (Cpad == kDwCols) dx_tile_mma<kNHWC, false>(acc, res, DY, KS1, Cpad, wm, wn, lane);
          else dx_tile_mma<kNHWC, true>(acc, res, DY, KS1, Cpad, wm, wn, lane);
        }
        const TilePos q = tile_pos<kNHWC>(cur, p.pixels, rows);
        const OutTile o = out_tile(kNHWC, p.dx, q, p.C, p.pixels, 0, Ct, p.vec_dx);
        const int row0 = wm * 2 * 16, col0 = wn * 4 * 8;
        // The dw warps are done with this stage (they meet here after their GEMM); its first 20 KB
        // then serve as the dx warps' scratch for staged stores (the stage is refilled only
        // after the next tile's block barrier): each store instruction writes 4 whole 128-byte
        // lines instead of 8 rows x 32 bytes. Stages smaller than that (few channels) take the
        // general stores.
        named_barrier_sync(kDwDoneBarrier, 2 * kThreads);
        // NCHW: the columns are in RowsKQuads order (both dx GEMMs read dy that way).
        float* scratch = const_cast<float*>(dy_s) + rw * kScratchFloats;
        float* out = o.base + row0 * o.row_stride + col0;
        if (q.pixels == kTilePixels && Ct == kDwCols && p.vec_dx && stage_floats >= 8 * kScratchFloats) {
          if constexpr (kNHWC) store_acc_staged<2, 4, kNoBias>(acc, scratch, out, o.row_stride, lane, nullptr);
          else store_acc_staged_quads<2, kNoBias>(acc, scratch, out, o.row_stride, lane, nullptr);
        } else if constexpr (kNHWC) {
          store_acc(acc, o, row0, col0, g, t, nullptr, nullptr, false);
        } else {
          store_acc_quads(acc, o, row0, col0, g, t, nullptr, false);
        }
      }
    } else {
      // dw block += dy_tile (K side x pixels) * x_tile^T (pixels x C side)
      const int wm = rw % 4, wn = rw / 4;
      float acc[2][4][4];
      if (dw_full) {
        dw_tile_mma_full<kNHWC, kSplit>(acc, dy_s, x_s, wm, wn, lane);
      } else {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
        dw_tile_mma<kNHWC, kSplit, true>(acc, SmemTile{const_cast<float*>(dy_s), dy_stride},
                                         SmemTile{const_cast<float*>(x_s), x_stride}, Kpad, Cpad, wm, wn, lane);
      }
      if constexpr (kWithDx) named_barrier_sync(kDwDoneBarrier, 2 * kThreads);  // this stage's reads are done
      // Flush the tensor-core sum (a chain of 16 steps) into the plain fp32 running sum.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dw[mt][nt][e] += acc[mt][nt][e];
    }
    stage = stage + 1 == p.stages ? 0 : stage + 1;
  }
  cp_async_wait<0>();

  // This block's partial: every (k, c) of its dw block, zeros if it had no tile.
  if (!dx_role) {
    const int wm = rw % 4, wn = rw / 4;
    float* part = p.partial + blockIdx.x * p.K * p.C;
    const bool quads = kNHWC && dw_full;  // dw_tile_mma_full's NHWC order (RowsKQuads)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e >= 2 ? 1 : 0, col = 2 * t + (e & 1);
          const int r = quads ? 32 * wm + 4 * g + 2 * mt + half : (wm * 2 + mt) * 16 + g + 8 * half;
          const int c = quads ? 32 * wn + 4 * col + nt : (wn * 4 + nt) * 8 + col;
          if (r < Kt && c < Ct) part[(k0 + r) * p.C + c0 + c] = dw[mt][nt][e];
        }
  }
}

// The blocks' dw partials are added in block order by sum_partials_kernel (ops/cuda/sum_partials.cuh).

// ---------------------------------------------------------------------------------------------
// Host side

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

struct DeviceLimits {
  int sms = 0;
  int smem_block = 0;  // shared memory per block with opt-in
  int smem_sm = 0;     // shared memory per multiprocessor
  int reserved = 0;    // shared memory the system keeps per block
  // The most dynamic shared memory a block may use for `blocks` blocks to share one SM.
  int smem_for(int blocks) const { return std::min(smem_block, smem_sm / blocks - reserved); }
};
DeviceLimits device_limits(int dev) {
  DeviceLimits l;
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&l.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
  return l;
}

// The most pipeline stages (at most kMaxStages) that fit beside `fixed` bytes.
int stages_that_fit(int smem_limit, int fixed, int stage_bytes) {
  return std::min(kMaxStages, std::max(0, (smem_limit - fixed) / stage_bytes));
}

// Blocks of `kernel` that fit on one multiprocessor with `smem` bytes of dynamic shared memory.
template <class Kernel>
int blocks_per_sm(Kernel kernel, int threads, int smem) {
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int blocks = 0;
  TG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
  TG_CHECK(blocks > 0, "conv1x1: a kernel does not fit on the device with ", smem, " bytes of shared memory");
  return blocks;
}

int64_t tiles_per_image(const ConvShape& s) { return s.channels_last() ? 0 : ceil_div(s.out_volume(), kTilePixels); }
int64_t tile_count(const ConvShape& s) {
  return s.channels_last() ? ceil_div(s.N * s.out_volume(), kTilePixels) : s.N * tiles_per_image(s);
}
// How `grid` blocks walk the tiles of s (block b: tiles b, b + grid, ...).
TileGrid tile_grid(const ConvShape& s, int64_t grid) {
  TG_CHECK(s.N < (int64_t(1) << 31) && tiles_per_image(s) < (int64_t(1) << 31),
           "conv1x1: more than 2^31 images or tiles per image (", s.x_shape(), ")");
  TileGrid t{};
  t.num_tiles = tile_count(s);
  t.tiles_per_image = tiles_per_image(s);
  t.step = grid;
  if (t.tiles_per_image > 0) {
    t.step_n = grid / t.tiles_per_image;
    t.step_rem = grid % t.tiles_per_image;
  }
  return t;
}

template <bool kNHWC, int kWM, int kWN, int kMT, int kNT, int kMode, int kMinBlocks>
void launch_pointwise(PointwiseParams p, const ConvShape& s, int smem, int sms, cudaStream_t st) {
  auto kernel = pointwise_kernel<kNHWC, kWM, kWN, kMT, kNT, kMode, kMinBlocks>;
  const int64_t grid = std::min<int64_t>(tile_count(s), int64_t(sms) * blocks_per_sm(kernel, kThreads, smem));
  p.grid = tile_grid(s, grid);
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, st>>>(p);
  TG_LAUNCH_CHECK();
}

// The warp layouts: 128 output channels with <= 64 reduction channels ("narrow", two blocks
// per SM), or 64 output channels with <= 128 ("wide", one block per SM); both keep the resident
// weight at 32 KB (48 KB split).
template <int kMode>
void launch_pointwise_variant(bool nhwc, bool wide, const PointwiseParams& p, const ConvShape& s, int smem, int sms,
                              cudaStream_t st) {
  if (!nhwc) {
    if (wide) launch_pointwise<false, 2, 4, 2, 4, kMode, 1>(p, s, smem, sms, st);  // 64 ch x 128 px
    else launch_pointwise<false, 2, 4, 4, 4, kMode, 2>(p, s, smem, sms, st);       // 128 ch x 128 px
  } else {
    if (wide) launch_pointwise<true, 4, 2, 2, 4, kMode, 1>(p, s, smem, sms, st);   // 128 px x 64 ch
    else launch_pointwise<true, 4, 2, 2, 8, kMode, 2>(p, s, smem, sms, st);        // 128 px x 128 ch
  }
}

// out (M channels) = A (M x R) in (R channels) at every pixel, A(m, r) = w[m * w_stride_m + r * w_stride_r].
// Reduction groups beyond the first accumulate into out (one launch each, in order).
void run_pointwise(const Tensor& out, const Tensor& in, const Tensor& w, const Tensor& bias, int64_t M, int64_t R,
                   int64_t w_stride_m, int64_t w_stride_r, const ConvShape& s) {
  const int dev = out.device().index;
  set_device(dev);
  const DeviceLimits lim = device_limits(dev);
  const bool nhwc = s.channels_last();
  const bool split = precision() == Precision::FP32;
  const int mode = split ? kSplitPre : kTf32;
  const int64_t P = s.out_volume();
  const PointwiseTmaProblem tma{out.data<float>(), in.data<float>(), w.data<float>(), w_stride_m, w_stride_r,
                                bias.defined() ? bias.data<float>() : nullptr, s.N, P, M, R, !nhwc, split};
  // KernelPolicy::conv1x1.tma = false keeps the product on the kernels below (tests, benchmark).
  if (kernel_policy().conv1x1.tma && pointwise_tma_applies(tma, dev)) {
    pointwise_tma(tma, dev, stream(dev));
    return;
  }
  const bool wide = R > 64;
  const int64_t group = wide ? kGroupChannels : R;
  const int channels = wide ? 64 : 128;

  PointwiseParams p{};
  p.out = out.data<float>();
  p.in = in.data<float>();
  p.images = s.N;
  p.pixels = P;
  p.out_channels = M;
  p.in_channels = R;
  p.vec_in = aligned16(p.in) && (nhwc ? R % 4 == 0 : P % 4 == 0);
  p.vec_out = aligned16(p.out) && (nhwc ? M % 4 == 0 : P % 4 == 0);
  if (tile_count(s) == 0) return;
  for (int64_t r0 = 0; r0 < R; r0 += group) {
    for (int64_t m0 = 0; m0 < M; m0 += channels) {
      const int r_count = static_cast<int>(std::min(group, R - r0));
      const int m_count = static_cast<int>(std::min<int64_t>(channels, M - m0));
      p.r_pad = round_up(r_count, 16);
      p.weight = WeightView{w.data<float>(), w_stride_m, w_stride_r, static_cast<int>(m0), m_count,
                            static_cast<int>(r0), r_count};
      p.bias = (r0 == 0 && bias.defined()) ? bias.data<float>() : nullptr;
      p.accumulate = r0 > 0;
      const int fixed = resident_bytes(channels, p.r_pad, mode) + channels * 4;
      const int tile_bytes = (nhwc ? kTilePixels * pointwise_nhwc_stride(channels) : p.r_pad * kTilePixels) * 4;
      // A stage doubles as the warps' store scratch.
      const int stage_bytes = std::max(tile_bytes, kThreads / 32 * kScratchFloats * 4);
      // Narrow blocks run two per SM where two stages fit twice (always on H100 / H200).
      p.stages = stages_that_fit(lim.smem_for(wide ? 1 : 2), fixed, stage_bytes);
      if (p.stages < 2) p.stages = stages_that_fit(lim.smem_for(1), fixed, stage_bytes);
      TG_CHECK(p.stages >= 2, "conv1x1: not enough shared memory (", lim.smem_block, " bytes) for two stages of ",
               stage_bytes, " bytes");
      p.stage_floats = stage_bytes / 4;
      const int smem = fixed + p.stages * stage_bytes;
      if (split) launch_pointwise_variant<kSplitPre>(nhwc, wide, p, s, smem, lim.sms, stream(dev));
      else launch_pointwise_variant<kTf32>(nhwc, wide, p, s, smem, lim.sms, stream(dev));
    }
  }
}

// The backward kernel for one layout and role set, its mode (split: FP32-accurate) and copy
// width chosen at run time.
template <bool kNHWC, bool kWithDx>
void launch_backward(const BackwardParams& p, bool split, bool vec, int smem, unsigned groups, unsigned blocks_y,
                     cudaStream_t st) {
  auto kernel = split ? (vec ? backward_kernel<kNHWC, kWithDx, kSplitRaw, true>
                             : backward_kernel<kNHWC, kWithDx, kSplitRaw, false>)
                      : (vec ? backward_kernel<kNHWC, kWithDx, kTf32, true>
                             : backward_kernel<kNHWC, kWithDx, kTf32, false>);
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<dim3(groups, blocks_y), kWithDx ? 2 * kThreads : kThreads, smem, st>>>(p);
  TG_LAUNCH_CHECK();
}

// Shared-memory plan of the backward kernel; stages == 0 when it does not fit.
struct BackwardPlan {
  int res_bytes = 0, dy_floats = 0, x_floats = 0, stages = 0, smem = 0;
};
BackwardPlan plan_backward(const ConvShape& s, bool with_dx, int smem_limit) {
  BackwardPlan b;
  const int Kpad = round_up(static_cast<int>(std::min<int64_t>(s.K, kDwRows)), 16);
  const int Cpad = round_up(static_cast<int>(std::min<int64_t>(s.C, kDwCols)), 16);
  b.res_bytes = with_dx ? resident_bytes(kDwCols, Kpad, kSplitRaw) : 0;  // kTf32 is the same size
  // NHWC rows have the fixed strides of backward_kernel; NCHW rows are always 128 pixels.
  b.dy_floats = s.channels_last() ? kTilePixels * kBwdDyStride : Kpad * kTilePixels;
  b.x_floats = s.channels_last() ? kTilePixels * kBwdXStrideNhwc : Cpad * kTilePixels;
  const int stage_bytes = (b.dy_floats + b.x_floats) * 4;
  b.stages = stages_that_fit(smem_limit, b.res_bytes, stage_bytes);
  if (b.stages < 2) b.stages = 0;
  b.smem = b.res_bytes + b.stages * stage_bytes;
  return b;
}

bool fused_backward_fits(const ConvShape& s, int smem_limit) {
  return s.K <= kDwRows && s.C <= kDwCols && plan_backward(s, true, smem_limit).stages >= 2;
}

// dw (and dx when with_dx) from dy and x; with_dx needs fused_backward_fits.
void run_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                  const ConvShape& s, bool with_dx) {
  const int dev = dw.device().index;
  set_device(dev);
  const DeviceLimits lim = device_limits(dev);
  const bool nhwc = s.channels_last();
  const bool split = precision() == Precision::FP32;
  const int64_t K = s.K, C = s.C, P = s.out_volume();
  const int64_t num_tiles = tile_count(s);
  if (num_tiles == 0) {  // no pixels: dw = 0 (and dx is empty)
    TG_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, dw.nbytes(), stream(dev)));
    return;
  }
  const BackwardPlan plan = plan_backward(s, with_dx, lim.smem_block);
  TG_CHECK(plan.stages >= 2, "conv1x1: not enough shared memory (", lim.smem_block, " bytes) for the backward kernel");

  BackwardParams p{};
  p.dx = with_dx ? dx.data<float>() : nullptr;
  p.dy = dy.data<float>();
  p.x = x.data<float>();
  p.w = with_dx ? w.data<float>() : nullptr;
  p.images = s.N;
  p.pixels = P;
  p.K = K;
  p.C = C;
  const int64_t k_blocks = ceil_div(K, kDwRows), c_blocks = ceil_div(C, kDwCols);
  TG_CHECK(k_blocks * c_blocks <= 65535, "conv1x1: weight ", s.w_shape(), " has too many blocks for one grid");
  p.c_blocks = static_cast<int>(c_blocks);
  p.res_bytes = plan.res_bytes;
  p.dy_floats = plan.dy_floats;
  p.x_floats = plan.x_floats;
  p.stages = plan.stages;
  // 16-byte copies need both operands' rows 16-byte aligned (otherwise both take 4-byte copies).
  const bool vec = aligned16(p.dy) && aligned16(p.x) && (nhwc ? K % 4 == 0 && C % 4 == 0 : P % 4 == 0);
  p.vec_dx = with_dx && aligned16(p.dx) && (nhwc ? C % 4 == 0 : P % 4 == 0);

  // One block per SM in all; the pixel tiles are spread over `groups` blocks per dw block.
  int64_t groups = std::max<int64_t>(1, lim.sms / (k_blocks * c_blocks));
  groups = std::min(groups, num_tiles);
  groups = std::min(groups, std::max<int64_t>(1, kPartialBudget / (K * C)));
  p.grid = tile_grid(s, groups);
  Tensor partial = Tensor::empty(Shape{groups, K, C}, {.dtype = DType::f32, .device = dw.device()});
  p.partial = partial.data<float>();

  const unsigned gx = static_cast<unsigned>(groups), gy = static_cast<unsigned>(k_blocks * c_blocks);
  cudaStream_t st = stream(dev);
  if (nhwc) {
    if (with_dx) launch_backward<true, true>(p, split, vec, plan.smem, gx, gy, st);
    else launch_backward<true, false>(p, split, vec, plan.smem, gx, gy, st);
  } else {
    if (with_dx) launch_backward<false, true>(p, split, vec, plan.smem, gx, gy, st);
    else launch_backward<false, false>(p, split, vec, plan.smem, gx, gy, st);
  }
  sum_partials(dw.data<float>(), p.partial, K * C, groups, st);
}

// Launcher-level checks: the shape class, f32, one CUDA device, shapes as the problem says.
void check_args(const char* op, const ConvShape& s, std::initializer_list<std::pair<const Tensor*, Shape>> args) {
  TG_CHECK(conv1x1_applies(s), op, ": not a 1x1, stride-1, unpadded, undilated convolution (weight ", s.w_shape(),
           ")");
  const Tensor& first = *args.begin()->first;
  for (const auto& [t, shape] : args) {
    TG_CHECK(t->dtype() == DType::f32, op, ": expected f32 tensors, got ", describe(*t));
    TG_CHECK(t->device().is_cuda() && t->device() == first.device(), op, ": expected tensors on one CUDA device, got ",
             describe(*t), " and ", describe(first));
    TG_CHECK(t->shape() == shape, op, ": tensor ", describe(*t), " does not match the expected shape ", shape);
  }
}

}  // namespace

bool conv1x1_applies(const ConvShape& s) {
  for (int d = 0; d < 3; ++d)
    if (s.kernel[d] != 1 || s.stride[d] != 1 || s.pad[d] != 0 || s.dilation[d] != 1) return false;
  return s.C >= 1 && s.K >= 1 && s.N >= 0 && !(s.spatial_dims == 3 && s.channels_last());
}

bool conv1x1_applies(const ConvShape& s, DType dtype) { return dtype == DType::f32 && conv1x1_applies(s); }

void conv1x1_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s) {
  if (b.defined())
    check_args("conv1x1_forward", s, {{&y, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}, {&b, Shape{s.K}}});
  else
    check_args("conv1x1_forward", s, {{&y, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}});
  if (y.numel() == 0) return;
  run_pointwise(y, x, w, b, /*M=*/s.K, /*R=*/s.C, /*w_stride_m=*/s.C, /*w_stride_r=*/1, s);
}

void conv1x1_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s) {
  check_args("conv1x1_grad_input", s, {{&dx, s.x_shape()}, {&dy, s.y_shape()}, {&w, s.w_shape()}});
  if (dx.numel() == 0) return;
  run_pointwise(dx, dy, w, Tensor(), /*M=*/s.C, /*R=*/s.K, /*w_stride_m=*/1, /*w_stride_r=*/s.C, s);
}

void conv1x1_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s) {
  check_args("conv1x1_grad_weight", s, {{&dw, s.w_shape()}, {&dy, s.y_shape()}, {&x, s.x_shape()}});
  run_backward(Tensor(), dw, dy, x, Tensor(), s, false);
}

void conv1x1_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const ConvShape& s) {
  if (!dx.defined() && !dw.defined()) return;
  if (dx.defined() && dw.defined()) {
    check_args("conv1x1_backward", s,
               {{&dx, s.x_shape()}, {&dw, s.w_shape()}, {&dy, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}});
    const int dev = dw.device().index;
    set_device(dev);
    if (dx.numel() > 0 && fused_backward_fits(s, device_limits(dev).smem_block)) {
      run_backward(dx, dw, dy, x, w, s, true);
      return;
    }
  }
  if (dx.defined()) conv1x1_grad_input(dx, dy, w, s);
  if (dw.defined()) conv1x1_grad_weight(dw, dy, x, s);
}

namespace {

// The channels-last 1x1 convolution whose pixels are the rows of a matrix: one image of
// 1 x rows pixels, so x (rows, C) and y (rows, K) are its (N, H, W, C) tensors as stored.
ConvShape rows_as_pixels(int64_t rows, int64_t C, int64_t K) {
  ConvShape s;
  s.N = 1;
  s.C = C;
  s.K = K;
  s.in[2] = s.out[2] = rows;
  s.layout = Layout::NHWC;
  return s;
}

// The three matrices of a pointwise product -- (rows, K): y or dy; (rows, C): x or dx;
// (K, C): w or dw -- checked together: 2-D, f32, one CUDA device, sizes that agree.
struct MatrixSizes {
  int64_t rows, C, K;
};
MatrixSizes check_matrices(const char* op, const Tensor& rows_k, const Tensor& rows_c, const Tensor& k_c) {
  for (const Tensor* t : {&rows_k, &rows_c, &k_c}) {
    TG_CHECK(t->dtype() == DType::f32 && t->dim() == 2, op, ": expected 2-D f32 matrices, got ", describe(*t));
    TG_CHECK(t->device().is_cuda() && t->device() == k_c.device(), op, ": expected tensors on one CUDA device, got ",
             describe(*t), " and ", describe(k_c));
  }
  const MatrixSizes m{rows_c.size(0), rows_c.size(1), k_c.size(0)};
  TG_CHECK(k_c.size(1) == m.C && rows_k.shape() == Shape({m.rows, m.K}), op, ": shapes ", rows_k.shape(), " (rows, K), ",
           rows_c.shape(), " (rows, C) and ", k_c.shape(), " (K, C) do not agree");
  return m;
}

}  // namespace

void pointwise_matmul_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const MatrixSizes m = check_matrices("pointwise_matmul_forward", y, x, w);
  TG_CHECK(!b.defined() || (b.dtype() == DType::f32 && b.device() == y.device() && b.shape() == Shape({m.K})),
           "pointwise_matmul_forward: bias ", describe(b), " does not match ", m.K, " f32 outputs on ", y.device().str());
  TG_CHECK(m.C >= 1, "pointwise_matmul_forward: x ", x.shape(), " has no columns to reduce over");
  if (y.numel() == 0) return;
  run_pointwise(y, x, w, b, /*M=*/m.K, /*R=*/m.C, /*w_stride_m=*/m.C, /*w_stride_r=*/1, rows_as_pixels(m.rows, m.C, m.K));
}

void pointwise_matmul_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  const MatrixSizes m = check_matrices("pointwise_matmul_grad_input", dy, dx, w);
  TG_CHECK(m.K >= 1, "pointwise_matmul_grad_input: dy ", dy.shape(), " has no columns to reduce over");
  if (dx.numel() == 0) return;
  run_pointwise(dx, dy, w, Tensor(), /*M=*/m.C, /*R=*/m.K, /*w_stride_m=*/1, /*w_stride_r=*/m.C,
                rows_as_pixels(m.rows, m.C, m.K));
}

void pointwise_matmul_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x) {
  const MatrixSizes m = check_matrices("pointwise_matmul_grad_weight", dy, x, dw);
  if (dw.numel() == 0) return;
  run_backward(Tensor(), dw, dy, x, Tensor(), rows_as_pixels(m.rows, m.C, m.K), false);
}

void pointwise_matmul_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w) {
  const MatrixSizes m = check_matrices("pointwise_matmul_backward", dy, x, w);
  check_matrices("pointwise_matmul_backward", dy, dx, dw);
  TG_CHECK(m.K >= 1, "pointwise_matmul_backward: dy ", dy.shape(), " has no columns to reduce over");
  const ConvShape s = rows_as_pixels(m.rows, m.C, m.K);
  // conv1x1_backward's own tensors are the 4-D NHWC views of the same storage (detached: a
  // kernel call records nothing on the tape).
  auto as = [](const Tensor& t, const Shape& shape) { return t.detach().reshape(shape); };
  conv1x1_backward(as(dx, s.x_shape()), as(dw, s.w_shape()), as(dy, s.y_shape()), as(x, s.x_shape()),
                   as(w, s.w_shape()), s);
}

}  // namespace tg::cuda
