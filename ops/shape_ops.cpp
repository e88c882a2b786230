// The Tensor methods that change shape, layout, dtype or device. They are declared on
// Tensor (core) for convenience but live here because they are recorded on the tape.
#include <numeric>

#include "autograd/tape.h"
#include "core/cuda_graph.h"
#include "core/profiler.h"
#include "core/tensor_kernels.h"
#include "ops/cpu/kernels.h"
#include "ops/dispatch.h"
#if TG_CUDA
#include "ops/cuda/kernels.h"
#endif

namespace tg {
namespace {

// Profiler costs (core/profiler.h): the copies here are 0 FLOPs; bytes: the input read once
// and the output written once. reshape is a view (no kernel runs) and is not profiled.
profile::OpInfo copy_info(const Tensor& in, double out_bytes) {
  return {{&in}, 0, static_cast<double>(in.nbytes()) + out_bytes};
}

}  // namespace

Tensor Tensor::reshape(const Shape& new_shape) const {
  std::vector<int64_t> dims = new_shape.dims();
  // The product of the given dims is checked: a wrapped product would let a 16-byte
  // buffer be viewed as a shape of 2^64 + 16 elements.
  int64_t infer = -1;
  std::vector<int64_t> given;  // the dims other than the -1
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      TG_CHECK_AS(ShapeError, infer < 0, "reshape: more than one -1 in ", new_shape, " (from ", describe(*this), ")");
      infer = static_cast<int64_t>(i);
    } else {
      TG_CHECK_AS(ShapeError, dims[i] >= 0, "reshape: negative size in ", new_shape, " (from ", describe(*this), ")");
      given.push_back(dims[i]);
    }
  }
  const int64_t known = checked_numel(given, "reshape");
  if (infer >= 0) {
    TG_CHECK_AS(ShapeError, known > 0 && numel() % known == 0, "reshape: cannot infer -1 in ", new_shape,
                " for ", describe(*this));
    dims[infer] = numel() / known;  // the target's count is then numel(): no overflow
  }
  Shape target(dims);
  checked_tensor_bytes("reshape", target, dtype());  // the same bounds as a new tensor
  TG_CHECK_AS(ShapeError, target.numel() == numel(), "reshape: ", describe(*this), " (", numel(),
              " elements) cannot be viewed as ", target);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;  // a view: same buffer, same version counter
  impl->shape = target;
  impl->dtype = dtype();
  Tensor out(std::move(impl));
  if (should_record({*this})) {
    record("reshape", {*this}, {out}, {}, [in_shape = shape()](const BackwardArgs& args) {
      return std::vector<Tensor>{args.grad_outputs[0].reshape(in_shape)};
    });
  }
  return out;
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  TG_CHECK_AS(ShapeError, static_cast<int64_t>(dims.size()) == dim(), "permute: ", dims.size(),
              " dims given for ", describe(*this));
  std::vector<int64_t> perm(dims.size());
  std::vector<bool> seen(dims.size(), false);
  std::vector<int64_t> out_dims(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = dims[i] < 0 ? dims[i] + dim() : dims[i];
    TG_CHECK_AS(ShapeError, d >= 0 && d < dim() && !seen[d], "permute: invalid permutation ", Shape(dims), " for ", describe(*this));
    seen[d] = true;
    perm[i] = d;
    out_dims[i] = size(d);
  }
  profile::OpScope scope("permute", [&] { return copy_info(*this, static_cast<double>(nbytes())); });
  Tensor out = Tensor::empty(Shape(out_dims), {.dtype = dtype(), .device = device()});
  TG_DISPATCH(device(), permute(out, *this, perm));
  if (should_record({*this})) {
    std::vector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
    record("permute", {*this}, {out}, {}, [inverse](const BackwardArgs& args) {
      const Tensor& g = args.grad_outputs[0];
      profile::OpScope scope("permute (backward)", [&] { return copy_info(g, static_cast<double>(g.nbytes())); });
      return std::vector<Tensor>{args.grad_outputs[0].permute(inverse)};
    });
  }
  return out;
}

Tensor Tensor::contiguous() const {
  // Every tensor is contiguous; this is a plain (differentiable) copy.
  std::vector<int64_t> identity(static_cast<size_t>(dim()));
  std::iota(identity.begin(), identity.end(), 0);
  return permute(identity);
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  check_device("Tensor::to(device)", target);  // a GPU this machine lacks: a clear error, first
  cuda::fail_if_capturing("to(device)", device().is_cuda() ? device() : target, "the host waits for the copy");
  profile::OpScope scope("to_device", [&] { return copy_info(*this, static_cast<double>(nbytes())); });
  Tensor out = Tensor::empty(shape(), {.dtype = dtype(), .device = target});
  out.copy_(*this);
  if (should_record({*this})) {
    record("to_device", {*this}, {out}, {}, [source = device()](const BackwardArgs& args) {
      const Tensor& g = args.grad_outputs[0];
      profile::OpScope scope("to_device (backward)", [&] { return copy_info(g, static_cast<double>(g.nbytes())); });
      return std::vector<Tensor>{args.grad_outputs[0].to(source)};
    });
  }
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  profile::OpScope scope("to_dtype", [&] {
    return copy_info(*this, static_cast<double>(numel()) * static_cast<double>(dtype_size(target)));
  });
  Tensor out = Tensor::empty(shape(), {.dtype = target, .device = device()});
  if (device().is_cpu()) {
    cpu::cast(out, *this);
  } else {
#if TG_CUDA
    cuda::cast(out, *this);
#endif
  }
  // Recorded between the floating types, half ones included (tg::Autocast's casts): the
  // gradient goes back cast to the source type.
  if ((is_floating(target) || is_half(target)) && should_record({*this})) {
    record("to_dtype", {*this}, {out}, {}, [source = dtype()](const BackwardArgs& args) {
      const Tensor& g = args.grad_outputs[0];
      profile::OpScope scope("to_dtype (backward)", [&] {
        return copy_info(g, static_cast<double>(g.numel()) * static_cast<double>(dtype_size(source)));
      });
      return std::vector<Tensor>{args.grad_outputs[0].to(source)};
    });
  }
  return out;
}

}  // namespace tg
