// The GPU side of the core: fills and random fills, casts between every pair of dtypes (the
// element rules of core/half.h, the functions the CPU casts call), gradient accumulation and
// copies between devices.
#include "core/cuda_context.h"
#include "core/cuda_graph.h"
#include "core/dtype_dispatch.h"
#include "core/half.h"
#include "core/tensor_kernels.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

// dispatch_any, plus the half types as their uint16_t bit patterns (the kernels below take
// a bf16 flag to tell the two apart and convert with core/half.h, as the CPU does).
template <class F>
void dispatch_stored(DType t, F&& f) {
  if (is_half(t)) f(static_cast<uint16_t*>(nullptr));
  else dispatch_any(t, f);
}

// A drawn f64 value stored as T: a half type rounds it once, like the CPU factories.
template <class T>
__device__ __forceinline__ T store_draw(double v, bool bf16) {
  if constexpr (std::is_same_v<T, uint16_t>) return encode_half(bf16, v);
  else return static_cast<T>(v);
}

template <class T>
__global__ void fill_kernel(T* out, int64_t n, T value) {
  TG_GRID_STRIDE(i, n)
    out[i] = value;
}

template <class T>
__global__ void uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, double low, double high, bool bf16) {
  TG_GRID_STRIDE(i, n)
    out[i] = store_draw<T>(scaled_draw(low, high - low, uniform_at(seed, offset + i)), bf16);
}

template <class T>
__global__ void normal_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, double mean, double stddev,
                              bool bf16) {
  TG_GRID_STRIDE(i, n)
    out[i] = store_draw<T>(scaled_draw(mean, stddev, normal_at(seed, offset + i)), bf16);
}

template <class T>
__global__ void add_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  TG_GRID_STRIDE(i, n)
    out[i] = a[i] + b[i];
}

// The sum of two half tensors as the CPU's gradient accumulation: the f32 sum of the exact
// values, rounded once. (A NaN sum is the GPU's canonical NaN; the CPU keeps an operand's payload.)
__global__ void add_half_kernel(uint16_t* __restrict__ out, const uint16_t* __restrict__ a,
                                const uint16_t* __restrict__ b, int64_t n, bool bf16) {
  TG_GRID_STRIDE(i, n)
    out[i] = to_half(bf16, from_half<float>(bf16, a[i]) + from_half<float>(bf16, b[i]));
}

// The casts: the element rules of core/half.h, the same functions the CPU casts call.
template <class S, class D>
__global__ void cast_kernel(const S* in, D* out, int64_t n) {
  TG_GRID_STRIDE(i, n)
    out[i] = convert_value<D>(in[i]);
}

template <class S>
__global__ void to_half_kernel(const S* in, uint16_t* out, int64_t n, bool bf16) {
  TG_GRID_STRIDE(i, n)
    out[i] = to_half(bf16, in[i]);
}

template <class D>
__global__ void from_half_kernel(const uint16_t* in, D* out, int64_t n, bool bf16) {
  TG_GRID_STRIDE(i, n)
    out[i] = from_half<D>(bf16, in[i]);
}

// The f32 <-> half casts four elements per step (16-byte f32 and 8-byte half accesses: a quarter
// of the instructions, four times the bytes in flight per thread); the same element functions.
// Element 4 i + k sits in bits 16 (k % 2).. of word k / 2 (little-endian).
__global__ void f32_to_half4_kernel(const float4* __restrict__ in, uint2* __restrict__ out, int64_t quads, bool bf16) {
  TG_GRID_STRIDE(i, quads) {
    const float4 v = in[i];
    out[i] = make_uint2(uint32_t(to_half(bf16, v.x)) | (uint32_t(to_half(bf16, v.y)) << 16),
                        uint32_t(to_half(bf16, v.z)) | (uint32_t(to_half(bf16, v.w)) << 16));
  }
}

__global__ void half4_to_f32_kernel(const uint2* __restrict__ in, float4* __restrict__ out, int64_t quads, bool bf16) {
  TG_GRID_STRIDE(i, quads) {
    const uint2 v = in[i];
    out[i] = make_float4(from_half<float>(bf16, uint16_t(v.x & 0xffffu)), from_half<float>(bf16, uint16_t(v.x >> 16)),
                         from_half<float>(bf16, uint16_t(v.y & 0xffffu)), from_half<float>(bf16, uint16_t(v.y >> 16)));
  }
}

