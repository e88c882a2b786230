#include "data/device_stage.h"

#include <vector>

#if TG_CUDA
#include "core/cuda_context.h"
#endif

namespace tg::data::detail {

std::size_t DeviceStage::target_offset(std::size_t input_bytes) { return (input_bytes + 255) / 256 * 256; }

#if TG_CUDA

struct DeviceStage::Impl {
  struct Slot {
    void* host = nullptr;  // pinned
    std::size_t capacity = 0;
    cudaEvent_t copied = nullptr;  // recorded on the copy stream after the slot's copy
  };
  Device device;
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t allocated = nullptr;  // recorded on tapegrad's stream after each upload's allocations
  std::vector<Slot> slots;
};

DeviceStage::DeviceStage(Device device, int slots) : impl_(std::make_unique<Impl>()) {
  check_device("DataLoader", device);
  TG_CHECK(device.is_cuda() && slots > 0, "DeviceStage: needs a CUDA device and at least one slot");
  impl_->device = device;
  cuda::set_device(device.index);
  // Non-blocking: the legacy default stream must not serialize the copies with other work.
  TG_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->copy_stream, cudaStreamNonBlocking));
  TG_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->allocated, cudaEventDisableTiming));
  impl_->slots.resize(static_cast<std::size_t>(slots));
  // A never-recorded event counts as complete, so the first host_buffer() does not wait.
  for (auto& s : impl_->slots) TG_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
}

DeviceStage::~DeviceStage() {
  if (!impl_) return;
  // Errors are ignored: a destructor must not throw. The copies read the pinned buffers,
  // so they must end before the buffers are freed.
  cudaSetDevice(impl_->device.index);
  if (impl_->copy_stream) cudaStreamSynchronize(impl_->copy_stream);
  for (auto& s : impl_->slots) {
    if (s.host) cudaFreeHost(s.host);
    if (s.copied) cudaEventDestroy(s.copied);
  }
  if (impl_->allocated) cudaEventDestroy(impl_->allocated);
  if (impl_->copy_stream) cudaStreamDestroy(impl_->copy_stream);
}

int DeviceStage::slots() const { return static_cast<int>(impl_->slots.size()); }

void* DeviceStage::host_buffer(int s, std::size_t bytes) {
  Impl::Slot& slot = impl_->slots.at(static_cast<std::size_t>(s));
  cuda::set_device(impl_->device.index);  // workers are fresh threads
  TG_CUDA_CHECK(cudaEventSynchronize(slot.copied));
  if (slot.capacity < bytes) {
    if (slot.host) TG_CUDA_CHECK(cudaFreeHost(slot.host));
    slot.host = nullptr;
    slot.capacity = 0;
    // Portable: pinned for every device's context, whichever thread allocates it.
    TG_CUDA_CHECK(cudaHostAlloc(&slot.host, bytes, cudaHostAllocPortable));
    slot.capacity = bytes;
  }
  return slot.host;
}

void DeviceStage::upload(int s, const Shape& input_shape, DType input_dtype, const Shape& target_shape,
                         DType target_dtype, Tensor& input, Tensor& target) {
  Impl::Slot& slot = impl_->slots.at(static_cast<std::size_t>(s));
  const Device d = impl_->device;
  cuda::set_device(d.index);
  input = Tensor::empty(input_shape, {.dtype = input_dtype, .device = d});
  target = Tensor::empty(target_shape, {.dtype = target_dtype, .device = d});
  // The allocations are ordered on tapegrad's stream (cudaMallocAsync): the copy stream
  // may write the memory only after them. The wait covers the work queued there so far,
  // which is why the loader uploads batch k+1 when it hands out batch k, before the
  // step on batch k is queued: the copy then runs beside that step.
  const cudaStream_t compute = cuda::stream(d.index);
  TG_CUDA_CHECK(cudaEventRecord(impl_->allocated, compute));
  TG_CUDA_CHECK(cudaStreamWaitEvent(impl_->copy_stream, impl_->allocated, 0));
  const char* host = static_cast<const char*>(slot.host);
  if (input.nbytes())
    TG_CUDA_CHECK(cudaMemcpyAsync(input.raw_data(), host, input.nbytes(), cudaMemcpyHostToDevice, impl_->copy_stream));
  if (target.nbytes())
    TG_CUDA_CHECK(cudaMemcpyAsync(target.raw_data(), host + target_offset(input.nbytes()), target.nbytes(),
                                  cudaMemcpyHostToDevice, impl_->copy_stream));
  TG_CUDA_CHECK(cudaEventRecord(slot.copied, impl_->copy_stream));
}

void DeviceStage::ready(int s) {
  Impl::Slot& slot = impl_->slots.at(static_cast<std::size_t>(s));
  cuda::set_device(impl_->device.index);
  // Every later use of the batch, and the free of its memory (cudaFreeAsync), is ordered
  // on tapegrad's stream after this wait.
  TG_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(impl_->device.index), slot.copied, 0));
}

#else  // CPU-only build

struct DeviceStage::Impl {};

DeviceStage::DeviceStage(Device device, int) {
  check_device("DataLoader", device);  // throws for any GPU: none is usable in this build
  TG_FAIL_AS(UnsupportedError, "DataLoader: a GPU target needs a build with CUDA");
}
DeviceStage::~DeviceStage() = default;
int DeviceStage::slots() const { return 0; }
void* DeviceStage::host_buffer(int, std::size_t) {
  TG_FAIL_AS(UnsupportedError, "DataLoader: a GPU target needs a build with CUDA");
}
void DeviceStage::upload(int, const Shape&, DType, const Shape&, DType, Tensor&, Tensor&) {
  TG_FAIL_AS(UnsupportedError, "DataLoader: a GPU target needs a build with CUDA");
}
void DeviceStage::ready(int) { TG_FAIL_AS(UnsupportedError, "DataLoader: a GPU target needs a build with CUDA"); }

#endif

}  // namespace tg::data::detail
