// File readers for the common small-dataset formats, and datasets over them.
//
//   IDX (MNIST, Fashion-MNIST): big-endian; magic 0x00 0x00 <type> <ndims>, ndims big-endian
//     uint32 sizes, then the elements. MnistDataset checks the magics 0x00000803 (images,
//     ubyte, 3 dims) and 0x00000801 (labels, ubyte, 1 dim).
//   CIFAR-10 binary (data_batch_1.bin ...): records of 1 label byte (0-9) and 3072 image
//     bytes (1024 red, 1024 green, 1024 blue, each 32x32 row-major).
//   NumPy .npy, versions 1.0, 2.0 and 3.0: magic "\x93NUMPY", a Python-dict header with
//     'descr', 'fortran_order' and 'shape', then the elements in C order.
//
// Errors name the reader, the file and the byte offset where the problem is:
//   IOError           the file cannot be opened or read, or ends before what its header
//                     promises ("truncated: ... needs 784 bytes at byte offset 16, but the
//                     file ends at byte 400")
//   UnsupportedError  a valid file this reader does not take (Fortran order, complex or
//                     structured dtypes, more than 6 dims)
//   Error             a malformed file: a bad magic, an unparseable header, bytes past
//                     the end of the data, a label out of range
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dataset.h"

namespace tg::data {

// The elements of an IDX file as a tensor of its shape: floating types (0x0D float,
// 0x0E double) and, by default, integer types (0x08 ubyte, 0x09 sbyte, 0x0B short,
// 0x0C int) as `dtype`. Integers convert exactly to any dtype; floats to i64 are refused
// (DTypeError).
Tensor read_idx(const std::string& path, DType dtype = DType::f32);

// The elements of a .npy file as a tensor of its shape. Element types: f4, f8 (little or
// big endian), i1, i2, i4, i8, u1, u2, u4, u8, b1. By default f4 -> f32, f8 -> f64 and
// integers and bools -> i64; `as` converts (u1 images as f32, say); floats to i64 are
// refused (DTypeError), as are u8 values past int64's range (Error).
Tensor read_npy(const std::string& path, std::optional<DType> as = std::nullopt);

// MNIST-style images and labels: get(i) is the image as f32 (1, rows, cols) scaled to
// [0, 1] and the label as an i64 scalar. The files are read once, into memory as bytes.
class MnistDataset : public Dataset {
 public:
  // Throws as the readers above, and Error when the two files' counts differ.
  MnistDataset(const std::string& images_path, const std::string& labels_path);
  int64_t size() const override { return count_; }
  Example get(int64_t i) const override;
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  uint8_t label(int64_t i) const { return labels_.at(static_cast<std::size_t>(i)); }

 private:
  int64_t count_ = 0, rows_ = 0, cols_ = 0;
  std::vector<uint8_t> images_, labels_;
};

// CIFAR-10 binary batches, concatenated in the order given: get(i) is the image as f32
// (3, 32, 32) scaled to [0, 1] and the label as an i64 scalar.
class Cifar10Dataset : public Dataset {
 public:
  static constexpr int64_t kRecordBytes = 1 + 3 * 32 * 32;
  // Throws IOError for a file that is not a whole number of records (naming the partial
  // record's offset), Error for a label past 9 or a file with no records.
  explicit Cifar10Dataset(const std::vector<std::string>& paths);
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Example get(int64_t i) const override;
  uint8_t label(int64_t i) const { return labels_.at(static_cast<std::size_t>(i)); }

 private:
  std::vector<uint8_t> images_, labels_;
};

}  // namespace tg::data
