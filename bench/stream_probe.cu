// stream_probe: how fast the memory system moves workload B's traffic, with no arithmetic.
// The copy ceiling (cudaMemcpy, 1 byte read per byte written) is not the only floor: B's forward
// reads 1 byte per 2 written, its fused backward reads 3 per 1 written, and in NCHW every tile
// touches many short row segments, one per channel plane (4 MiB apart). Each pattern here moves
// exactly the bytes the convolution must move, so the best of them is the real floor a
// convolution kernel can be judged against.
//   tg_stream_probe [--repeats N]
//   tg_stream_probe --alloc-compare   # the same pattern on cudaMalloc vs stream-ordered pool memory,
//                                     # zero vs random data, every repeat in order
//   tg_stream_probe --sustained --repeats 60  # back-to-back repeats vs repeats 5 ms apart, in order
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#define PROBE_CHECK(call)                                                                         \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace {

// Contiguous streams: every float4 of src is read once and written `writes` times (to
// consecutive regions of dst), as in B's NHWC forward (writes = 2).
__global__ void stream_kernel(const float4* __restrict__ src, float4* __restrict__ dst, int64_t n4, int writes,
                              bool streaming_stores) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    float4 v = __ldcs(src + i);
    for (int r = 0; r < writes; ++r) {
      if (streaming_stores) __stcs(dst + r * n4 + i, v);
      else dst[r * n4 + i] = v;
    }
  }
}

// B's NCHW forward traffic: a tile of `tile` pixels of one image reads C rows of the input
// (planes HW apart) and writes K rows of the output. Threads of a row segment own one float4
// column each; the values written are sums of what was read, so no read can be skipped.
__global__ void nchw_tile_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t hw4, int C, int K,
                                 int tile4, int64_t tiles_per_image, int64_t tiles, bool streaming_stores) {
  const int col = threadIdx.x % tile4, lane_row = threadIdx.x / tile4, rows = blockDim.x / tile4;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t n = t / tiles_per_image, p = (t % tiles_per_image) * tile4 + col;
    float4 acc = make_float4(0, 0, 0, 0);
    for (int c = lane_row; c < C; c += rows) {
      float4 v = __ldcs(x + (n * C + c) * hw4 + p);
      acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
    for (int k = lane_row; k < K; k += rows) {
      float4* dst = y + (n * K + k) * hw4 + p;
      if (streaming_stores) __stcs(dst, acc);
      else *dst = acc;
    }
  }
}

// Non-zero, incompressible data (a hash of the index).
__global__ void fill_random_kernel(float* __restrict__ p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = static_cast<float>(h & 0xffffff) * (1.f / 16777216.f) - 0.5f;
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() { cudaEventCreate(&a); cudaEventCreate(&b); }
  ~Timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
};

template <typename F>
double median_ms(int repeats, F&& launch) {
  Timer t;
  launch();  // warm-up
  launch();
  std::vector<float> ms;
  for (int i = 0; i < repeats; ++i) {
    cudaEventRecord(t.a);
    launch();
    cudaEventRecord(t.b);
    PROBE_CHECK(cudaEventSynchronize(t.b));
    float m = 0;
    cudaEventElapsedTime(&m, t.a, t.b);
    ms.push_back(m);
  }
  PROBE_CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Every repeat's time, in order, of the NCHW-tile pattern (128 px, 256 threads) on buffers from
// cudaMalloc or from the device's stream-ordered pool (what tapegrad's tensors use), holding zeros
// or random data: the allocator (compressible memory?) and the data must not change the rate.
int alloc_compare(int sms, int repeats) {
  const int64_t N = 16, C = 64, K = 128, HW = int64_t(1) << 20, x_elems = N * C * HW, y_elems = N * K * HW;
  cudaStream_t stream;
  PROBE_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaMemPool_t pool;
  PROBE_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t threshold = UINT64_MAX;
  PROBE_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  for (bool from_pool : {false, true}) {
    for (bool random : {false, true}) {
      float *x = nullptr, *y = nullptr;
      if (from_pool) {
        PROBE_CHECK(cudaMallocAsync(&x, x_elems * 4, stream));
        PROBE_CHECK(cudaMallocAsync(&y, y_elems * 4, stream));
      } else {
        PROBE_CHECK(cudaMalloc(&x, x_elems * 4));
        PROBE_CHECK(cudaMalloc(&y, y_elems * 4));
      }
      if (random) fill_random_kernel<<<sms * 8, 256, 0, stream>>>(x, x_elems);
      else PROBE_CHECK(cudaMemsetAsync(x, 0, x_elems * 4, stream));
      const int64_t tpi = HW / 128, tiles = N * tpi;
      Timer t;
      std::printf("%-6s %-6s ms:", from_pool ? "pool" : "malloc", random ? "random" : "zeros");
      for (int i = 0; i < repeats; ++i) {
        cudaEventRecord(t.a, stream);
        nchw_tile_kernel<<<sms * 8, 256, 0, stream>>>(reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y),
                                                     HW / 4, int(C), int(K), 32, tpi, tiles, false);
        cudaEventRecord(t.b, stream);
        PROBE_CHECK(cudaEventSynchronize(t.b));
        float m = 0;
        cudaEventElapsedTime(&m, t.a, t.b);
        std::printf(" %.3f", m);
      }
      std::printf("\n");
      if (from_pool) {
        PROBE_CHECK(cudaFreeAsync(x, stream));
        PROBE_CHECK(cudaFreeAsync(y, stream));
        PROBE_CHECK(cudaStreamSynchronize(stream));
      } else {
        cudaFree(x);
        cudaFree(y);
      }
    }
  }
  return 0;
}

