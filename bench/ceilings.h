// The machine's measured ceilings, against which every row is judged: copy bandwidth (a
// large device-to-device copy: bytes read + written per second) and the FP32 and TF32 matrix
// rates of cuBLAS on an 8192^3 GEMM. Measured once, on the benchmark's own stream.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "core/cuda_context.h"
#include "gpu_timer.h"

namespace bench {

#define BENCH_CUBLAS_CHECK(call)                                                        \
  do {                                                                                  \
    cublasStatus_t st_ = (call);                                                        \
    TG_CHECK(st_ == CUBLAS_STATUS_SUCCESS, #call, " failed with cuBLAS status ", int(st_)); \
  } while (0)

struct Ceilings {
  std::string gpu;
  double copy_gbps = 0;    // bytes read + written per second, 1e9
  double fp32_tflops = 0;  // cuBLAS SGEMM, FP32 math
  double tf32_tflops = 0;  // cuBLAS GEMM with TF32 tensor-core math
};

// A raw device buffer for the measurements (they must not go through the framework).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { TG_CUDA_CHECK(cudaMalloc(&p_, bytes)); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

inline Ceilings measure_ceilings(int device, int repeats) {
  Ceilings c;
  cudaDeviceProp prop{};
  TG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  c.gpu = prop.name;
  TG_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream;
  TG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    const size_t bytes = size_t(2) << 30;  // 2 GiB: far beyond any cache
    DeviceBuffer src(bytes), dst(bytes);
    TG_CUDA_CHECK(cudaMemsetAsync(src.get(), 1, bytes, stream));
    Timing t = measure(stream, 2, repeats, [&](EventPair& e) {
      e.start();
      TG_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
      e.stop();
    });
    c.copy_gbps = 2.0 * double(bytes) / (t.median_ms * 1e-3) / 1e9;
  }
  {
    const int n = 8192;
    const size_t bytes = size_t(n) * n * sizeof(float);
    DeviceBuffer a(bytes), b(bytes), out(bytes);
    // Small values keep the products finite; what they are does not change the rate.
    TG_CUDA_CHECK(cudaMemsetAsync(a.get(), 0x3c, bytes, stream));
    TG_CUDA_CHECK(cudaMemsetAsync(b.get(), 0x3c, bytes, stream));
    cublasHandle_t handle;
    BENCH_CUBLAS_CHECK(cublasCreate(&handle));
    BENCH_CUBLAS_CHECK(cublasSetStream(handle, stream));
    const float one = 1, zero = 0;
    auto rate = [&](cublasComputeType_t compute) {
      Timing t = measure(stream, 2, repeats, [&](EventPair& e) {
        e.start();
        BENCH_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.get(), CUDA_R_32F, n,
                                        b.get(), CUDA_R_32F, n, &zero, out.get(), CUDA_R_32F, n, compute,
                                        CUBLAS_GEMM_DEFAULT));
        e.stop();
      });
      return 2.0 * double(n) * n * n / (t.median_ms * 1e-3) / 1e12;
    };
    c.fp32_tflops = rate(CUBLAS_COMPUTE_32F);
    c.tf32_tflops = rate(CUBLAS_COMPUTE_32F_FAST_TF32);
    cublasDestroy(handle);
  }
  TG_CUDA_CHECK(cudaStreamSynchronize(stream));
  TG_CUDA_CHECK(cudaStreamDestroy(stream));
  return c;
}

}  // namespace bench
