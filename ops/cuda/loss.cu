// CUDA kernels of the losses. Reductions are two-stage and fixed-order (per-block partials
// in double, reduced by one block in index order), so the loss is the same bit for bit on
// every run.
//
// mse_loss     : grid-stride partial sums of (p - t)^2, then one block reduces the partials.
// pointwise   : bce_with_logits, l1, smooth_l1, huber (formulas in ops/loss_pointwise.h).
//                Reduced: like mse_loss, each element's loss in double. none: one pass in
//                the tensor's type. Backward: one pass writing both gradients.
// cross_entropy: one block per row (max, then sum of exp, both block reductions) writes the
//                row's log-sum-exp and loss; one block then averages the row losses.
//
// Target validation without a host sync: checking the targets on the host would copy them
// back and wait for the device at every call, i.e. once per training step. Instead the row
// kernel checks each target where it reads it: a bad one makes its row's loss (hence the
// loss) NaN, never an out-of-bounds read, and the first bad (row, target) is recorded in a
// small per-device record. After the kernels, the record is copied asynchronously into
// pinned host memory, followed by an event. The copy is inspected without waiting at the
// start of the next cross_entropy_forward on that device (if its event has completed), and
// with waiting by tg::check_errors(device); either throws tg::Error naming the target.
// Inside a CUDA graph capture (core/cuda_graph.h) the kernels and the copy into pinned
// memory are captured as they are; the host-side steps move to the Graph's replay: before
// each launch the previous copy is inspected as above, after it the event is recorded.
#include <atomic>
#include <cmath>
#include <mutex>

#include "core/cuda_context.h"
#include "core/cuda_graph.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/arch/block_reduce.cuh"
#include "ops/cuda/loss.h"
#include "ops/loss_pointwise.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kFinalThreads = 1024;
constexpr int64_t kMaxPartials = 1024;  // stage-one blocks: a function of n only (determinism)
constexpr unsigned kMaxRowBlocks = 65535u * 8;

using Sum = SumOp;
struct Max {
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};


int threads_for(int64_t n) {
  int64_t t = (n + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : t > kThreads ? kThreads : t);
}

