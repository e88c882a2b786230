// bf16 / f16 tensors cannot live on a GPU yet (their kernels are issue 29's): every way of
// making one there is an UnsupportedError naming the operation, raised before anything is
// allocated or launched. The CPU-side checks (creation with a CUDA device) are in
// tests/cpu/test_half_storage.cpp; these need a real CUDA tensor as the source.
#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

TEST(HalfCuda, CastingACudaTensorToAHalfTypeIsRefused) {
  TG_REQUIRE_GPU();
  manual_seed(1);
  const Tensor x = randn({3, 5}, {.device = Device::cuda(0)});
  for (DType t : {DType::bf16, DType::f16}) {
    TG_EXPECT_ERROR(x.to(t), "Tensor::to(dtype)", dtype_name(t), "cuda:0",
                    "half-precision CUDA tensors are not supported yet");
    EXPECT_THROW(x.to(t), UnsupportedError);
    EXPECT_THROW(zeros({2}, {.dtype = t, .device = Device::cuda(0)}), UnsupportedError);
    // The supported route: to the CPU, then convert there.
    const Tensor h = x.cpu().to(t);
    EXPECT_EQ(h.dtype(), t);
    TG_EXPECT_ERROR(h.to(Device::cuda(0)), "Tensor::to(device)", "not supported yet");
    EXPECT_LT(rel_l2(h.to(DType::f32), x.cpu()), t == DType::bf16 ? 4e-3 : 5e-4);  // 2^-8, 2^-11 relative rounding
  }
  EXPECT_TRUE(x.to(DType::f64).device().is_cuda());  // the other casts still run on the GPU
}
