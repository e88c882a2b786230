// Dataset: what a DataLoader draws examples from. An example is two CPU tensors, an input
// and a target; the loader stacks the examples of a batch along a new leading dimension.
//
//   class Squares : public tg::data::Dataset {
//     int64_t size() const override { return 100; }
//     tg::data::Example get(int64_t i) const override {
//       return {tg::full({1}, double(i)), tg::full({1}, double(i * i))};
//     }
//   };
//
// get() is called from the loader's worker threads concurrently: it must be safe to call
// from several threads at once (a const function over immutable data is).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../core/tensor.h"

namespace tg::data {

// One example. A class label is a one-element i64 tensor of shape {} (a batch of them
// stacks to shape (N), what cross_entropy takes).
struct Example {
  Tensor input;
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example i, 0 <= i < size(). Thread-safe (see above). Every example of a dataset must
  // have the same shapes and dtypes, or the loader cannot stack them (it says which).
  virtual Example get(int64_t i) const = 0;
};

// Examples are rows of two tensors that share their leading dimension: get(i) returns
// copies of inputs[i] and targets[i] (shape without the leading dim). Tensors must be on
// the CPU; they are held, not copied, so the dataset is cheap to build over loaded files.
class TensorDataset : public Dataset {
 public:
  // Throws ShapeError when the leading dims differ or a tensor has rank 0, DeviceError
  // when one is not on the CPU.
  TensorDataset(Tensor inputs, Tensor targets);
  int64_t size() const override { return inputs_.shape()[0]; }
  Example get(int64_t i) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
};

// Row i of a CPU tensor with a leading dimension, as a new tensor (a copy). Throws
// ShapeError for an index out of range.
Tensor row(const Tensor& t, int64_t i);

// Stacks equally shaped CPU tensors along a new leading dimension into `out`'s buffer
// (shape (parts.size(), ...part shape)); `what` names the stacked field in errors, and
// `indices` (the dataset indices of the parts) names the example that does not fit.
// Throws ShapeError / DTypeError / DeviceError. Exposed for the loader and for tests.
Shape stacked_shape(const std::vector<Tensor>& parts, const std::vector<int64_t>& indices, const char* what);
void stack_into(void* out, const std::vector<Tensor>& parts);

}  // namespace tg::data
