// The DataLoader's path to a GPU: page-locked (pinned) host buffers the workers stack
// batches into, and a copy stream of its own that moves them to the device while
// tapegrad's stream computes on the previous batch.
//
// One slot holds one batch (input bytes, then target bytes at target_offset()). The slot's
// life: a worker fills it (host_buffer() first waits for the slot's previous copy to end),
// the consumer starts its copy (upload(): new device tensors, allocated on tapegrad's
// stream; the copy stream waits for that allocation, copies, records the slot's event) and
// gives the slot back, and when the batch is handed out, ready() makes tapegrad's stream
// wait for the copy. Nothing blocks the host except a worker reusing a slot whose copy is
// still running.
//
// ready(s) must be called before the next upload(s) (the event is re-recorded there); the
// DataLoader keeps that order. A CPU-only build has the class, but constructing it throws
// UnsupportedError (the loader's device check fails first).
#pragma once
#include <cstddef>
#include <memory>

#include "../core/tensor.h"

namespace tg::data::detail {

class DeviceStage {
 public:
  DeviceStage(Device device, int slots);
  ~DeviceStage();  // waits for the copies in flight, then frees the pinned buffers
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  int slots() const;
  // Where the target starts in a slot holding `input_bytes` of input (256-byte aligned,
  // so both device copies start on aligned host addresses).
  static std::size_t target_offset(std::size_t input_bytes);

  // Worker side: slot `s`'s host buffer, grown to at least `bytes`, once its last copy
  // has finished.
  void* host_buffer(int s, std::size_t bytes);
  // Consumer side: new device tensors of these shapes, and the asynchronous copies of the
  // slot's contents into them on the copy stream.
  void upload(int s, const Shape& input_shape, DType input_dtype, const Shape& target_shape, DType target_dtype,
              Tensor& input, Tensor& target);
  // Consumer side: tapegrad's stream waits for slot `s`'s copy (no host wait).
  void ready(int s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tg::data::detail