template <class T>
__global__ void mse_partials_kernel(double* __restrict__ partials, const T* __restrict__ p,
                                    const T* __restrict__ t, int64_t n) {
  double acc = 0;
  TG_GRID_STRIDE(i, n) {
    const double d = double(p[i]) - double(t[i]);
    acc += d * d;
  }
  acc = block_reduce(acc, Sum{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// out[0] = scale * sum(values[0..n)), by one block in a fixed order.
template <class T>
__global__ void final_sum_kernel(T* __restrict__ out, const double* __restrict__ values, int64_t n, double scale) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += values[i];
  acc = block_reduce(acc, Sum{}, 0.0);
  if (threadIdx.x == 0) out[0] = static_cast<T>(acc * scale);
}

template <class T>
__global__ void mse_backward_kernel(T* __restrict__ dp, T* __restrict__ dt, const T* __restrict__ grad_out,
                                    const T* __restrict__ p, const T* __restrict__ t, int64_t n) {
  const T k = static_cast<T>(2.0 * double(grad_out[0]) / double(n));
  TG_GRID_STRIDE(i, n) {
    const T g = k * (p[i] - t[i]);
    if (dp) dp[i] = g;
    if (dt) dt[i] = -g;
  }
}

template <class T>
__global__ void pointwise_partials_kernel(double* __restrict__ partials, const T* __restrict__ x,
                                          const T* __restrict__ y, int64_t n, PointwiseLoss kind, double beta) {
  double acc = 0;
  TG_GRID_STRIDE(i, n) acc += pointwise_loss_value<double>(double(x[i]), double(y[i]), kind, beta);
  acc = block_reduce(acc, Sum{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

template <class T>
__global__ void pointwise_none_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ y,
                                      int64_t n, PointwiseLoss kind, T beta) {
  TG_GRID_STRIDE(i, n) out[i] = pointwise_loss_value<T>(x[i], y[i], kind, beta);
}

// g: one element (scaled by `scale`, 1/n for the mean) or, with per_element, one per element.
template <class T>
__global__ void pointwise_backward_kernel(T* __restrict__ dx, T* __restrict__ dy, const T* __restrict__ g,
                                          bool per_element, double scale, const T* __restrict__ x,
                                          const T* __restrict__ y, int64_t n, PointwiseLoss kind, T beta) {
  const T k = per_element ? T(0) : static_cast<T>(double(g[0]) * scale);
  TG_GRID_STRIDE(i, n) {
    const T gi = per_element ? g[i] : k;
    if (dx) dx[i] = gi * pointwise_loss_dpred<T>(x[i], y[i], kind, beta);
    if (dy) dy[i] = gi * pointwise_loss_dtarget<T>(x[i], y[i], kind, beta);
  }
}

// The first out-of-range target a row kernel met; state 0 = none, 1 = being written, 2 = written.
struct TargetRecord {
  int state;
  long long row, target, classes;
};

template <class T>
__global__ void ce_rows_kernel(double* __restrict__ row_loss, double* __restrict__ lse, const T* __restrict__ x,
                               const int64_t* __restrict__ targets, int64_t N, int64_t K,
                               TargetRecord* __restrict__ bad) {
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T* row = x + r * K;  // (K)
    double m = -INFINITY;
    for (int64_t j = threadIdx.x; j < K; j += blockDim.x) m = fmax(m, double(row[j]));
    m = block_reduce(m, Max{}, -INFINITY);
    const T m_t = static_cast<T>(m);  // exact: m is one of the row's values
    double s = 0;
    for (int64_t j = threadIdx.x; j < K; j += blockDim.x) s += double(exp(row[j] - m_t));
    s = block_reduce(s, Sum{}, 0.0);
    if (threadIdx.x == 0) {
      const double l = m + log(s);
      const int64_t t = targets[r];
      lse[r] = l;
      const bool ok = t >= 0 && t < K;
      row_loss[r] = ok ? l - double(row[t]) : NAN;  // never read out of bounds
      if (!ok && atomicCAS(&bad->state, 0, 1) == 0) {  // the first bad row fills the record
        bad->row = r;
        bad->target = t;
        bad->classes = K;
        __threadfence();
        atomicExch(&bad->state, 2);
      }
    }
  }
}

template <class T>
__global__ void ce_backward_kernel(T* __restrict__ dx, const T* __restrict__ grad_out, const T* __restrict__ x,
                                   const int64_t* __restrict__ targets, const double* __restrict__ lse,
                                   int64_t N, int64_t K) {
  const T k = static_cast<T>(double(grad_out[0]) / double(N));
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const double l = lse[r];
    const int64_t t = targets[r];
    for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
      // x - lse is small in magnitude, so rounding it to T costs little; exp then runs in T.
      const T softmax = exp(static_cast<T>(double(x[r * K + j]) - l));
      dx[r * K + j] = k * (softmax - (j == t ? T(1) : T(0)));
    }
  }
}

unsigned row_blocks(int64_t N) { return static_cast<unsigned>(N < kMaxRowBlocks ? N : kMaxRowBlocks); }

// One per device, created on first use and kept for the process (a few bytes each).
struct TargetCheck {
  std::mutex mutex;
  TargetRecord* device_record = nullptr;  // written by ce_rows_kernel, zeroed after a report
  TargetRecord* host_copy = nullptr;      // pinned: the asynchronous copy lands here
  cudaEvent_t copied = nullptr;           // recorded after the latest copy
  bool pending = false;                   // a copy was queued and not inspected yet
};

TargetCheck& target_check(int dev) {
  static TargetCheck checks[kMaxCudaDevices];
  static std::once_flag once[kMaxCudaDevices];
  static std::atomic<bool> made[kMaxCudaDevices];
  TG_CHECK(dev >= 0 && dev < kMaxCudaDevices, "cross_entropy: device index ", dev, " out of range");
  // Its buffers come from cudaMalloc and a synchronous memset, which a capture forbids.
  TG_CHECK_AS(CaptureError, made[dev].load() || !capturing(dev),
              "cross_entropy cannot be captured into a CUDA graph on its first call on cuda:", dev,
              " (it allocates its target-check buffers then): run one eager step before capture");
  std::call_once(once[dev], [dev] {
    TargetCheck& c = checks[dev];
    set_device(dev);
    TG_CUDA_CHECK(cudaMalloc(&c.device_record, sizeof(TargetRecord)));
    TG_CUDA_CHECK(cudaMemset(c.device_record, 0, sizeof(TargetRecord)));
    TG_CUDA_CHECK(cudaMallocHost(&c.host_copy, sizeof(TargetRecord)));
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&c.copied, cudaEventDisableTiming));
    made[dev].store(true);
  });
  return checks[dev];
}

