#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <mutex>

#include "core/dtype_dispatch.h"
#include "core/cuda_graph.h"
#include "core/half.h"
#include "core/random.h"
#include "core/tensor_kernels.h"

namespace tg {
namespace {

#if !TG_CUDA
[[noreturn]] void no_cuda(const char* what) {
  TG_FAIL(what, ": tapegrad was built without CUDA");
}
#endif

// The CPU side of the random fills: element i of t gets value_of(i) (a double) in t's type.
template <class ValueOf>
void fill_elementwise_cpu(Tensor& t, ValueOf value_of) {
  if (is_half(t.dtype())) {
    uint16_t* p = static_cast<uint16_t*>(t.raw_data());
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = encode_half(t.dtype(), value_of(i));
    return;
  }
  dispatch_any(t.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = t.data<T>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = static_cast<T>(value_of(i));
  });
}

}  // namespace

void copy_bytes(void* dst, Device dd, const void* src, Device sd, std::size_t bytes) {
  if (dd.is_cpu() && sd.is_cpu()) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
#if TG_CUDA
  cuda::copy_bytes(dst, dd, src, sd, bytes);
#else
  no_cuda("copy");
#endif
}

// ---- random generator -------------------------------------------------------------------

namespace {
std::mutex g_rng_mutex;
uint64_t g_seed = 0x7A9E6;
uint64_t g_offset = 0;
}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_rng_mutex);
  g_seed = seed;
  g_offset = 0;
}

RandomDraw next_random_draw(uint64_t n) {
  std::lock_guard<std::mutex> lock(g_rng_mutex);
  RandomDraw d{g_seed, g_offset};
  g_offset += n;
  return d;
}

// ---- construction -----------------------------------------------------------------------

int64_t checked_tensor_bytes(const char* op, const Shape& shape, DType dtype) {
  TG_CHECK(shape.rank() <= kMaxDims, op, ": shape ", shape, " has more than ", kMaxDims, " dims");
  const int64_t extent = checked_extent(shape.dims(), op);
  // Checked on the extent, not on numel: byte strides of a tensor with a zero dim are
  // products of its other dims and must fit as well.
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  checked_mul(extent, esize, op, ": byte count of ", dtype_name(dtype), shape);
  return checked_numel(shape.dims(), op) * esize;
}

namespace {
// Tensor::empty with errors naming the public function that was called.
Tensor empty_for(const char* op, const Shape& shape, TensorOptions opts) {
  const int64_t bytes = checked_tensor_bytes(op, shape, opts.dtype);
  check_device(op, opts.device);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = opts.dtype;
  impl->storage = std::make_shared<Storage>(static_cast<std::size_t>(bytes), opts.device);
  return Tensor(std::move(impl));
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, TensorOptions opts) { return empty_for("Tensor::empty", shape, opts); }

Tensor& Tensor::fill_(double value) {
  TG_CHECK_AS(DTypeError, dtype() != DType::i64 || (value >= -9223372036854775808.0 && value < 9223372036854775808.0),
              "fill_: ", value, " has no i64 value, for ", describe(*this));
  if (device().is_cpu() && is_half(dtype())) {
    uint16_t* p = static_cast<uint16_t*>(raw_data());
    const uint16_t v = encode_half(dtype(), value);
    for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = v;
  } else if (device().is_cpu()) {
    dispatch_any(dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      T* p = data<T>();
      T v = static_cast<T>(value);
      for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = v;
    });
  } else {
#if TG_CUDA
    cuda::fill(*this, value);
#else
    no_cuda("fill_");
#endif
  }
  bump_version();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  TG_CHECK(src.shape() == shape() && src.dtype() == dtype(), "copy_: source ", describe(src),
           " does not match destination ", describe(*this));
  if (device() != src.device()) {
    cuda::fail_if_capturing("copy_ between devices", device().is_cuda() ? device() : src.device(),
                            "the host waits for the copy");
  }
  copy_bytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
  bump_version();
  return *this;
}

