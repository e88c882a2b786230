// Anomaly mode: find the op that first produced a NaN or an Inf.
//
//   tg::set_detect_anomaly(true);     // or: tg::DetectAnomalyGuard guard;
//   Tape tape;
//   Tensor loss = ...;                // throws at the first op on the tape whose output has NaN/Inf
//   tape.backward(loss);              // throws at the first gradient with NaN/Inf
//
// When on, every op recorded on a tape has its outputs scanned as it is recorded, and
// every gradient backward produces is scanned before it is accumulated; the first offender
// raises tg::Error:
//   "anomaly: forward of 'div' produced NaN/Inf in output 0 f32[2, 3] on cpu (element 4 is inf)"
// An op's inputs that no op on the tape produced (leaves: data, parameters, results computed
// outside the tape; or tensors of another tape) are scanned first, so that a NaN that was
// already there is reported as an input's, not blamed on the first op that passed it on:
//   "anomaly: leaf input 0 of 'mul' f32[3] on cpu already held NaN/Inf (element 1 is nan) ..."
//   "anomaly: backward of 'div' produced NaN/Inf in the gradient of input 1 f32[3] on cpu (...)"
// Ops run outside a tape (or on inputs that need no grad) are not scanned.
//
// Cost: a debug mode. Each scanned tensor is read once in full; a GPU tensor is first
// copied to the host, which also synchronizes the device after every recorded op and every
// gradient. Expect training to run several times slower; leave it off otherwise (the
// default), where it costs one relaxed atomic load per recorded op. Inputs from outside
// the tape are scanned at every op that uses them (a parameter once per use).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "../core/tensor.h"

namespace tg {

// Process-wide switch (all threads).
void set_detect_anomaly(bool on);
bool detect_anomaly();

// Turns anomaly mode on (or off) in a scope and restores the previous setting.
class DetectAnomalyGuard {
 public:
  explicit DetectAnomalyGuard(bool on = true);
  ~DetectAnomalyGuard();
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool previous_;
};

// The index of the first NaN or Inf of a floating tensor (any device), or -1. Integer
// tensors have none.
int64_t first_non_finite(const Tensor& t);

// The checks the tape runs when anomaly mode is on (throw tg::Error as described above).
// `tape_id` is the recording tape's: inputs it produced were scanned as outputs already.
void check_forward_anomaly(const std::string& op, const std::vector<Tensor>& inputs,
                           const std::vector<Tensor>& outputs, uint64_t tape_id);
void check_backward_anomaly(const std::string& op, std::size_t input_index, const Tensor& grad);

}  // namespace tg
