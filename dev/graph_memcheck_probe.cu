// Experiment (not built by CMake): does compute-sanitizer memcheck follow allocations made inside
// a stream capture? It mimics a graphed training step: an eager phase that warms the default
// pool, buffers allocated before capture and read inside, a kept output, temporaries of several
// sizes freed inside, a device-to-pinned-host copy node, and replays that refill an input first.
// Then graphs whose second allocation may reuse the addresses of a first one freed before it,
// and graphs that end as a training step does: a temporary freed, then an output kept.
// `scripts/gpu-check --probes` builds and runs it; the finding needs it under
// `compute-sanitizer --tool memcheck`: the last part is reported there (the kept output lands
// on the freed temporary's address and memcheck flags the temporary's fill kernel), while the
// sums come out exact. docs/cuda_graphs.md ("compute-sanitizer memcheck and graph allocations").
#include <cstdio>
#include <cuda_runtime.h>
__global__ void fill(float* p, int n, float v) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = v + i; }
__global__ void add(float* o, const float* a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) o[i] += a[i]; }
__global__ void sum_into(float* out, const float* a, int n) {
  __shared__ double part[256];
  double t = 0;
  for (int i = threadIdx.x; i < n; i += 256) t += a[i];
  part[threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.x == 0) { for (int i = 1; i < 256; ++i) t += part[i]; out[0] += float(t); }
}
__global__ void copy_one(float* o, const float* a) { o[0] = a[0]; }
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

  // As a graphed training step ends: a temporary freed inside the graph, then a small output
  // that outlives the graph (the loss), which may take the temporary's addresses; each launch
  // auto-frees the previous launch's output. sum_into checks the temporary's contents.
  for (int big : {36864, 1 << 20}) {
    cudaGraph_t g3; cudaGraphExec_t e3;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    float* temp; cudaMallocAsync(&temp, big, s);
    fill<<<(big / 4 + 255) / 256, 256, 0, s>>>(temp, big / 4, 0);
    float* partial; cudaMallocAsync(&partial, 4, s);
    fill<<<1, 1, 0, s>>>(partial, 1, 0);
    sum_into<<<1, 256, 0, s>>>(partial, temp, big / 4);
    cudaFreeAsync(temp, s);
    float* loss; cudaMallocAsync(&loss, 4, s);
    copy_one<<<1, 1, 0, s>>>(loss, partial);
    cudaFreeAsync(partial, s);
    cudaStreamEndCapture(s, &g3);
    cudaGraphInstantiateWithFlags(&e3, g3, cudaGraphInstantiateFlagAutoFreeOnLaunch);
    float got = 0;
    for (int i = 0; i < 3; ++i) {
      cudaGraphLaunch(e3, s);
      cudaMemcpyAsync(&got, loss, 4, cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
    }
    const double n = big / 4, want = n * (n - 1) / 2;  // fill(temp, n, 0) writes 0, 1, ..., n - 1
    const char* t = reinterpret_cast<const char*>(temp);
    const char* l = reinterpret_cast<const char*>(loss);
    printf("escaping output after a %7d-byte temporary: temp %p, loss %p (%s), sum %.6g of %.6g: %s\n", big,
           (void*)temp, (void*)loss, l >= t && l < t + big ? "inside the temporary's range" : "apart", got, want,
           cudaGetErrorString(cudaGetLastError()));
    cudaFree(loss);
    cudaGraphExecDestroy(e3);
    cudaGraphDestroy(g3);
  }
  printf("probe done: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