void fill_uniform_(Tensor& t, double low, double high) {
  TG_CHECK_AS(DTypeError, is_floating(t.dtype()) || is_half(t.dtype()), "uniform: needs a floating dtype, got ",
              describe(t));
  RandomDraw draw = next_random_draw(static_cast<uint64_t>(t.numel()));
  if (t.device().is_cpu()) {
    fill_elementwise_cpu(t, [&](int64_t i) {
      return scaled_draw(low, high - low, uniform_at(draw.seed, draw.offset + i));
    });
  } else {
#if TG_CUDA
    cuda::fill_uniform(t, draw, low, high);
#else
    no_cuda("uniform");
#endif
  }
  t.bump_version();
}

void fill_normal_(Tensor& t, double mean, double stddev) {
  TG_CHECK_AS(DTypeError, is_floating(t.dtype()) || is_half(t.dtype()), "randn: needs a floating dtype, got ",
              describe(t));
  RandomDraw draw = next_random_draw(static_cast<uint64_t>(t.numel()));
  if (t.device().is_cpu()) {
    fill_elementwise_cpu(t, [&](int64_t i) {
      return scaled_draw(mean, stddev, normal_at(draw.seed, draw.offset + i));
    });
  } else {
#if TG_CUDA
    cuda::fill_normal(t, draw, mean, stddev);
#else
    no_cuda("randn");
#endif
  }
  t.bump_version();
}

namespace {
Tensor full_for(const char* op, const Shape& shape, double value, TensorOptions opts) {
  Tensor t = empty_for(op, shape, opts);
  t.fill_(value);
  return t;
}
Tensor uniform_for(const char* op, const Shape& shape, double low, double high, TensorOptions opts) {
  Tensor t = empty_for(op, shape, opts);
  fill_uniform_(t, low, high);
  return t;
}
}  // namespace

Tensor zeros(const Shape& shape, TensorOptions opts) { return full_for("zeros", shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full_for("ones", shape, 1.0, opts); }
Tensor full(const Shape& shape, double value, TensorOptions opts) { return full_for("full", shape, value, opts); }
Tensor rand(const Shape& shape, TensorOptions opts) { return uniform_for("rand", shape, 0.0, 1.0, opts); }
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts) {
  return uniform_for("uniform", shape, low, high, opts);
}
Tensor randn(const Shape& shape, TensorOptions opts) {
  Tensor t = empty_for("randn", shape, opts);
  fill_normal_(t, 0.0, 1.0);
  return t;
}

Tensor arange(int64_t n, TensorOptions opts) {
  TG_CHECK(n >= 0, "arange: negative length ", n);
  check_device("arange", opts.device);  // before the host buffer is filled
  // Every integer up to 2^53 is exact in f64; the half types round once from there.
  if (is_half(opts.dtype)) return arange(n, {.dtype = DType::f64}).to(opts.dtype).to(opts.device);
  Tensor host = empty_for("arange", Shape{n}, {.dtype = opts.dtype});
  dispatch_any(opts.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = host.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(i);
  });
  return opts.device.is_cpu() ? host : host.to(opts.device);
}

namespace {
template <class T>
Tensor from_values(const std::vector<T>& values, const Shape& shape, TensorOptions opts) {
  checked_tensor_bytes("from_vector", shape, opts.dtype);
  check_device("from_vector", opts.device);
  TG_CHECK(static_cast<int64_t>(values.size()) == checked_numel(shape.dims(), "from_vector"), "from_vector: ",
           values.size(), " values do not fill shape ", shape);
  Tensor host = empty_for("from_vector", shape, {.dtype = dtype_of<T>()});
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  if (opts.dtype != dtype_of<T>()) host = host.to(opts.dtype);
  return opts.device.is_cpu() ? host : host.to(opts.device);
}
}  // namespace

Tensor from_vector(const std::vector<float>& v, const Shape& s, TensorOptions o) { return from_values(v, s, o); }
Tensor from_vector(const std::vector<double>& v, const Shape& s, ValueOptions o) {
  return from_values(v, s, {.dtype = o.dtype.value_or(DType::f64), .device = o.device});
}
Tensor from_vector(const std::vector<int64_t>& v, const Shape& s, ValueOptions o) {
  return from_values(v, s, {.dtype = o.dtype.value_or(DType::i64), .device = o.device});
}