// f32 <-> half through the four-element kernels where both buffers allow it (f32 16-byte and
// half 8-byte aligned: every tensor's own buffer, as tensors have no storage offset), the last
// n % 4 elements by the scalar ones. Returns false (nothing launched) where the alignment does
// not hold, and the caller takes the scalar kernels.
bool cast_f32_half4(const void* in, void* out, int64_t n, bool to_half_type, bool bf16, cudaStream_t st) {
  const auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  const void* f32 = to_half_type ? in : out;
  const void* half = to_half_type ? out : in;
  if (!aligned(f32, 16) || !aligned(half, 8)) return false;
  const int64_t quads = n / 4, done = quads * 4;
  if (quads > 0) {
    const unsigned grid = grid_for(quads, kThreads);
    if (to_half_type)
      f32_to_half4_kernel<<<grid, kThreads, 0, st>>>(static_cast<const float4*>(in), static_cast<uint2*>(out), quads, bf16);
    else
      half4_to_f32_kernel<<<grid, kThreads, 0, st>>>(static_cast<const uint2*>(in), static_cast<float4*>(out), quads, bf16);
  }
  if (done < n) {
    if (to_half_type)
      to_half_kernel<float><<<1, kThreads, 0, st>>>(static_cast<const float*>(in) + done,
                                                    static_cast<uint16_t*>(out) + done, n - done, bf16);
    else
      from_half_kernel<float><<<1, kThreads, 0, st>>>(static_cast<const uint16_t*>(in) + done,
                                                      static_cast<float*>(out) + done, n - done, bf16);
  }
  return true;
}

__global__ void half_to_half_kernel(const uint16_t* in, uint16_t* out, int64_t n, bool from_bf16, bool to_bf16) {
  TG_GRID_STRIDE(i, n)
    out[i] = to_half(to_bf16, from_half<float>(from_bf16, in[i]));
}

// Truncated toward zero where the value has an i64 (as the CPU's cast); elsewhere 0, and the
// lowest such index in *first_bad (which starts at all ones) for the host's error.
__global__ void half_to_i64_kernel(const uint16_t* in, int64_t* out, int64_t n, bool bf16,
                                   unsigned long long* first_bad) {
  constexpr float kLimit = 9223372036854775808.0f;  // [-2^63, 2^63): every float in it truncates to an i64
  TG_GRID_STRIDE(i, n) {
    const float v = from_half<float>(bf16, in[i]);
    if (v >= -kLimit && v < kLimit) {
      out[i] = static_cast<int64_t>(v);
    } else {
      out[i] = 0;
      atomicMin(first_bad, static_cast<unsigned long long>(i));
    }
  }
}

// Half to i64, with the CPU's DTypeError for an element without an i64 value (NaN, +-inf,
// out of range). The host must see the check's result before it returns, so this waits for
// the GPU and cannot be captured into a CUDA graph.
void half_to_i64(const Tensor& out, const Tensor& x) {
  const int dev = x.device().index;
  fail_if_capturing("Tensor::to(i64) from a half type", dev, "it checks the values on the host");
  const int64_t n = x.numel();
  const Tensor flag = Tensor::empty({1}, {.dtype = DType::i64, .device = x.device()});
  set_device(dev);
  TG_CUDA_CHECK(cudaMemsetAsync(flag.raw_data(), 0xff, sizeof(int64_t), stream(dev)));
  half_to_i64_kernel<<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(
      static_cast<const uint16_t*>(x.raw_data()), out.data<int64_t>(), n, x.dtype() == DType::bf16,
      static_cast<unsigned long long*>(flag.raw_data()));
  TG_LAUNCH_CHECK();
  uint64_t first_bad = 0;
  cuda::copy_bytes(&first_bad, Device::cpu(), flag.raw_data(), x.device(), sizeof first_bad);
  if (first_bad == ~uint64_t{0}) return;
  uint16_t bits = 0;
  cuda::copy_bytes(&bits, Device::cpu(), static_cast<const uint16_t*>(x.raw_data()) + first_bad, x.device(),
                   sizeof bits);
  TG_FAIL_AS(DTypeError, "Tensor::to(i64): element ", first_bad, " of ", describe(x), " is ",
             decode_half(x.dtype(), bits), ", which has no i64 value");
}

