// CPU reference kernels of the basic ops: elementwise, reductions, permute, cast.
// Threads split the output elements (ops/cpu/parallel.h); a sum's elements are summed by one
// thread each, and a sum to a single value adds fixed chunks in order (chunked_sum).
#include <cstring>

#include "ops/broadcast.h"
#include "core/dtype_dispatch.h"
#include "core/half.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/kernels.h"
#include "ops/reduce_index.h"

namespace tg::cpu {

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch_floating("binary", a.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    const int64_t n = out.numel();
    auto apply = [op](T x, T y) {
      switch (op) {
        case BinaryOp::add: return x + y;
        case BinaryOp::sub: return x - y;
        case BinaryOp::mul: return x * y;
        default: return x / y;
      }
    };
    if (a.shape() == out.shape() && b.shape() == out.shape()) {
      parallel_ranges(n, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) po[i] = apply(pa[i], pb[i]);
      });
      return;
    }
    BroadcastIndex ix = make_broadcast_index(out.shape(), a.shape(), b.shape());
    parallel_ranges(n, 4, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        int64_t ia, ib;
        ix.offsets(i, ia, ib);
        po[i] = apply(pa[ia], pb[ib]);
      }
    });
  });
}

void affine(const Tensor& out, const Tensor& a, double scale, double shift) {
  dispatch_floating("affine", a.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* pa = a.data<T>();
    T* po = out.data<T>();
    const T s = static_cast<T>(scale), h = static_cast<T>(shift);
    parallel_ranges(a.numel(), 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) po[i] = pa[i] * s + h;
    });
  });
}

void relu(const Tensor& out, const Tensor& x) {
  dispatch_floating("relu", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    parallel_ranges(x.numel(), 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) po[i] = px[i] > T(0) ? px[i] : T(0);
    });
  });
}

void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  dispatch_floating("relu_backward", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* px = x.data<T>();
    const T* pg = dy.data<T>();
    T* po = dx.data<T>();
    parallel_ranges(x.numel(), 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) po[i] = px[i] > T(0) ? pg[i] : T(0);
    });
  });
}

void sum(const Tensor& out, const Tensor& x, const ReduceIndex& ix) {
  dispatch_floating("sum", x.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    // f32 sums accumulate in double: the reference must be the accurate one.
    auto partial = [&](const T* base, int64_t r0, int64_t r1) {
      double acc = 0;
      if (ix.red_rank == 1 && ix.red_strides[0] == 1) {
        for (int64_t r = r0; r < r1; ++r) acc += base[r];
      } else {
        for (int64_t r = r0; r < r1; ++r) acc += base[ix.red_offset(r)];
      }
      return acc;
    };
    if (ix.out_count == 1) {  // one total: fixed chunks, added in order
      const T* base = px + ix.out_base(0);
      po[0] = static_cast<T>(chunked_sum(ix.red_count, 1, [&](int64_t r0, int64_t r1) { return partial(base, r0, r1); }));
      return;
    }
    parallel_for(ix.out_count, ix.red_count, [&](int64_t o) {
      po[o] = static_cast<T>(partial(px + ix.out_base(o), 0, ix.red_count));
    });
  });
}

void permute(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims) {
  const int rank = static_cast<int>(x.dim());
  auto in_strides = contiguous_strides(x.shape());
  // Output element i (row-major over out's shape) reads input at sum(c_d * in_stride[dims[d]]).
  int64_t sizes[kMaxDims], strides[kMaxDims];
  for (int d = 0; d < rank; ++d) {
    sizes[d] = out.size(d);
    strides[d] = in_strides[dims[d]];
  }
  const std::size_t elem = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  parallel_ranges(x.numel(), 4, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t off = ReduceIndex::unravel(i, rank, sizes, strides);
      std::memcpy(dst + i * elem, src + off * elem, elem);
    }
  });
}

namespace {

// f32 / f64 -> i64: truncated toward zero where the value has an i64; a NaN, an infinity or a
// value past i64's range is a DTypeError, as for the half types (ops/cpu/cast_half.cpp).
template <class S>
void floating_to_i64(const Tensor& out, const Tensor& x) {
  const S* ps = static_cast<const S*>(x.raw_data());
  int64_t* pd = out.data<int64_t>();
  constexpr S kLimit = static_cast<S>(9223372036854775808.0);  // 2^63, exact in both types
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    const S v = ps[i];
    TG_CHECK_AS(DTypeError, v >= -kLimit && v < kLimit, "Tensor::to(i64): element ", i, " of ", describe(x),
                " is ", v, ", which has no i64 value");
    pd[i] = static_cast<int64_t>(v);
  }
}

}  // namespace

void cast(const Tensor& out, const Tensor& x) {
  if (is_half(x.dtype()) || is_half(out.dtype())) return cast_half(out, x);
  if (out.dtype() == DType::i64 && x.dtype() == DType::f32) return floating_to_i64<float>(out, x);
  if (out.dtype() == DType::i64 && x.dtype() == DType::f64) return floating_to_i64<double>(out, x);
  dispatch_any(x.dtype(), [&](auto* stag) {
    using S = TG_ELEMENT_TYPE(stag);
    const S* ps = static_cast<const S*>(x.raw_data());
    dispatch_any(out.dtype(), [&](auto* dtag) {
      using D = TG_ELEMENT_TYPE(dtag);
      D* pd = static_cast<D*>(out.raw_data());
      parallel_ranges(x.numel(), 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) pd[i] = convert_value<D>(ps[i]);  // as the GPU's (core/half.h)
      });
    });
  });
}

}  // namespace tg::cpu
