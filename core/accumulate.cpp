#include "core/accumulate.h"

#include "core/dtype_dispatch.h"
#include "core/half.h"
#include "core/tensor_kernels.h"

namespace tg {

Tensor sum_of(const Tensor& a, const Tensor& b) {
  TG_CHECK_AS(ShapeError, a.shape() == b.shape(), "gradient accumulation: shapes ", a.shape(), " and ", b.shape(),
              " differ");
  TG_CHECK_AS(DTypeError, a.dtype() == b.dtype(), "gradient accumulation: dtypes ", dtype_name(a.dtype()), " and ",
              dtype_name(b.dtype()), " differ");
  TG_CHECK_AS(DeviceError, a.device() == b.device(), "gradient accumulation: devices ", a.device(), " and ",
              b.device(), " differ");
  Tensor out = Tensor::empty(a.shape(), {.dtype = a.dtype(), .device = a.device()});
  if (a.device().is_cuda()) {
#if TG_CUDA
    cuda::add(out, a, b);
#else
    TG_FAIL_AS(UnsupportedError, "gradient accumulation: tapegrad was built without CUDA");
#endif
    return out;
  }
  if (is_half(a.dtype())) {  // the sum of the two exact f32 values, rounded once (ops/half_compute.h)
    const uint16_t *pa = static_cast<const uint16_t*>(a.raw_data()), *pb = static_cast<const uint16_t*>(b.raw_data());
    uint16_t* po = static_cast<uint16_t*>(out.raw_data());
    for (int64_t i = 0, n = a.numel(); i < n; ++i)
      po[i] = encode_half(a.dtype(), static_cast<double>(decode_half(a.dtype(), pa[i]) + decode_half(a.dtype(), pb[i])));
    return out;
  }
  dispatch_any(a.dtype(), [&](auto* tag) {
    using T = TG_ELEMENT_TYPE(tag);
    const T *pa = a.data<T>(), *pb = b.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
  });
  return out;
}

}  // namespace tg
