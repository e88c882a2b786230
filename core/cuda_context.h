// CUDA-only helpers shared by the .cu files and the storage: the framework's stream per
// device, and the check macros. Included only where TG_CUDA is on.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "error.h"

namespace tg::detail {
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, cudaError_t err);
}

#define TG_CUDA_CHECK(call)                                                          \
  do {                                                                               \
    cudaError_t tg_err_ = (call);                                                    \
    if (tg_err_ != cudaSuccess) ::tg::detail::throw_cuda_error(__FILE__, __LINE__, #call, tg_err_); \
  } while (0)

// After every kernel launch: catches bad configurations at the launch site.
#define TG_LAUNCH_CHECK() TG_CUDA_CHECK(cudaGetLastError())

namespace tg::cuda {

// The framework's stream on the given device (created on first use, non-blocking).
// Every kernel, copy and allocation of that device is ordered on it.
cudaStream_t stream(int device);

// Makes `device` current for the calling thread.
void set_device(int device);

// Lets `kernel` launch with up to `bytes` of dynamic shared memory on the current device, and
// with max_shared_carveout also prefer the largest shared-memory carveout. Launchers call it
// before every launch; the driver is asked once per kernel, device and setting (an attribute
// call otherwise costs host time at each launch).
void allow_dynamic_smem(const void* kernel, int bytes, bool max_shared_carveout = false);
template <class... Args>
void allow_dynamic_smem(void (*kernel)(Args...), int bytes, bool max_shared_carveout = false) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes, max_shared_carveout);
}

// Grid size for a grid-stride loop over n elements: enough blocks to fill the GPU.
inline unsigned grid_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = 132 * 32;  // a few waves of every SM; grid-stride loops cover the rest
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

// The loop every elementwise kernel runs over n elements with a grid from grid_for:
// 64-bit indices, because tensors of 2^31 elements and more are in scope.
#define TG_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

}  // namespace tg::cuda
