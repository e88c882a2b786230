// Gradient clipping on one GPU, over every grad at once. The grads are described by a table
// of (address, first index, length, dtype) entries in device memory: the kernels see the
// grads as one virtual vector of `total` elements, and each block walks the entries that
// overlap its contiguous range of it. So one launch covers any number of parameters, and
// which thread reads which element depends on the sizes alone (never on timing): the norm
// is reduced in a fixed order (per-block partials in double, then one block in index
// order) and is the same bit for bit on every run.
//
// Kernels: norm_partials -> norm_final (writes the norm and the scale to apply, 1 when
// none) -> apply (multiplies by that scale read on the device, so the host queues all three
// without waiting; or clamps, for clip_grad_value). The host then waits once, for the norm.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/cuda_context.h"
#include "core/cuda_graph.h"
#include "nn/optim/clip.h"
#include "ops/cuda/arch/block_reduce.cuh"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kFinalThreads = 1024;
constexpr int64_t kMaxPartials = 1024;    // norm blocks: a function of the total size only
constexpr int64_t kNormPerBlock = 16384;  // at least this many elements per norm block
constexpr int64_t kApplyChunk = 8192;     // elements per block of the apply kernel

struct Segment {
  void* data;
  int64_t begin;  // index of its first element in the virtual vector
  int64_t n;
  int64_t is_f64;
};

enum class Norm : int { kSquares, kAbs, kPow, kMax };

using Sum = SumOp;
// The max that keeps NaN (fmax would drop it, and a NaN grad would go unnoticed).
struct MaxNan {
  __device__ double operator()(double a, double b) const { return (a > b || a != a) ? a : b; }
};


// The last segment whose begin <= i (segments are sorted by begin, none empty).
__device__ int find_segment(const Segment* segs, int count, int64_t i) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (segs[mid].begin <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Calls f(pointer, local index) (pointer typed float* or double*) for the elements of
// [begin, end) of the virtual vector, threads of the block striding through each segment.
template <class F>
__device__ void for_each_in_range(const Segment* segs, int count, int64_t begin, int64_t end, F&& f) {
  for (int k = find_segment(segs, count, begin); k < count && segs[k].begin < end; ++k) {
    const Segment s = segs[k];
    const int64_t lo = (begin > s.begin ? begin : s.begin) - s.begin;
    const int64_t hi = (end < s.begin + s.n ? end : s.begin + s.n) - s.begin;
    if (s.is_f64) {
      double* p = static_cast<double*>(s.data);
      for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) f(p, i);
    } else {
      float* p = static_cast<float*>(s.data);
      for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) f(p, i);
    }
  }
}

