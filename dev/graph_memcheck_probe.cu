// Experiment (not built by CMake): does compute-sanitizer memcheck follow allocations made inside
// a stream capture? It mimics a graphed training step: an eager phase that warms the default
// pool, buffers allocated before capture and read inside, a kept output, temporaries of several
// sizes freed inside, a device-to-pinned-host copy node, and replays that refill an input first.
// Then graphs whose second allocation may reuse the addresses of a first one freed before it.
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
  printf("first capture: %s (out %p)\n", cudaGetErrorString(cudaGetLastError()), (void*)out);

  // Address reuse inside one graph: a small buffer freed inside the capture, then a larger one
  // allocated after the free, which CUDA may place over the small one's addresses. Each kernel
  // writes exactly its own buffer, so any report here is the sanitizer's view of the reuse.
  const int pairs[][2] = {{4, 36864}, {4, 1 << 20}, {256, 65536}, {36864, 4}};
  for (const auto& pair : pairs) {
    cudaGraph_t g2; cudaGraphExec_t e2;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    float* first; cudaMallocAsync(&first, pair[0], s);
    fill<<<(pair[0] / 4 + 255) / 256, 256, 0, s>>>(first, pair[0] / 4, 1);
    cudaFreeAsync(first, s);
    float* second; cudaMallocAsync(&second, pair[1], s);
    fill<<<(pair[1] / 4 + 255) / 256, 256, 0, s>>>(second, pair[1] / 4, 2);
    cudaFreeAsync(second, s);
    cudaStreamEndCapture(s, &g2);
    cudaGraphInstantiateWithFlags(&e2, g2, cudaGraphInstantiateFlagAutoFreeOnLaunch);
    for (int i = 0; i < 3; ++i) cudaGraphLaunch(e2, s);
    cudaStreamSynchronize(s);
    const char* f = reinterpret_cast<const char*>(first);
    const char* sc = reinterpret_cast<const char*>(second);
    const bool overlap = f < sc + pair[1] && sc < f + pair[0];
    printf("reuse %6d then %7d bytes: first %p, second %p, ranges %s: %s\n", pair[0], pair[1], (void*)first,
           (void*)second, overlap ? "overlap" : "apart", cudaGetErrorString(cudaGetLastError()));
    cudaGraphExecDestroy(e2);
    cudaGraphDestroy(g2);
  }
  printf("probe done: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
