// CPU convolution: vol2col (im2col for 2-D, which is the D = 1 case) + Eigen GEMM, one
// sample and one chunk of output positions at a time, so the column buffer stays small
// (in cache) whatever the problem size.
//
// Column matrix of a chunk of output positions p0 .. p0+len-1 of one sample:
//   col (C*kvol, len), row r = c*kvol + kk, where kk = (a*KH + i)*KW + j is the tap (a, i, j)
//   of the kernel window in the order of the weight's trailing dims, so W viewed as (K, C*kvol)
//   multiplies it directly:  y_chunk (K, len) = W (K, C*kvol) * col (C*kvol, len).
// Both layouts use the same col; only the gather (strides of x) and the view of y differ.
//
// Threads (ops/cpu/parallel.h): forward splits the (sample, chunk) pairs, grad-input the
// samples (a sample's chunks add into overlapping windows of dx, in chunk order), grad-bias
// the channels. Grad-weight sums over every pair: the pairs are cut into at most
// kFixedGroups consecutive groups (a count fixed by the problem), each group's partial sum
// is a GEMM accumulation of its own, and the partials are added in group order. Chunks are
// sized by the problem alone, so every GEMM, and every result, is the same for any threads.
#include "ops/cpu/conv.h"

#include <Eigen/Dense>
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"

namespace tg::cpu {
namespace {

template <class T> using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T> using ColMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

// Elements of the column buffer per chunk: about 1 MiB of f32, so a chunk stays in L2.
constexpr int64_t kColumnBudget = int64_t(1) << 18;

// Where one sample's element (channel c, spatial offset q) lives: c*channel_stride +
// q*position_stride. NCDHW: (V, 1); channels-last: (1, channels).
struct SampleStrides {
  int64_t channel, position;
};
SampleStrides strides_of(const ConvShape& s, int64_t channels, int64_t volume) {
  return s.channels_last() ? SampleStrides{1, channels} : SampleStrides{volume, 1};
}

// A chunk of output positions split into runs along W (constant od, oh), so that for each
// kernel tap the in-bounds part of a run is one contiguous range found with two divisions,
// and the inner loop is a strided copy with no per-element bounds checks.
struct ChunkGeometry {
  struct Run {
    int64_t j0;        // column of the run's first position within the chunk
    int64_t od, oh;    // output depth and row of the run
    int64_t ow0, ow1;  // output columns [ow0, ow1)
  };
  std::vector<Run> runs;

