// Experiment (not built by CMake): does compute-sanitizer memcheck follow allocations made inside
// a stream capture? It mimics a graphed training step: an eager phase that warms the default
// pool, buffers allocated before capture and read inside, a kept output, temporaries of several
// sizes freed inside, a device-to-pinned-host copy node, and replays that refill an input first.
// `scripts/gpu-check --probes` builds and runs it; the finding needs it under
// `compute-sanitizer --tool memcheck`. The open report it probes is described in
// docs/cuda_graphs.md ("Known issue").
#include <cstdio>
#include <cuda_runtime.h>
__global__ void fill(float* p, int n, float v) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = v + i; }
__global__ void add(float* o, const float* a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) o[i] += a[i]; }
int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const int sizes[] = {4, 4096, 65536, 1 << 20, 12, 300000, 8, 1 << 18};
  for (int r = 0; r < 3; ++r)  // eager: warm the default pool
    for (int sz : sizes) { float* t; cudaMallocAsync(&t, sz, s); fill<<<(sz / 4 + 255) / 256, 256, 0, s>>>(t, sz / 4, 1); cudaFreeAsync(t, s); }
  float* input; cudaMallocAsync(&input, 1 << 20, s);
  float* param; cudaMallocAsync(&param, 1 << 20, s);
  float* pinned; cudaMallocHost(&pinned, 64);
  cudaStreamSynchronize(s);
  cudaGraph_t g; cudaGraphExec_t e;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  float* out; cudaMallocAsync(&out, 4, s);
  for (int sz : sizes) {
    float* t; cudaMallocAsync(&t, sz, s);
    const int n = sz / 4;
    fill<<<(n + 255) / 256, 256, 0, s>>>(t, n, 2);
    add<<<(n + 255) / 256, 256, 0, s>>>(param, t, n < (1 << 18) ? n : (1 << 18));
    cudaFreeAsync(t, s);
  }
  add<<<1024, 256, 0, s>>>(param, input, 1 << 18);
  fill<<<1, 1, 0, s>>>(out, 1, 3);
  cudaMemcpyAsync(pinned, out, 4, cudaMemcpyDeviceToHost, s);
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiateWithFlags(&e, g, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  for (int i = 0; i < 5; ++i) {
    fill<<<1024, 256, 0, s>>>(input, 1 << 18, float(i));
    cudaGraphLaunch(e, s);
  }
  cudaStreamSynchronize(s);
  cudaFreeAsync(out, s);
  cudaStreamSynchronize(s);
  printf("probe done: %s (out %p)\n", cudaGetErrorString(cudaGetLastError()), (void*)out);
  return 0;
}
