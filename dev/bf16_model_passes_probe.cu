// Experiment (not built by CMake): where the ResNet-18-style model's BF16 training step loses to
// its TF32 one. For each convolution shape of the zoo's model (batch 64, 64x64 images, widths
// 64..512; count = how many layers have it) it times the three passes as the model runs them:
//   tf32   the f32 dispatcher at TF32 on f32 tensors (cuda::conv_forward / _grad_input /
//          _grad_weight), what the TF32 step runs;
//   bf16   the bf16 passes on bf16 tensors (cuda::conv_forward_bf16 / ..._bf16: the engine's
//          BF16 kernels with bf16 outputs, or their fallbacks), what the BF16 step runs;
//   widen  the alternative a routing rule could pick for a bf16 pass: f32 copies of the bf16
//          operands, the TF32 dispatcher, the result rounded to bf16 (casts included).
// Per shape: median ms of 20 timings of 4 queued passes; then the totals weighted by count. A
// pass whose widen time beats its bf16 time is a routing candidate; one where bf16 loses to
// tf32 by more than the casts' share is a kernel to look at.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include <cstdio>
#include <string>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "core/tensor_kernels.h"
#include "ops/conv.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/gemm/engine.h"
#include "probe_common.h"

namespace {

using namespace tg;

struct Times {
  float fwd = 0, dgrad = 0, wgrad = 0;
  Times& operator+=(const Times& o) {
    fwd += o.fwd, dgrad += o.dgrad, wgrad += o.wgrad;
    return *this;
  }
  Times scaled(int n) const { return {fwd * n, dgrad * n, wgrad * n}; }
};

Times totals[3];  // tf32, bf16, widen

template <class F>
float time_ms(F&& f) {
  f();
  return probe_common::median_ms(20, f, 4, cuda::stream(0));
}

using cuda::engine::widened;

void measure(const char* name, int count, const Shape& x_shape, const Shape& w_shape, const ConvParams& p) {
  const Device gpu = Device::cuda(0);
  const ConvShape s = make_conv_shape("probe", x_shape, w_shape, p);
  const TensorOptions f32{.dtype = DType::f32, .device = gpu}, bf16{.dtype = DType::bf16, .device = gpu};
  const Tensor x = uniform(x_shape, -1, 1, bf16), w = uniform(w_shape, -1, 1, bf16);
  const Tensor dy = uniform(s.y_shape(), -1, 1, bf16);
  const Tensor x32 = x.to(DType::f32), w32 = w.to(DType::f32), dy32 = dy.to(DType::f32);
  const Tensor y32 = Tensor::empty(s.y_shape(), f32), dx32 = Tensor::empty(x_shape, f32),
               dw32 = Tensor::empty(w_shape, f32);
  const Tensor y16 = Tensor::empty(s.y_shape(), bf16), dx16 = Tensor::empty(x_shape, bf16),
               dw16 = Tensor::empty(w_shape, bf16);
  Times t[3];
  t[0].fwd = time_ms([&] { cuda::conv_forward(y32, x32, w32, Tensor(), s, Precision::TF32); });
  t[0].dgrad = time_ms([&] { cuda::conv_grad_input(dx32, dy32, w32, s, Precision::TF32); });
  t[0].wgrad = time_ms([&] { cuda::conv_grad_weight(dw32, dy32, x32, s, Precision::TF32); });
  t[1].fwd = time_ms([&] { cuda::conv_forward_bf16(y16, x, w, Tensor(), s); });
  t[1].dgrad = time_ms([&] { cuda::conv_grad_input_bf16(dx16, dy, w, s); });
  t[1].wgrad = time_ms([&] { cuda::conv_grad_weight_bf16(dw16, dy, x, s); });
  t[2].fwd = time_ms([&] {
    cuda::conv_forward(y32, widened(x), widened(w), Tensor(), s, Precision::TF32);
    cuda::cast(y16, y32);
  });
  t[2].dgrad = time_ms([&] {
    cuda::conv_grad_input(dx32, widened(dy), widened(w), s, Precision::TF32);
    cuda::cast(dx16, dx32);
  });
  t[2].wgrad = time_ms([&] {
    cuda::conv_grad_weight(dw32, widened(dy), widened(x), s, Precision::TF32);
    cuda::cast(dw16, dw32);
  });
  const char* kind[3] = {"tf32", "bf16", "widen"};
  for (int k = 0; k < 3; ++k) {
    std::printf("%-28s x%d %-5s fwd %.4f  dgrad %.4f  wgrad %.4f ms\n", name, count, kind[k], t[k].fwd, t[k].dgrad,
                t[k].wgrad);
    totals[k] += t[k].scaled(count);
  }
}

}  // namespace

int main() {
  const ConvParams p1{.padding = {1}}, s2{.stride = {2}, .padding = {1}}, down{.stride = {2}};
  measure("stem 3x3 3->64 @64", 1, {64, 3, 64, 64}, {64, 3, 3, 3}, p1);
  measure("3x3 64 @64", 4, {64, 64, 64, 64}, {64, 64, 3, 3}, p1);
  measure("3x3 s2 64->128 @64", 1, {64, 64, 64, 64}, {128, 64, 3, 3}, s2);
  measure("3x3 128 @32", 3, {64, 128, 32, 32}, {128, 128, 3, 3}, p1);
  measure("1x1 s2 64->128 @64", 1, {64, 64, 64, 64}, {128, 64, 1, 1}, down);
  measure("3x3 s2 128->256 @32", 1, {64, 128, 32, 32}, {256, 128, 3, 3}, s2);
  measure("3x3 256 @16", 3, {64, 256, 16, 16}, {256, 256, 3, 3}, p1);
  measure("1x1 s2 128->256 @32", 1, {64, 128, 32, 32}, {256, 128, 1, 1}, down);
  measure("3x3 s2 256->512 @16", 1, {64, 256, 16, 16}, {512, 256, 3, 3}, s2);
  measure("3x3 512 @8", 3, {64, 512, 8, 8}, {512, 512, 3, 3}, p1);
  measure("1x1 s2 256->512 @16", 1, {64, 256, 16, 16}, {512, 256, 1, 1}, down);
  const char* kind[3] = {"tf32", "bf16", "widen"};
  for (int k = 0; k < 3; ++k)
    std::printf("model total %-5s fwd %.3f  dgrad %.3f  wgrad %.3f  all %.3f ms\n", kind[k], totals[k].fwd,
                totals[k].dgrad, totals[k].wgrad, totals[k].fwd + totals[k].dgrad + totals[k].wgrad);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe done: %s\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
