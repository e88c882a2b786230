// Forward and grad-input (the same kernel on flipped, transposed weights) of 3x3 stride-1 NCHW
// convolutions on Hopper (sm_90a), FP32-accurate (split products) and TF32, wgmma with A from
// registers. Dispatched from conv3x3/dispatch.cu (conv3x3_wgmma_applies); on Hopper in TF32 the SS kernel
// normally serves, this one only when Conv3x3Policy asks for it. Design: docs/kernels/conv3x3.md.
//
// GEMM: M = 64 consecutive output pixels of one row (A: scalar LDS of the halo at the tap shift,
// rounded / split in registers; mma.sync m16n8k8 A layout per warp), N = output channels (B:
// weights in smem, K-major, no swizzle, [tap][k half][n][4], layout rules in arch/wgmma.cuh),
// k8 step = one tap x 8 input channels. Tiles (2 warpgroups): wide 2 x 128 px x 128 ch, narrow
// 4 x 128 x 64, FP32 split 2 x 128 x 64 (two B images hi', lo' per tap).
// FP32: acc += hi*hi' and, in a SECOND accumulator, cross += lo*hi' + hi*lo' (three m64n64k8 of
// one shape); acc + cross is one round-to-nearest FADD in the epilogue.
//
// Ordering:
// - cp.async fills the stage; each thread runs fence.proxy.async.shared::cta after its
//   cp.async.wait_group and before the __syncthreads that publishes the stage.
// - wgmma.fence before each tap's wgmma, commit per tap, wait_group 2 after it: A lives in 3
//   register sets (tap % 3). A stage is refilled 2 steps after it was computed.
// - Tile end: wait_group 0, accumulators re-bound (fence_operand); the next tile's first wgmma
//   has scale-d = 0 (no zeroing).
#include <algorithm>
#include <cstdint>

#include "core/cuda_context.h"
#include "core/precision.h"
#include "ops/cuda/conv3x3/conv3x3.h"
#include "ops/cuda/conv3x3/fprop_sm90.h"
#include "ops/cuda/conv3x3/fprop_sm90_kernel.cuh"

namespace tg::cuda {
namespace {

constexpr int kPrepThreads = 256;

void check_tensors(const char* op, const ConvShape& s, Precision precision, ExpectedTensors ts) {
  check_conv3x3_tensors(op, s, precision, conv3x3_wgmma_applies,
                        "a 3x3 stride-1 NCHW 2-D convolution (in FP32 mode at most 128 channels each way) on a "
                        "compute capability 9.0 GPU with sm_90a code",
                        ts);
}

// out = conv3x3(in, w re-laid out): the forward pass, or (transposed weights) the input gradient.
template <class T>
void run(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, WgParams p, bool for_grad_input) {
  const int dev = out.device().index;
  set_device(dev);
  p = plan<T>(p, row_copy_width(in.data<float>(), p.Win), reinterpret_cast<uintptr_t>(out.data<float>()) % 8 == 0);

  Tensor wp = Tensor::empty(Shape{p.chunks * p.k_tiles * T::kWStage}, {.dtype = DType::f32, .device = out.device()});
  prepare_wgmma_weights_kernel<<<grid_for(wp.numel(), kPrepThreads), kPrepThreads, 0, stream(dev)>>>(
      wp.data<float>(), w.data<float>(), w.size(0), w.size(1), p.chunks, p.k_tiles, T::kN, T::kImages, for_grad_input);
  TG_LAUNCH_CHECK();

  const auto kernel = conv3x3_wgmma_kernel<T>;
  allow_dynamic_smem(kernel, int(T::kSmemBytes));
  // One block per SM (the accumulators take half the registers, the stages most of the smem).
  const int64_t grid = std::min<int64_t>(p.tiles, sm_count(dev));
  kernel<<<static_cast<unsigned>(grid), T::kThreads, T::kSmemBytes, stream(dev)>>>(
      out.data<float>(), in.data<float>(), wp.data<float>(), bias, p);
  TG_LAUNCH_CHECK();
  // wp is freed stream-ordered, after the kernel that reads it.
}

void run(const Tensor& out, const Tensor& in, const Tensor& w, const float* bias, const WgParams& p,
         bool for_grad_input, Precision precision) {
  if (precision == Precision::FP32) run<SplitWg>(out, in, w, bias, p, for_grad_input);
  else if (use_narrow_tile(p)) run<NarrowWg>(out, in, w, bias, p, for_grad_input);
  else run<WideWg>(out, in, w, bias, p, for_grad_input);
}

}  // namespace

bool conv3x3_wgmma_applies(const ConvShape& s, Device d, Precision precision) {
  // conv3x3_applies limits FP32 mode to <= 128 channels each way (short truncating chains).
  return d.is_cuda() && conv3x3_applies(s, precision) && device_runs_wgmma(d.index);
}

void conv3x3_wgmma_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                           Precision precision) {
  check_tensors("conv3x3_wgmma_forward", s, precision, {{&y, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}});
  if (b.defined()) check_tensors("conv3x3_wgmma_forward", s, precision, {{&y, s.y_shape()}, {&b, Shape{s.K}}});
  run(y, x, w, b.defined() ? b.data<float>() : nullptr,
      forward_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
      /*for_grad_input=*/false, precision);
}

void conv3x3_wgmma_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                              Precision precision) {
  check_tensors("conv3x3_wgmma_grad_input", s, precision,
                {{&dx, s.x_shape()}, {&dy, s.y_shape()}, {&w, s.w_shape()}});
  run(dx, dy, w, nullptr, grad_input_params(s.N, s.C, s.in[1], s.in[2], s.K, s.out[1], s.out[2], s.pad[1], s.pad[2]),
      /*for_grad_input=*/true, precision);
}

}  // namespace tg::cuda
