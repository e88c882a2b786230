#include "data/dataset.h"

#include <cstring>

namespace tg::data {

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  TG_CHECK_AS(DeviceError, inputs_.device().is_cpu() && targets_.device().is_cpu(),
              "TensorDataset: tensors must be on the CPU, got inputs ", describe(inputs_), " and targets ",
              describe(targets_));
  TG_CHECK_AS(ShapeError, inputs_.dim() >= 1 && targets_.dim() >= 1,
              "TensorDataset: tensors need a leading (example) dimension, got inputs ", describe(inputs_),
              " and targets ", describe(targets_));
  TG_CHECK_AS(ShapeError, inputs_.shape()[0] == targets_.shape()[0],
              "TensorDataset: inputs and targets must have as many rows, got inputs ", describe(inputs_),
              " and targets ", describe(targets_));
}

Example TensorDataset::get(int64_t i) const { return {row(inputs_, i), row(targets_, i)}; }

Tensor row(const Tensor& t, int64_t i) {
  TG_CHECK_AS(DeviceError, t.device().is_cpu(), "row: the tensor must be on the CPU, got ", describe(t));
  TG_CHECK_AS(ShapeError, t.dim() >= 1 && i >= 0 && i < t.shape()[0], "row: index ", i, " out of range for ",
              describe(t));
  std::vector<int64_t> dims(t.shape().begin() + 1, t.shape().end());
  Tensor out = Tensor::empty(Shape(std::move(dims)), {.dtype = t.dtype()});
  const std::size_t bytes = out.nbytes();
  if (bytes) std::memcpy(out.raw_data(), static_cast<const char*>(t.raw_data()) + bytes * static_cast<std::size_t>(i), bytes);
  return out;
}

Shape stacked_shape(const std::vector<Tensor>& parts, const std::vector<int64_t>& indices, const char* what) {
  TG_CHECK(!parts.empty() && parts.size() == indices.size(), "stack: ", parts.size(), " ", what, "s for ",
           indices.size(), " indices");
  const Tensor& first = parts[0];
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const Tensor& p = parts[k];
    TG_CHECK(p.defined(), "DataLoader: the ", what, " of example ", indices[k], " is an undefined tensor");
    TG_CHECK_AS(DeviceError, p.device().is_cpu(), "DataLoader: the ", what, " of example ", indices[k],
                " is ", describe(p), "; Dataset::get must return CPU tensors (the loader moves batches)");
    TG_CHECK_AS(DTypeError, p.dtype() == first.dtype(), "DataLoader: cannot stack the ", what, " of example ",
                indices[k], " (", describe(p), ") with that of example ", indices[0], " (", describe(first), ")");
    TG_CHECK_AS(ShapeError, p.shape() == first.shape(), "DataLoader: cannot stack the ", what, " of example ",
                indices[k], " (", describe(p), ") with that of example ", indices[0], " (", describe(first), ")");
  }
  // The batch dimension is one more: an example of kMaxDims dims cannot be batched.
  TG_CHECK_AS(ShapeError, first.dim() < kMaxDims, "DataLoader: the ", what, " of example ", indices[0], " (",
              describe(first), ") has ", first.dim(), " dims; a batch of it would exceed ", kMaxDims);
  std::vector<int64_t> dims{static_cast<int64_t>(parts.size())};
  dims.insert(dims.end(), first.shape().begin(), first.shape().end());
  return Shape(std::move(dims));
}

void stack_into(void* out, const std::vector<Tensor>& parts) {
  char* dst = static_cast<char*>(out);
  for (const Tensor& p : parts) {
    const std::size_t bytes = p.nbytes();
    if (bytes) std::memcpy(dst, p.raw_data(), bytes);
    dst += bytes;
  }
}

}  // namespace tg::data