__global__ void norm_partials_kernel(double* __restrict__ partials, const Segment* __restrict__ segs, int count,
                                     int64_t total, int64_t per_block, Norm kind, double p) {
  const int64_t begin = blockIdx.x * per_block;
  const int64_t end = begin + per_block < total ? begin + per_block : total;
  double acc = 0;  // the identity of both the sum and the max of magnitudes
  if (begin < end) {
    for_each_in_range(segs, count, begin, end, [&](auto* g, int64_t i) {
      const double a = fabs(double(g[i]));
      switch (kind) {
        case Norm::kSquares: acc += a * a; break;
        case Norm::kAbs: acc += a; break;
        case Norm::kPow: acc += pow(a, p); break;
        case Norm::kMax: acc = MaxNan{}(acc, a); break;
      }
    });
  }
  acc = kind == Norm::kMax ? block_reduce(acc, MaxNan{}, 0.0) : block_reduce(acc, Sum{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// result[0] = the norm, result[1] = the scale to apply (1: leave the grads as they are).
__global__ void norm_final_kernel(double* __restrict__ result, const double* __restrict__ partials, int64_t n,
                                  Norm kind, double p, double max_norm) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc = kind == Norm::kMax ? MaxNan{}(acc, partials[i]) : acc + partials[i];
  acc = kind == Norm::kMax ? block_reduce(acc, MaxNan{}, 0.0) : block_reduce(acc, Sum{}, 0.0);
  if (threadIdx.x == 0) {
    const double norm = kind == Norm::kMax ? acc : kind == Norm::kSquares ? sqrt(acc) : kind == Norm::kAbs ? acc
                                                                                         : pow(acc, 1.0 / p);
    const double scale = max_norm / (norm + 1e-6);
    result[0] = norm;
    result[1] = isfinite(norm) && scale < 1 ? scale : 1.0;
  }
}

// Multiplies by *scale (read here: the host never saw it), or with scale == nullptr clamps
// into [-clip, clip] (NaN stays NaN, as torch.clamp).
__global__ void apply_kernel(const Segment* __restrict__ segs, int count, int64_t total,
                             const double* __restrict__ scale, double clip) {
  const double s = scale ? *scale : 0.0;
  if (scale && s == 1.0) return;  // nothing to clip: the grads stay bit for bit
  const int64_t chunks = (total + kApplyChunk - 1) / kApplyChunk;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t begin = c * kApplyChunk, end = begin + kApplyChunk < total ? begin + kApplyChunk : total;
    for_each_in_range(segs, count, begin, end, [&](auto* g, int64_t i) {
      using T = std::remove_reference_t<decltype(*g)>;
      if (scale) {
        g[i] = g[i] * static_cast<T>(s);  // the CPU multiplies by the same rounded scale
      } else {
        const T c_t = static_cast<T>(clip), v = g[i];
        g[i] = v < -c_t ? -c_t : v > c_t ? c_t : v;
      }
    });
  }
}

// Pinned host buffers the segment tables are copied from, a few per device used in turn:
// a buffer is rewritten only after the copy that last read it has run (its event), which
// was queued kRing calls ago, so the host practically never waits here. (A copy from
// pageable memory may wait for the stream.) A buffer grows when a call needs more entries:
// the only time this allocates pinned memory.
constexpr int kRing = 4;
struct Staging {
  std::mutex mutex;
  int next = 0;
  Segment* host[kRing] = {};
  size_t capacity[kRing] = {};
  cudaEvent_t copied[kRing] = {};
};

Staging& staging(int device) {
  static Staging all[kMaxCudaDevices];
  TG_CHECK(device >= 0 && device < kMaxCudaDevices, "clip_grad: device index ", device, " out of range");
  return all[device];
}

// The segment table of `grads` in device memory (a tensor freed stream-ordered after use).
Tensor upload_segments(int device, const std::vector<Tensor>& grads, int64_t& total) {
  total = 0;
  Staging& st = staging(device);
  std::lock_guard<std::mutex> lock(st.mutex);
  const int slot = st.next;
  st.next = (st.next + 1) % kRing;
  if (st.copied[slot] == nullptr) TG_CUDA_CHECK(cudaEventCreateWithFlags(&st.copied[slot], cudaEventDisableTiming));
  TG_CUDA_CHECK(cudaEventSynchronize(st.copied[slot]));  // the copy that last read this buffer
  if (st.capacity[slot] < grads.size()) {
    if (st.host[slot]) TG_CUDA_CHECK(cudaFreeHost(st.host[slot]));
    st.host[slot] = nullptr;
    st.capacity[slot] = 0;
    const size_t want = std::max<size_t>(grads.size(), 256);
    TG_CUDA_CHECK(cudaMallocHost(&st.host[slot], want * sizeof(Segment)));
    st.capacity[slot] = want;
  }
  Segment* segs = st.host[slot];
  for (size_t k = 0; k < grads.size(); ++k) {
    const Tensor& g = grads[k];
    TG_CHECK(g.device() == Device::cuda(device), "clip_grad: grad ", describe(g), " is not on cuda:", device);
    segs[k] = {g.raw_data(), total, g.numel(), g.dtype() == DType::f64 ? 1 : 0};
    total += g.numel();
  }
  static_assert(sizeof(Segment) == 4 * sizeof(int64_t));
  Tensor table = Tensor::empty({int64_t(grads.size()) * 4}, {.dtype = DType::i64, .device = Device::cuda(device)});
  TG_CUDA_CHECK(cudaMemcpyAsync(table.raw_data(), segs, grads.size() * sizeof(Segment), cudaMemcpyHostToDevice,
                                stream(device)));
  TG_CUDA_CHECK(cudaEventRecord(st.copied[slot], stream(device)));
  return table;
}

void launch_apply(int device, const Tensor& table, int count, int64_t total, const double* scale, double clip) {
  const int64_t chunks = (total + kApplyChunk - 1) / kApplyChunk;
  const unsigned blocks = grid_for(chunks, 1);
  apply_kernel<<<blocks, kThreads, 0, stream(device)>>>(static_cast<const Segment*>(table.raw_data()), count,
                                                       total, scale, clip);
  TG_LAUNCH_CHECK();
}

}  // namespace

double clip_grad_norm(int device, const std::vector<Tensor>& grads, double max_norm, double norm_type) {
  fail_if_capturing("clip_grad_norm_", device, "it returns the norm to the host");
  if (grads.empty()) return 0.0;
  set_device(device);
  cudaStream_t s = stream(device);
  int64_t total = 0;
  const Tensor table = upload_segments(device, grads, total);
  const int count = static_cast<int>(grads.size());
  const Norm kind = std::isinf(norm_type) ? Norm::kMax : norm_type == 2 ? Norm::kSquares
                    : norm_type == 1      ? Norm::kAbs
                                          : Norm::kPow;
  int64_t blocks = (total + kNormPerBlock - 1) / kNormPerBlock;
  if (blocks > kMaxPartials) blocks = kMaxPartials;
  const int64_t per_block = (total + blocks - 1) / blocks;
  Tensor scratch = Tensor::empty({blocks + 2}, {.dtype = DType::f64, .device = Device::cuda(device)});
  double* result = scratch.data<double>();  // [norm, scale], then the partials
  double* partials = result + 2;
  const Segment* segs = static_cast<const Segment*>(table.raw_data());
  norm_partials_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(partials, segs, count, total, per_block,
                                                                         kind, norm_type);
  TG_LAUNCH_CHECK();
  norm_final_kernel<<<1, kFinalThreads, 0, s>>>(result, partials, blocks, kind, norm_type, max_norm);
  TG_LAUNCH_CHECK();
  launch_apply(device, table, count, total, result + 1, 0.0);
  double norm = 0;
  TG_CUDA_CHECK(cudaMemcpyAsync(&norm, result, sizeof(double), cudaMemcpyDeviceToHost, s));
  TG_CUDA_CHECK(cudaStreamSynchronize(s));  // the one wait: the caller gets the norm
  return norm;
}

void clip_grad_value(int device, const std::vector<Tensor>& grads, double clip_value) {
  // Its segment table is staged through pinned buffers that the host recycles by waiting.
  fail_if_capturing("clip_grad_value_", device, "it stages its table through host memory");
  if (grads.empty()) return;
  set_device(device);
  int64_t total = 0;
  const Tensor table = upload_segments(device, grads, total);
  launch_apply(device, table, static_cast<int>(grads.size()), total, nullptr, clip_value);
}

}  // namespace tg::cuda
