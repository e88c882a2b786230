// CPU reference of dropout: the mask from the shared counter-based generator, the scaling in
// double, so the GPU kernel (the same expressions) gives the same bits.
#include "core/dtype_dispatch.h"
#include "ops/cpu/parallel.h"
#include "ops/dropout.h"

namespace tg::cpu {

void dropout_apply(const Tensor& out, const Tensor& in, const DropoutProblem& q) {
  check_dropout_buffers(out, in, q);
  const double scale = dropout_scale(q);
  dispatch_floating("dropout", in.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T* pi = in.data<T>();  // (units, inner)
    T* po = out.data<T>();       // (units, inner)
    // The mask is a function of the unit's index (counter-based), so threads may split units.
    parallel_for(q.units, q.inner + 8, [&](int64_t u) {
      const bool keep = dropout_keeps(q, u);
      for (int64_t i = u * q.inner; i < (u + 1) * q.inner; ++i)
        po[i] = keep ? static_cast<T>(double(pi[i]) * scale) : T(0);
    });
  });
}

}  // namespace tg::cpu
