// Device building blocks of the 1x1 mma.sync kernels (conv1x1/fprop_sm80.cu, conv1x1/backward_sm80.cu):
// the tile and pipeline constants, the m16n8k8 TF32 fragments (and the bf16 cross terms of the
// FP32-accurate mode), the swizzled activation tiles in shared memory with their cp.async loads,
// and the resident weight in fragment order. Design and precision contract: docs/kernels/conv1x1.md.
//
// - Tiles carry an XOR swizzle of 16-byte chunks: every fragment pattern is conflict-free
//   without padding; activations arrive by 16-byte cp.async (L2 evict-first, zero-fill at edges;
//   4-byte copies for unaligned rows).
// - The weight (<= 128 x 128 per launch) stays resident in fragment order, k-step major; FP32
//   keeps tf32 hi words plus rounded bf16 lo pairs (the fused backward keeps raw f32 w^T).
// - NCHW B fragments use the RowsKQuads column permutation (one LDS.128 serves 4 n-tiles);
//   accumulator columns are permuted the same way.
#pragma once
#include <cstdint>
#include <type_traits>

#include "../arch/cp_async.cuh"
#include "../arch/mma_sync.cuh"
#include "../arch/named_barrier.cuh"
#include "../arch/shared_memory.cuh"
#include "../arch/tf32.cuh"

namespace tg::cuda::conv1x1_detail {

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
__device__ inline void load_tile(const TileLoader& ld, const SmemTile& dst, const TileSource& s,
                                 const float* any_valid, bool vec, uint64_t policy) {
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

}  // namespace tg::cuda::conv1x1_detail
