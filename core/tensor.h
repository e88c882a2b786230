// Tensor: a cheap handle (shared_ptr) to a contiguous, row-major buffer with a shape,
// a dtype and a device. Copying a Tensor copies the handle, not the data.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "device.h"
#include "dtype.h"
#include "error.h"
#include "shape.h"
#include "storage.h"

namespace tg {

// Options of from_vector over int64 or double values: the dtype defaults to the values' own
// (i64, f64), not to f32, so that from_vector(labels, shape, {.device = d}) keeps integer class
// labels integers. An explicit .dtype converts.
struct ValueOptions {
  std::optional<DType> dtype = std::nullopt;
  Device device = Device::cpu();
};

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  operator ValueOptions() const { return {dtype, device}; }  // a TensorOptions names its dtype
};

struct GradHooks;  // autograd/grad_hooks.h: hooks run when a leaf's grad is final

struct TensorImpl {
  std::shared_ptr<Storage> storage;  // shared between a tensor and its reshaped views
  Shape shape;
  DType dtype = DType::f32;
  bool requires_grad = false;
  bool is_leaf = true;                // false for outputs of ops recorded on a tape
  uint64_t producer_tape = 0;         // Tape::id() of the tape that recorded its op (0: none)
  std::shared_ptr<TensorImpl> grad;   // accumulated by Tape::backward (leaves only)
  std::shared_ptr<GradHooks> grad_hooks;  // null unless a hook was registered (leaves only)
};

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  // A new, uninitialized tensor.
  static Tensor empty(const Shape& shape, TensorOptions opts = {});

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl()->shape; }
  int64_t dim() const { return shape().rank(); }
  int64_t size(int64_t d) const { return shape().at(d); }
  int64_t numel() const { return shape().numel(); }
  DType dtype() const { return impl()->dtype; }
  Device device() const { return impl()->storage->device(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }

  // Raw element pointer; the type must match dtype().
  template <class T> T* data() const {
    TG_CHECK(dtype_of<T>() == dtype(), "Tensor::data: asked for ", dtype_name(dtype_of<T>()),
             " but the tensor of shape ", shape(), " holds ", dtype_name(dtype()));
    return static_cast<T*>(impl()->storage->data());
  }
  void* raw_data() const { return impl()->storage->data(); }

  // Shape changes. reshape is a view on the same storage (one -1 is inferred);
  // permute and contiguous copy. All three are recorded on an active tape.
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor contiguous() const;
  // Copies to another device or dtype (recorded on a tape when the dtype is floating).
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }
  Tensor clone() const;    // a copy with no autograd history
  Tensor detach() const;   // the same storage, no autograd history

  // Host access (copies from the GPU when needed).
  template <class T> std::vector<T> to_vector() const;
  double item() const;  // the value of a one-element tensor

  // In-place writes: they bump the storage's version counter.
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // same shape and dtype; any devices
  uint64_t version() const { return impl()->storage->version(); }
  void bump_version() const { impl()->storage->bump_version(); }
  // Points this tensor (this TensorImpl: every handle to it) at `src`'s storage and dtype,
  // as PyTorch's `param.data = src`: Module::to uses it so that optimizers and other holders
  // of a parameter's handle see the moved or cast data. Shapes must match; requires_grad,
  // leafness and the grad are kept (the caller moves the grad too: Module::to does). The
  // version counter ends above its old value, so a tape that saved this tensor before the
  // move refuses to run backward. Other tensors that shared the old storage (views,
  // detach()) keep it. Not recorded on any tape.
  void set_data_(const Tensor& src) const;

  // Autograd.
  bool requires_grad() const { return impl()->requires_grad; }
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const { return impl()->is_leaf; }
  // An id, not a pointer: it stays meaningful (and harmless) after that tape is gone.
  uint64_t producer_tape() const { return impl()->producer_tape; }
  Tensor grad() const { return Tensor(impl()->grad); }
  void set_grad(const Tensor& g) const { impl()->grad = g.impl_; }
  void zero_grad() const { impl()->grad.reset(); }

  TensorImpl* impl() const {
    TG_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return impl_.get();
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// The bytes of a new tensor of this shape and dtype, validated before anything is
// allocated: at most kMaxDims dims, none negative, and the element and byte counts of the
// non-zero dims within int64 (see checked.h). Errors name `op` and the shape.
int64_t checked_tensor_bytes(const char* op, const Shape& shape, DType dtype);

// Shape, dtype, device and up to a few values (those of bf16 / f16 tensors as their f32 values).
std::ostream& operator<<(std::ostream& os, const Tensor& t);
// "f32[2, 3] on cuda:0", for error messages.
std::string describe(const Tensor& t);

// Factories. Random ones draw from the process-wide seeded generator (manual_seed),
// and give the same numbers on every device.
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor rand(const Shape& shape, TensorOptions opts = {});   // uniform [0, 1)
Tensor randn(const Shape& shape, TensorOptions opts = {});  // standard normal
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts = {});
Tensor arange(int64_t n, TensorOptions opts = {});          // 0, 1, ..., n-1
Tensor from_vector(const std::vector<float>& values, const Shape& shape, TensorOptions opts = {});
Tensor from_vector(const std::vector<double>& values, const Shape& shape, ValueOptions opts = {});   // f64
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, ValueOptions opts = {});  // i64

// Fills `t` in place (used by the factories and by nn init).
void fill_uniform_(Tensor& t, double low, double high);
void fill_normal_(Tensor& t, double mean, double stddev);

}  // namespace tg