// Throws if the latest inspected copy holds a bad target (and clears the record so the error
// is reported once). With `wait` false, a copy still in flight is left for a later check.
// Called with c.mutex held.
void inspect(TargetCheck& c, int dev, bool wait) {
  if (!c.pending) return;
  if (wait) {
    TG_CUDA_CHECK(cudaEventSynchronize(c.copied));
  } else {
    const cudaError_t e = cudaEventQuery(c.copied);
    if (e == cudaErrorNotReady) return;
    TG_CUDA_CHECK(e);
  }
  c.pending = false;
  const TargetRecord r = *c.host_copy;
  if (r.state != 2) return;
  TG_CUDA_CHECK(cudaMemsetAsync(c.device_record, 0, sizeof(TargetRecord), stream(dev)));
  TG_FAIL("cross_entropy: target ", r.target, " at row ", r.row, " is out of range [0, ", r.classes,
          ") (found on cuda:", dev, " by the kernel; the loss of that call was NaN)");
}

}  // namespace

void check_target_errors(int device, bool wait) {
  TargetCheck& c = target_check(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  inspect(c, device, wait);
}

void mse_loss_forward(const Tensor& out, const Tensor& pred, const Tensor& target) {
  check_mse_buffers("mse_loss_forward", pred, target, out);
  const int64_t n = pred.numel();
  TG_CHECK(n > 0, "mse_loss_forward: empty prediction ", describe(pred));
  const int dev = pred.device().index;
  set_device(dev);
  cudaStream_t s = stream(dev);
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxPartials) blocks = kMaxPartials;
  Tensor partials = Tensor::empty({blocks}, {.dtype = DType::f64, .device = pred.device()});
  dispatch_floating("loss (CUDA)", pred.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    mse_partials_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        partials.data<double>(), pred.data<T>(), target.data<T>(), n);
    TG_LAUNCH_CHECK();
    final_sum_kernel<T><<<1, kFinalThreads, 0, s>>>(out.data<T>(), partials.data<double>(), blocks, 1.0 / double(n));
    TG_LAUNCH_CHECK();
  });
}

void mse_loss_backward(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                       const Tensor& pred, const Tensor& target) {
  check_mse_backward_buffers(dpred, dtarget, grad_out, pred, target);
  const int64_t n = pred.numel();
  if (n == 0 || (!dpred.defined() && !dtarget.defined())) return;
  const int dev = pred.device().index;
  set_device(dev);
  dispatch_floating("loss (CUDA)", pred.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    mse_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(
        dpred.defined() ? dpred.data<T>() : nullptr, dtarget.defined() ? dtarget.data<T>() : nullptr,
        grad_out.data<T>(), pred.data<T>(), target.data<T>(), n);
  });
  TG_LAUNCH_CHECK();
}