// ---- copies without autograd ------------------------------------------------------------

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape(), {.dtype = dtype(), .device = device()});
  copy_bytes(out.raw_data(), device(), raw_data(), device(), nbytes());
  return out;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = shape();
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

void Tensor::set_data_(const Tensor& src) const {
  TG_CHECK(src.defined(), "set_data_: the source is an undefined tensor");
  TG_CHECK(src.shape() == shape(), "set_data_: source ", describe(src), " does not match the shape of ",
           describe(*this));
  TG_CHECK(!requires_grad() || is_floating(src.dtype()), "set_data_: ", describe(*this),
           " requires grad but the source ", describe(src), " is not floating point");
  if (src.impl()->storage == impl()->storage && src.dtype() == dtype()) return;
  const uint64_t old_version = version();
  impl()->storage = src.impl()->storage;
  impl()->dtype = src.dtype();
  // Storage has no setter for its counter: count up past the old value (once per
  // in-place write this tensor ever had, so cheap next to the copy that produced `src`).
  while (version() <= old_version) bump_version();
}

Tensor& Tensor::requires_grad_(bool on) {
  TG_CHECK_AS(DTypeError, !(on && is_half(dtype())), "requires_grad_ (autograd): a ", dtype_name(dtype()),
              " leaf takes no gradient (parameters stay f32 or f64; half tensors get gradients only as results of "
              "recorded ops, such as tg::Autocast's casts); convert with .to(DType::f32)");
  TG_CHECK(!on || is_floating(dtype()), "requires_grad_: ", describe(*this), " is not floating point");
  impl()->requires_grad = on;
  return *this;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  cuda::fail_if_capturing("to_vector", device(), "it copies to the host and waits for the GPU");
  Tensor src = *this;
  if (dtype() != dtype_of<T>()) src = detach().to(dtype_of<T>());
  std::vector<T> out(static_cast<size_t>(numel()));
  copy_bytes(out.data(), Device::cpu(), src.raw_data(), src.device(), out.size() * sizeof(T));
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;

double Tensor::item() const {
  TG_CHECK(numel() == 1, "item: tensor of shape ", shape(), " has ", numel(), " elements, not one");
  cuda::fail_if_capturing("item", device(), "it copies to the host and waits for the GPU");
  if (dtype() == DType::i64) return static_cast<double>(to_vector<int64_t>()[0]);
  if (is_half(dtype())) {
    uint16_t bits = 0;
    copy_bytes(&bits, Device::cpu(), raw_data(), device(), sizeof bits);
    return decode_half(dtype(), bits);
  }
  return to_vector<double>()[0];
}

// ---- printing ---------------------------------------------------------------------------

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  return detail::concat(dtype_name(t.dtype()), t.shape(), " on ", t.device().str());
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  os << "Tensor(" << describe(t);
  if (t.requires_grad()) os << ", requires_grad";
  const int64_t shown = std::min<int64_t>(t.numel(), 8);
  if (shown > 0) {
    // Copy only the first few elements: printing must not move a whole GPU tensor.
    std::vector<double> v(static_cast<size_t>(shown));
    if (is_half(t.dtype())) {
      std::vector<uint16_t> head(static_cast<size_t>(shown));
      copy_bytes(head.data(), Device::cpu(), t.raw_data(), t.device(), head.size() * sizeof(uint16_t));
      for (int64_t i = 0; i < shown; ++i) v[i] = decode_half(t.dtype(), head[i]);
    } else dispatch_any(t.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      std::vector<T> head(static_cast<size_t>(shown));
      copy_bytes(head.data(), Device::cpu(), t.raw_data(), t.device(), head.size() * sizeof(T));
      for (int64_t i = 0; i < shown; ++i) v[i] = static_cast<double>(head[i]);
    });
    os << ", values [";
    for (int64_t i = 0; i < shown; ++i) os << (i ? ", " : "") << std::setprecision(6) << v[i];
    if (t.numel() > shown) os << ", ...";
    os << "]";
  }
  return os << ")";
}

}  // namespace tg