// Does the memory system slow down under sustained load? tg_bench's back-to-back repeats of B
// drift up by steps after ~40-70 ms (bench/journal/notes_conv1x1.md, round 5) while ncu, which leaves
// gaps between launches, times every launch the same. Here the copy and the NCHW-tile pattern
// run `repeats` times back to back (one event pair each, synchronized: a ~10 us host gap), then
// again with `gap_ms` of idle time before each launch; printed: every time in order.
int sustained(int sms, int repeats, int gap_ms) {
  const int64_t N = 16, C = 64, K = 128, HW = int64_t(1) << 20, x_elems = N * C * HW, y_elems = N * K * HW;
  float *x = nullptr, *y = nullptr;
  PROBE_CHECK(cudaMalloc(&x, x_elems * 4));
  PROBE_CHECK(cudaMalloc(&y, y_elems * 4));
  fill_random_kernel<<<sms * 8, 256>>>(x, x_elems);
  const int64_t tpi = HW / 128, tiles = N * tpi;
  auto copy = [&] { PROBE_CHECK(cudaMemcpyAsync(y, x, x_elems * 4, cudaMemcpyDeviceToDevice)); };
  auto nchw = [&] {
    nchw_tile_kernel<<<sms * 8, 256>>>(reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), HW / 4,
                                       int(C), int(K), 32, tpi, tiles, false);
  };
  Timer t;
  for (int pattern = 0; pattern < 2; ++pattern) {
    for (int gap : {0, gap_ms}) {
      PROBE_CHECK(cudaDeviceSynchronize());
      usleep(500 * 1000);  // start each series from an idle GPU
      std::printf("%-24s gap %2d ms, ms in order:", pattern == 0 ? "copy 4.3 GB" : "nchw tiles 128 px", gap);
      for (int i = 0; i < repeats; ++i) {
        if (gap > 0) usleep(gap * 1000);
        cudaEventRecord(t.a);
        if (pattern == 0) copy();
        else nchw();
        cudaEventRecord(t.b);
        PROBE_CHECK(cudaEventSynchronize(t.b));
        float m = 0;
        cudaEventElapsedTime(&m, t.a, t.b);
        std::printf(" %.3f", m);
      }
      std::printf("\n");
    }
  }
  PROBE_CHECK(cudaGetLastError());
  cudaFree(x);
  cudaFree(y);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 10;
  bool compare = false, sustain = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--alloc-compare")) compare = true;
    if (!std::strcmp(argv[i], "--sustained")) sustain = true;
  }
  cudaDeviceProp prop{};
  PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  if (compare) return alloc_compare(sms, repeats);
  if (sustain) return sustained(sms, repeats, 5);
  // Workload B: N = 16, C = 64, K = 128, H x W = 1024 x 1024.
  const int64_t N = 16, C = 64, K = 128, HW = int64_t(1) << 20;
  const int64_t x_elems = N * C * HW, y_elems = N * K * HW;
  float *x = nullptr, *y = nullptr;
  PROBE_CHECK(cudaMalloc(&x, x_elems * 4));
  PROBE_CHECK(cudaMalloc(&y, y_elems * 4));
  PROBE_CHECK(cudaMemset(x, 0, x_elems * 4));
  const double copy_bytes = double(x_elems) * 4 * 2;
  double copy_ms = median_ms(repeats, [&] { PROBE_CHECK(cudaMemcpyAsync(y, x, x_elems * 4, cudaMemcpyDeviceToDevice)); });
  const double copy_gbps = copy_bytes / copy_ms / 1e6;
  std::printf("GPU: %s, %d SMs\n", prop.name, sms);
  std::printf("%-44s %8s %9s %7s\n", "pattern (bytes of workload B's forward)", "ms", "GB/s", "%copy");
  std::printf("%-44s %8.3f %9.0f %6.1f%%\n", "cudaMemcpy 4.3 GB (read 1 : write 1)", copy_ms, copy_gbps, 100.0);
  const double fwd_bytes = double(x_elems + y_elems) * 4;
  auto report = [&](const std::string& name, double ms) {
    std::printf("%-44s %8.3f %9.0f %6.1f%%\n", name.c_str(), ms, fwd_bytes / ms / 1e6, 100.0 * fwd_bytes / ms / 1e6 / copy_gbps);
  };
  for (bool cs : {false, true}) {
    for (int blocks_per_sm : {4, 8, 16}) {
      const int64_t n4 = x_elems / 4;
      double ms = median_ms(repeats, [&] {
        stream_kernel<<<sms * blocks_per_sm, 256>>>(reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), n4, 2, cs);
      });
      report("stream read 1 : write 2, " + std::to_string(blocks_per_sm) + " blk/SM" + (cs ? ", st.cs" : ""), ms);
    }
  }
  for (bool cs : {false, true}) {
    for (int tile : {128, 256, 512}) {
      for (int threads : {256, 512}) {
        const int tile4 = tile / 4;
        if (threads < tile4) continue;
        const int64_t tpi = HW / tile, tiles = N * tpi;
        double ms = median_ms(repeats, [&] {
          nchw_tile_kernel<<<sms * (2048 / threads), threads>>>(reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y),
                                                               HW / 4, int(C), int(K), tile4, tpi, tiles, cs);
        });
        report("nchw tiles of " + std::to_string(tile) + " px, " + std::to_string(threads) + " thr" + (cs ? ", st.cs" : ""), ms);
      }
    }
  }
  cudaFree(x);
  cudaFree(y);
  return 0;
}
