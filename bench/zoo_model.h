// The zoo's whole-model row: the ResNet-18-style GroupNorm network of examples/common/resnet.h
// for 64x64 inputs (GroupNorm has no batch statistics, so one sample's output depends on that
// sample only, which lets the f64 check run on a slice of the batch). Its parameter names are
// those of the PyTorch mirror in bench/compare_zoo.py, so tg::save's file loads there strictly.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/resnet.h"
#include "tapegrad/tapegrad.h"
#include "zoo_rows.h"

namespace zoo {

constexpr int64_t kGroups = 32;    // GroupNorm groups in every norm
constexpr int64_t kClasses = 10;
constexpr int64_t kImage = 64;     // input height and width
constexpr double kLr = 0.01;       // the training step's SGD learning rate

// The zoo's network: examples/common/resnet.h at ResNet-18's width, kGroups groups.
class ResNet18GN : public ex::ResNet18GN {
 public:
  explicit ResNet18GN(tg::TensorOptions t = {})
      : ex::ResNet18GN({.in_channels = 3, .classes = kClasses, .width = 64, .groups = kGroups}, t) {}
};

// The model row: the network, a fixed batch and labels, and the check. The initial weights
// go to `prefix`.weights.safetensors (tg::save: the PyTorch mirror loads them by name) and
// x, labels and the FP32 logits at those weights to `prefix`.io.safetensors, so the PyTorch
// side can time the same network from the same start and compare its output.
class ModelRow {
 public:
  ModelRow(tg::Device d, int64_t batch, const std::string& prefix);
  void restore_weights();  // back to the saved initial weights (timed steps move them)
  // The logits and the training step's loss, inside tg::Autocast(bf16) when `bf16` is set
  // (mixed precision: bf16 logits, an f32 loss).
  tg::Tensor logits();
  tg::Tensor loss();
  // At the current precision and the initial weights: the logits of the first and last
  // sample against the f64 CPU model on those two, the loss against an f64 cross entropy of
  // the same logits (forward), and all parameter gradients as one vector for a seed gradient
  // zero outside those two samples (backward; LayerRow's method, zoo_rows.h).
  //
  // The gradients need a looser limit than any one layer's: where a ReLU's input lies within
  // rounding of zero, f32 (or TF32) and f64 take different branches, and each such element
  // moves the gradients upstream by about 1/sqrt(its layer's elements). On the CPU in f32 a
  // single flipped element of 786432 already gives 3e-4, several give 5e-3 per tensor. The
  // limit is there to catch a wrong kernel (errors of order one), not rounding.
  Checks check();
  std::string shape() const;
  std::string json() const;  // for bench/compare_zoo.py

  ResNet18GN model;
  bool bf16 = false;     // mixed precision (Autocast(bf16)) for logits(), loss() and check()
  tg::Tensor x, labels;  // (batch, 3, kImage, kImage) f32, (batch) i64
  const std::string weights_path, io_path;

 private:
  struct Reference {
    std::vector<double> logits;
    std::vector<std::vector<double>> grads;  // in parameters() order
  };
  Reference reference() const;
  tg::Tensor dlogits_;
  std::vector<int64_t> rows_;
  std::optional<Reference> ref_;
};

}  // namespace zoo
