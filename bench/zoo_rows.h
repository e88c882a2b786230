// The zoo's layer rows: ordinary layer shapes (issue 22's list), each one op of tapegrad
// with its inputs, parameters and upstream gradient, and its correctness check.
//
// The check compares with tapegrad's own CPU backend in f64 on a slice of the batch: dim 0
// of every row's input and output is the batch (linear: the rows of x), and a sample's
// output depends on that sample only. The GPU runs the exact shape that is timed (the
// dispatchers pick kernels by shape); for the backward the seed gradient is zero outside
// the slice, so the parameter gradients (sums over the batch) equal the slice's, which the
// f64 run computes. Checked: y and dx on the slice, every parameter gradient whole.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/host.h"
#include "tapegrad/tapegrad.h"

namespace zoo {

using Comparisons = std::vector<std::pair<std::string, ex::Comparison>>;
struct Checks {
  Comparisons forward, backward;  // the fwd+bwd row is judged on both
};

// Which batch entries a check covers: the first and last `per_end` (all when fewer).
std::vector<int64_t> check_rows(int64_t batch, int64_t per_end);
// Those entries of a device tensor (batch-major, contiguous; f32, or bf16 read as f32): as f64
// values, or as an f64 CPU tensor of the same shape with dim 0 = rows.size().
std::vector<double> read_rows(const tg::Tensor& t, const std::vector<int64_t>& rows);
tg::Tensor rows_f64(const tg::Tensor& t, const std::vector<int64_t>& rows);
// `t` times a (batch, 1, ..., 1) mask that keeps only `rows`: the check's seed gradient.
tg::Tensor keep_rows(const tg::Tensor& t, const std::vector<int64_t>& rows);
// A detached f64 CPU copy, requiring grad: a leaf of the f64 reference run.
tg::Tensor f64_leaf(const tg::Tensor& t);

enum class Kind { conv2d, conv3d, group_norm, linear };
const char* kind_name(Kind k);

struct LayerSpec {
  std::string name;
  Kind kind = Kind::conv2d;
  tg::Shape x;          // the input as tapegrad holds it (NHWC rows: (N, H, W, C))
  tg::Shape w;          // conv: (K, C, k...); linear: (out, in); group_norm: gamma (C)
  bool bias = false;    // group_norm: gamma and beta always
  tg::ConvParams conv;  // conv rows
  int64_t groups = 0;   // group_norm rows

  std::string shape() const;  // for people: "Conv2d 3x3 s2 p1, x [16, 96, 64, 64] -> [16, 192, 32, 32]"
  std::string json() const;   // for bench/compare_zoo.py, which rebuilds the op in PyTorch from it
};

std::vector<LayerSpec> layer_specs();

class LayerRow {
 public:
  LayerRow(const LayerSpec& spec, tg::Device d);  // draws from the generator: seed first
  // The op on x and params; inside tg::Autocast(bf16) when `bf16` is set (its output then bf16
  // for conv and linear rows, f32 for group_norm).
  tg::Tensor forward() const;
  // The upstream gradient in y's dtype.
  const tg::Tensor& seed_for(const tg::Tensor& y);
  void zero_grads() const;
  // At the current precision; the f64 reference is computed on the first call only.
  Checks check();

  const LayerSpec& spec;
  bool bf16 = false;               // mixed precision: forward() under tg::Autocast(bf16)
  tg::Tensor x, dy;                // x (does not require grad until a backward), dy like y (f32)
  std::vector<tg::Tensor> params;  // weight [, bias] or gamma, beta: leaves requiring grad

 private:
  struct Reference {
    std::vector<double> y, dx;
    std::vector<std::vector<double>> dparams;
  };
  Reference reference() const;
  std::vector<int64_t> rows_;
  std::optional<Reference> ref_;
  tg::Tensor dy_bf16_;
};

}  // namespace zoo
