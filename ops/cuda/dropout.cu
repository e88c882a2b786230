// CUDA kernel of dropout: one grid-stride loop over the elements (64-bit indices), each
// element regenerating its unit's keep bit from the counter-based generator. The expressions
// are the CPU reference's (double scaling, one rounding), so both devices agree bit for bit.
#include "core/cuda_context.h"
#include "core/dtype_dispatch.h"
#include "ops/cuda/dropout.h"

namespace tg::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void dropout_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t n, DropoutProblem q,
                               double scale) {
  q.offset = shifted_offset(q.offset, q.shift);  // a replayed graph's draw: this replay's counters
  TG_GRID_STRIDE(i, n) {
    const int64_t u = q.inner == 1 ? i : i / q.inner;
    // __dmul_rn: a plain product, never contracted with anything, as on the CPU.
    out[i] = dropout_keeps(q, u) ? static_cast<T>(__dmul_rn(double(in[i]), scale)) : T(0);
  }
}

}  // namespace

void dropout_apply(const Tensor& out, const Tensor& in, const DropoutProblem& q) {
  check_dropout_buffers(out, in, q);
  const int64_t n = in.numel();
  if (n == 0) return;
  const int dev = in.device().index;
  set_device(dev);
  cudaStream_t st = stream(dev);
  const double scale = dropout_scale(q);
  dispatch_floating("dropout", in.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    dropout_kernel<T><<<grid_for(n, kThreads), kThreads, 0, st>>>(out.data<T>(), in.data<T>(), n, q, scale);
  });
  TG_LAUNCH_CHECK();
}

}  // namespace tg::cuda