  ChunkGeometry(const ConvShape& s, int64_t p0, int64_t len) {
    const int64_t oW = s.out[2], oH = s.out[1];
    for (int64_t p = p0; p < p0 + len;) {
      const int64_t ow0 = p % oW, row = p / oW;
      const int64_t n = std::min(oW - ow0, p0 + len - p);
      runs.push_back({p - p0, row / oH, row % oH, ow0, ow0 + n});
      p += n;
    }
  }
};

// Output columns ow whose input column ow*stride - pad + tap lies in [0, W). Both bounds fit
// (tap < padded input size, W + pad <= padded input size); the rounding up divides first, since
// first + stride - 1 overflows for a stride near INT64_MAX.
void valid_columns(int64_t W, int64_t stride, int64_t pad, int64_t tap, int64_t& lo, int64_t& hi) {
  const int64_t first = pad - tap;              // ow*stride >= first
  const int64_t last = W - 1 + pad - tap;       // ow*stride <= last
  lo = first <= 0 ? 0 : first / stride + (first % stride != 0);
  hi = last < 0 ? 0 : last / stride + 1;
}

// Calls `visit(col_index, x_index)` for every column element of the chunk that reads a real
// input element (padding positions are skipped). x_index is relative to the sample.
template <class Visit>
void for_each_tap(const ConvShape& s, const ChunkGeometry& g, int64_t len, Visit&& visit) {
  const SampleStrides xs = strides_of(s, s.C, s.in_volume());
  const int64_t D = s.in[0], H = s.in[1], W = s.in[2];
  int64_t kk = 0;  // tap index, in the weight's (kd, kh, kw) order
  for (int64_t kd = 0; kd < s.kernel[0]; ++kd)
    for (int64_t kh = 0; kh < s.kernel[1]; ++kh)
      for (int64_t kw = 0; kw < s.kernel[2]; ++kw, ++kk) {
        int64_t lo, hi;
        valid_columns(W, s.stride[2], s.pad[2], kw * s.dilation[2], lo, hi);
        for (const ChunkGeometry::Run& r : g.runs) {
          const int64_t id = r.od * s.stride[0] - s.pad[0] + kd * s.dilation[0];
          const int64_t ih = r.oh * s.stride[1] - s.pad[1] + kh * s.dilation[1];
          if (id < 0 || id >= D || ih < 0 || ih >= H) continue;
          const int64_t a = std::max(lo, r.ow0), b = std::min(hi, r.ow1);
          // Only columns a < b are real outputs, whose input column fits; lo alone may lie past
          // the output (a window of padding only), where a * stride overflows.
          if (a >= b) continue;
          const int64_t iw0 = a * s.stride[2] - s.pad[2] + kw * s.dilation[2];
          // Two columns in the run mean stride <= W - 1, so stride * position stays inside x;
          // a single column takes no step (stride * channels may overflow for channels-last).
          const int64_t x_step = b - a > 1 ? s.stride[2] * xs.position : 0;
          for (int64_t c = 0; c < s.C; ++c) {
            const int64_t col = (c * s.kernel_volume() + kk) * len + r.j0 - r.ow0;
            const int64_t xi = c * xs.channel + ((id * H + ih) * W + iw0) * xs.position;
            // Offsets from the run's first column: no step past the last one.
            for (int64_t ow = a; ow < b; ++ow) visit(col + ow, xi + (ow - a) * x_step);
          }
        }
      }
}

template <class T>
void im2col(T* col, const T* xn, const ConvShape& s, const ChunkGeometry& g, int64_t len) {
  std::fill(col, col + s.C * s.kernel_volume() * len, T(0));  // padding reads as zero
  for_each_tap(s, g, len, [&](int64_t ci, int64_t xi) { col[ci] = xn[xi]; });
}

template <class T>
void col2im_add(T* dxn, const T* col, const ConvShape& s, const ChunkGeometry& g, int64_t len) {
  for_each_tap(s, g, len, [&](int64_t ci, int64_t xi) { dxn[xi] += col[ci]; });
}

// Calls f(y_chunk) with y's chunk of sample n viewed as a (K, len) matrix: row-major with
// row stride P for NCDHW, column-major with column stride K for channels-last.
template <class T, class F>
void with_output_chunk(T* yn, const ConvShape& s, int64_t p0, int64_t len, F&& f) {
  using Plain = std::remove_const_t<T>;
  if (s.channels_last()) {
    using Mat = std::conditional_t<std::is_const_v<T>, const ColMat<Plain>, ColMat<Plain>>;
    Eigen::Map<Mat, 0, Eigen::OuterStride<>> m(yn + p0 * s.K, s.K, len, Eigen::OuterStride<>(s.K));
    f(m);
  } else {
    using Mat = std::conditional_t<std::is_const_v<T>, const RowMat<Plain>, RowMat<Plain>>;
    Eigen::Map<Mat, 0, Eigen::OuterStride<>> m(yn + p0, s.K, len, Eigen::OuterStride<>(s.out_volume()));
    f(m);
  }
}

// Output positions per chunk: as many as the column budget allows, at least one.
int64_t chunk_length(const ConvShape& s) {
  return std::clamp<int64_t>(kColumnBudget / std::max<int64_t>(1, s.C * s.kernel_volume()), 1, s.out_volume());
}

int64_t column_buffer_size(const ConvShape& s) { return s.C * s.kernel_volume() * chunk_length(s); }

// The (sample, chunk) pairs in order: pair i is chunk i % chunks of sample i / chunks.
struct ChunkGrid {
  int64_t P, chunk, chunks, pairs;
  explicit ChunkGrid(const ConvShape& s)
      : P(s.out_volume()), chunk(chunk_length(s)), chunks((P + chunk - 1) / chunk), pairs(s.N * chunks) {}
  // Runs body(n, p0, len, geometry) for pairs [begin, end).
  template <class Body>
  void run(const ConvShape& s, int64_t begin, int64_t end, Body&& body) const {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = i / chunks, p0 = (i % chunks) * chunk, len = std::min(chunk, P - p0);
      body(n, p0, len, ChunkGeometry(s, p0, len));
    }
  }
};

// a * b for cost hints, saturating at INT64_MAX: an empty batch (N = 0) admits output volumes
// near INT64_MAX that allocate nothing, so products of counts need not fit.
int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

// Multiply-adds of one chunk's GEMM: the cost hint for the thread count.
int64_t chunk_cost(const ConvShape& s, const ChunkGrid& grid) {
  return saturating_mul(std::max<int64_t>(1, s.K * s.C * s.kernel_volume()), grid.chunk);
}

template <class T>
void forward_impl(T* y, const T* x, const T* w, const T* b, const ConvShape& s) {
  const int64_t CK = s.C * s.kernel_volume();
  Eigen::Map<const RowMat<T>> wmat(w, s.K, CK);  // (K, C*kvol)
  const ChunkGrid grid(s);
  parallel_ranges(grid.pairs, chunk_cost(s, grid), [&](int64_t begin, int64_t end) {
    std::vector<T> col(static_cast<size_t>(column_buffer_size(s)));  // this thread's
    grid.run(s, begin, end, [&](int64_t n, int64_t p0, int64_t len, const ChunkGeometry& g) {
      im2col(col.data(), x + n * s.C * s.in_volume(), s, g, len);
      Eigen::Map<const RowMat<T>> cmat(col.data(), CK, len);
      with_output_chunk(y + n * s.K * s.out_volume(), s, p0, len, [&](auto& ymat) {
        ymat.noalias() = wmat * cmat;
        if (b) ymat.colwise() += Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>(b, s.K);
      });
    });
  });
}

template <class T>
void grad_input_impl(T* dx, const T* dy, const T* w, const ConvShape& s) {
  const int64_t CK = s.C * s.kernel_volume();
  Eigen::Map<const RowMat<T>> wmat(w, s.K, CK);
  const ChunkGrid grid(s);
  parallel_ranges(s.N, saturating_mul(grid.chunks, chunk_cost(s, grid)), [&](int64_t n0, int64_t n1) {
    T* dx0 = dx + n0 * s.C * s.in_volume();
    std::fill(dx0, dx0 + (n1 - n0) * s.C * s.in_volume(), T(0));  // overlapping windows accumulate
    std::vector<T> col(static_cast<size_t>(column_buffer_size(s)));
    grid.run(s, n0 * grid.chunks, n1 * grid.chunks, [&](int64_t n, int64_t p0, int64_t len, const ChunkGeometry& g) {
      Eigen::Map<RowMat<T>> cmat(col.data(), CK, len);
      with_output_chunk(dy + n * s.K * s.out_volume(), s, p0, len,
                        [&](auto& dymat) { cmat.noalias() = wmat.transpose() * dymat; });
      col2im_add(dx + n * s.C * s.in_volume(), col.data(), s, g, len);
    });
  });
}

template <class T>
void grad_weight_impl(T* dw, const T* dy, const T* x, const ConvShape& s) {
  const int64_t CK = s.C * s.kernel_volume(), wsize = s.K * CK;
  const ChunkGrid grid(s);
  // Group q sums pairs [q * pairs / groups, (q + 1) * pairs / groups) into its own buffer
  // (group 0 into dw itself).
  const int64_t groups = std::min(kFixedGroups, std::max<int64_t>(grid.pairs, 1));
  std::vector<T> partial(static_cast<size_t>((groups - 1) * wsize));
  auto group_out = [&](int64_t q) { return q == 0 ? dw : partial.data() + (q - 1) * wsize; };
  const int64_t per_group = saturating_mul((grid.pairs + groups - 1) / groups, chunk_cost(s, grid));
  parallel_ranges(groups, per_group, [&](int64_t q0, int64_t q1) {
    std::vector<T> col(static_cast<size_t>(column_buffer_size(s)));
    for (int64_t q = q0; q < q1; ++q) {
      Eigen::Map<RowMat<T>> dwmat(group_out(q), s.K, CK);
      dwmat.setZero();
      grid.run(s, q * grid.pairs / groups, (q + 1) * grid.pairs / groups,
               [&](int64_t n, int64_t p0, int64_t len, const ChunkGeometry& g) {
                 im2col(col.data(), x + n * s.C * s.in_volume(), s, g, len);
                 Eigen::Map<const RowMat<T>> cmat(col.data(), CK, len);
                 with_output_chunk(dy + n * s.K * s.out_volume(), s, p0, len,
                                   [&](auto& dymat) { dwmat.noalias() += dymat * cmat.transpose(); });
               });
    }
  });
  // dw = ((g0 + g1) + g2) + ...: each element adds the groups in order.
  parallel_ranges(wsize, groups, [&](int64_t i0, int64_t i1) {
    for (int64_t q = 1; q < groups; ++q) {
      const T* pq = group_out(q);
      for (int64_t i = i0; i < i1; ++i) dw[i] += pq[i];
    }
  });
}

template <class T>
void grad_bias_impl(T* db, const T* dy, const ConvShape& s) {
  const int64_t P = s.out_volume();
  const SampleStrides ys = strides_of(s, s.K, P);
  parallel_for(s.K, s.N * P, [&](int64_t k) {
    double acc = 0;  // the reference sums in double, like tg::cpu::sum
    for (int64_t n = 0; n < s.N; ++n) {
      const T* dyn = dy + n * s.K * P + k * ys.channel;
      for (int64_t p = 0; p < P; ++p) acc += dyn[p * ys.position];
    }
    db[k] = static_cast<T>(acc);
  });
}

}  // namespace

void conv_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s) {
  dispatch_floating("conv_forward", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    forward_impl<T>(y.data<T>(), x.data<T>(), w.data<T>(), b.defined() ? b.data<T>() : nullptr, s);
  });
}

void conv_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s) {
  dispatch_floating("conv_grad_input", dy.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    grad_input_impl<T>(dx.data<T>(), dy.data<T>(), w.data<T>(), s);
  });
}

void conv_grad_input_weight(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                            const ConvShape& s) {
  conv_grad_input(dx, dy, w, s);
  conv_grad_weight(dw, dy, x, s);
}

void conv_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s) {
  dispatch_floating("conv_grad_weight", dy.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    grad_weight_impl<T>(dw.data<T>(), dy.data<T>(), x.data<T>(), s);
  });
}

void conv_grad_bias(const Tensor& db, const Tensor& dy, const ConvShape& s) {
  dispatch_floating("conv_grad_bias", dy.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    grad_bias_impl<T>(db.data<T>(), dy.data<T>(), s);
  });
}

}  // namespace tg::cpu