void cross_entropy_forward(const Tensor& out, const Tensor& lse, const Tensor& logits, const Tensor& targets) {
  check_cross_entropy_buffers("cross_entropy_forward", logits, targets, lse, out);
  const int64_t N = logits.size(0), K = logits.size(1);
  TG_CHECK(N > 0 && K > 0, "cross_entropy_forward: empty logits ", describe(logits));
  const int dev = logits.device().index;
  set_device(dev);
  cudaStream_t s = stream(dev);
  TargetCheck& check = target_check(dev);
  std::lock_guard<std::mutex> lock(check.mutex);
  const bool captured = capturing(dev);
  if (!captured) inspect(check, dev, /*wait=*/false);  // an earlier call's bad target, if its copy has landed
  Tensor row_loss = Tensor::empty({N}, {.dtype = DType::f64, .device = logits.device()});
  dispatch_floating("loss (CUDA)", logits.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    ce_rows_kernel<T><<<row_blocks(N), threads_for(K), 0, s>>>(row_loss.data<double>(), lse.data<double>(),
                                                                 logits.data<T>(), targets.data<int64_t>(), N, K,
                                                                 check.device_record);
    TG_LAUNCH_CHECK();
    final_sum_kernel<T><<<1, kFinalThreads, 0, s>>>(out.data<T>(), row_loss.data<double>(), N, 1.0 / double(N));
    TG_LAUNCH_CHECK();
  });
  // Pinned destination: the copy is asynchronous, the host does not wait here.
  TG_CUDA_CHECK(cudaMemcpyAsync(check.host_copy, check.device_record, sizeof(TargetRecord),
                                cudaMemcpyDeviceToHost, s));
  if (captured) {
    // An event recorded now would belong to the capture; the replay records it instead.
    on_replay(
        dev,
        [&check, dev] {
          std::lock_guard<std::mutex> guard(check.mutex);
          inspect(check, dev, /*wait=*/false);
        },
        [&check, s] {
          std::lock_guard<std::mutex> guard(check.mutex);
          TG_CUDA_CHECK(cudaEventRecord(check.copied, s));
          check.pending = true;
        });
    return;
  }
  TG_CUDA_CHECK(cudaEventRecord(check.copied, s));
  check.pending = true;
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& grad_out, const Tensor& logits,
                            const Tensor& targets, const Tensor& lse) {
  check_cross_entropy_backward_buffers(dlogits, grad_out, logits, targets, lse);
  const int64_t N = logits.size(0), K = logits.size(1);
  if (N == 0 || K == 0) return;
  const int dev = logits.device().index;
  set_device(dev);
  dispatch_floating("loss (CUDA)", logits.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    ce_backward_kernel<T><<<row_blocks(N), threads_for(K), 0, stream(dev)>>>(
        dlogits.data<T>(), grad_out.data<T>(), logits.data<T>(), targets.data<int64_t>(), lse.data<double>(), N, K);
  });
  TG_LAUNCH_CHECK();
}

void pointwise_loss_forward(const Tensor& out, const Tensor& pred, const Tensor& target,
                            const PointwiseLossParams& p) {
  const char* op = pointwise_loss_name(p.kind);
  check_pointwise_loss_buffers(op, out, pred, target, p);
  const int64_t n = pred.numel();
  TG_CHECK(n > 0 || p.reduction != Reduction::mean, op, ": the mean of an empty prediction ", describe(pred),
           " is undefined");
  const int dev = pred.device().index;
  set_device(dev);
  cudaStream_t s = stream(dev);
  dispatch_floating("loss (CUDA)", pred.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    if (p.reduction == Reduction::none) {
      if (n == 0) return;
      pointwise_none_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(out.data<T>(), pred.data<T>(),
                                                                           target.data<T>(), n, p.kind, T(p.beta));
      TG_LAUNCH_CHECK();
      return;
    }
    int64_t blocks = (n + kThreads - 1) / kThreads;
    blocks = blocks < 1 ? 1 : blocks > kMaxPartials ? kMaxPartials : blocks;
    Tensor partials = Tensor::empty({blocks}, {.dtype = DType::f64, .device = pred.device()});
    pointwise_partials_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        partials.data<double>(), pred.data<T>(), target.data<T>(), n, p.kind, p.beta);
    TG_LAUNCH_CHECK();
    const double scale = p.reduction == Reduction::mean ? 1.0 / double(n) : 1.0;
    final_sum_kernel<T><<<1, kFinalThreads, 0, s>>>(out.data<T>(), partials.data<double>(), blocks, scale);
    TG_LAUNCH_CHECK();
  });
}

void pointwise_loss_backward(const Tensor& dpred, const Tensor& dtarget, const Tensor& grad_out,
                             const Tensor& pred, const Tensor& target, const PointwiseLossParams& p) {
  check_pointwise_loss_backward_buffers(dpred, dtarget, grad_out, pred, target, p);
  const int64_t n = pred.numel();
  if (n == 0 || (!dpred.defined() && !dtarget.defined())) return;
  const int dev = pred.device().index;
  set_device(dev);
  const bool per_element = p.reduction == Reduction::none;
  const double scale = p.reduction == Reduction::mean ? 1.0 / double(n) : 1.0;
  dispatch_floating("loss (CUDA)", pred.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    pointwise_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream(dev)>>>(
        dpred.defined() ? dpred.data<T>() : nullptr, dtarget.defined() ? dtarget.data<T>() : nullptr,
        grad_out.data<T>(), per_element, scale, pred.data<T>(), target.data<T>(), n, p.kind, T(p.beta));
  });
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