void cast_half(const Tensor& out, const Tensor& x) {
  const int64_t n = x.numel();
  const int dev = x.device().index;
  const unsigned grid = grid_for(n, kThreads);
  cudaStream_t st = stream(dev);
  const bool in_bf16 = x.dtype() == DType::bf16, out_bf16 = out.dtype() == DType::bf16;
  const uint16_t* in_half = static_cast<const uint16_t*>(x.raw_data());
  uint16_t* out_half = static_cast<uint16_t*>(out.raw_data());
  // f32 <-> half: four elements per step where the buffers' alignment allows.
  const bool half_out = is_half(out.dtype());
  if (is_half(x.dtype()) != half_out && (half_out ? x.dtype() : out.dtype()) == DType::f32 &&
      cast_f32_half4(x.raw_data(), out.raw_data(), n, half_out, half_out ? out_bf16 : in_bf16, st)) {
    TG_LAUNCH_CHECK();
    return;
  }
  if (is_half(x.dtype()) && is_half(out.dtype())) {
    half_to_half_kernel<<<grid, kThreads, 0, st>>>(in_half, out_half, n, in_bf16, out_bf16);
  } else if (is_half(out.dtype())) {
    dispatch_any("Tensor::to", x.dtype(), [&](auto* tag) {
      using S = TG_ELEMENT_TYPE(tag);
      to_half_kernel<S><<<grid, kThreads, 0, st>>>(x.data<S>(), out_half, n, out_bf16);
    });
  } else if (out.dtype() == DType::i64) {
    return half_to_i64(out, x);
  } else {
    dispatch_floating("Tensor::to", out.dtype(), [&](auto* tag) {
      using D = TG_ELEMENT_TYPE(tag);
      from_half_kernel<D><<<grid, kThreads, 0, st>>>(in_half, out.data<D>(), n, in_bf16);
    });
  }
  TG_LAUNCH_CHECK();
}

}  // namespace

void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  set_device(dev);
  if (is_half(out.dtype())) {
    add_half_kernel<<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(
        static_cast<uint16_t*>(out.raw_data()), static_cast<const uint16_t*>(a.raw_data()),
        static_cast<const uint16_t*>(b.raw_data()), n, out.dtype() == DType::bf16);
  } else {
    dispatch_any(out.dtype(), [&](auto* tag) {
      using T = TG_ELEMENT_TYPE(tag);
      add_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(out.data<T>(), a.data<T>(), b.data<T>(), n);
    });
  }
  TG_LAUNCH_CHECK();
}

void fill(const Tensor& t, double value) {
  int64_t n = t.numel();
  if (n == 0) return;
  set_device(t.device().index);
  dispatch_stored(t.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    // The value converted once on the host (core/half.h for the half types).
    T v;
    if constexpr (std::is_same_v<T, uint16_t>) v = encode_half(t.dtype(), value);
    else v = static_cast<T>(value);
    fill_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(t.device().index)>>>(
        static_cast<T*>(t.raw_data()), n, v);
  });
  TG_LAUNCH_CHECK();
}

void fill_uniform(const Tensor& t, RandomDraw draw, double low, double high) {
  int64_t n = t.numel();
  if (n == 0) return;
  set_device(t.device().index);
  dispatch_stored(t.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    uniform_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(t.device().index)>>>(
        static_cast<T*>(t.raw_data()), n, draw.seed, draw.offset, low, high, t.dtype() == DType::bf16);
  });
  TG_LAUNCH_CHECK();
}

void fill_normal(const Tensor& t, RandomDraw draw, double mean, double stddev) {
  int64_t n = t.numel();
  if (n == 0) return;
  set_device(t.device().index);
  dispatch_stored(t.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    normal_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(t.device().index)>>>(
        static_cast<T*>(t.raw_data()), n, draw.seed, draw.offset, mean, stddev, t.dtype() == DType::bf16);
  });
  TG_LAUNCH_CHECK();
}

void cast(const Tensor& out, const Tensor& x) {
  int64_t n = x.numel();
  if (n == 0) return;
  set_device(x.device().index);
  if (is_half(x.dtype()) || is_half(out.dtype())) return cast_half(out, x);
  dispatch_any(x.dtype(), [&](auto* stag) {
    using S = TG_ELEMENT_TYPE(stag);
    dispatch_any(out.dtype(), [&](auto* dtag) {
      using D = TG_ELEMENT_TYPE(dtag);
      cast_kernel<S, D><<<grid_for(n, kThreads), kThreads, 0, stream(x.device().index)>>>(
          x.data<S>(), out.data<D>(), n);
    });
  });
  TG_LAUNCH_CHECK();
}
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cuda() && src_device.is_cuda()) {
    set_device(src_device.index);
    if (dst_device.index != src_device.index) {
      fail_if_capturing("copy between GPUs", src_device.index, "the host waits for both devices");
      // Order after pending work on both devices, then copy peer to peer.
      TG_CUDA_CHECK(cudaStreamSynchronize(stream(dst_device.index)));
      TG_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes,
                                        stream(src_device.index)));
      TG_CUDA_CHECK(cudaStreamSynchronize(stream(src_device.index)));
    } else {
      TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(src_device.index)));
    }
    return;
  }
  int dev = dst_device.is_cuda() ? dst_device.index : src_device.index;
  fail_if_capturing(dst_device.is_cuda() ? "copy from the host" : "copy to the host", dev,
                    "the host waits for the copy");
  set_device(dev);
  cudaMemcpyKind kind = dst_device.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream(dev)));
  // The host buffer may be freed or read as soon as we return.
  TG_CUDA_CHECK(cudaStreamSynchronize(stream(dev)));
}

}  // namespace tg::cuda
