// 1x1 convolutions and batched linear as pointwise GEMMs on mma.sync: the public entry points of
// conv1x1/conv1x1.h (argument checks, then the forward / grad-input product of conv1x1/fprop_sm80.cu or
// the backward kernel of conv1x1/backward_sm80.cu) and the pointwise_matmul_* products.
// Design, precision contract and the floor: docs/kernels/conv1x1.md.
//
// File map: conv1x1/tiles_sm80.cuh (fragments, swizzled tiles, resident weight), conv1x1/epilogue_sm80.cuh
// (stores, tile walk), conv1x1/launch_sm80.cuh (host helpers), conv1x1/fprop_sm80.cu (forward and
// grad-input), conv1x1/backward_tiles_sm80.cuh + conv1x1/backward_sm80.cu (dw and fused dx + dw),
// conv1x1/fprop_sm90.cu (the Hopper forward with R <= 64), conv1x1/fprop_streamed_sm90.cu (the Hopper
// channels-first forward past that).
#include "ops/cuda/conv1x1/conv1x1.h"

#include <initializer_list>
#include <utility>

#include "core/cuda_context.h"
#include "ops/cuda/conv1x1/fprop_sm90.h"
#include "ops/cuda/conv1x1/launch_sm80.cuh"
#include "ops/cuda/policy.h"

namespace tg::cuda {

using conv1x1_detail::device_limits;
using conv1x1_detail::fused_backward_fits;
using conv1x1_detail::run_backward;
using conv1x1_detail::run_pointwise;

namespace {

// Launcher-level checks: the shape class, f32, one CUDA device, shapes as the problem says.
void check_args(const char* op, const ConvShape& s, std::initializer_list<std::pair<const Tensor*, Shape>> args) {
  TG_CHECK(conv1x1_applies(s), op, ": not a 1x1, stride-1, unpadded, undilated convolution (weight ", s.w_shape(),
           ")");
  const Tensor& first = *args.begin()->first;
  for (const auto& [t, shape] : args) {
    TG_CHECK(t->dtype() == DType::f32, op, ": expected f32 tensors, got ", describe(*t));
    TG_CHECK(t->device().is_cuda() && t->device() == first.device(), op, ": expected tensors on one CUDA device, got ",
             describe(*t), " and ", describe(first));
    TG_CHECK(t->shape() == shape, op, ": tensor ", describe(*t), " does not match the expected shape ", shape);
  }
}

}  // namespace

bool conv1x1_applies(const ConvShape& s) {
  for (int d = 0; d < 3; ++d)
    if (s.kernel[d] != 1 || s.stride[d] != 1 || s.pad[d] != 0 || s.dilation[d] != 1) return false;
  return s.C >= 1 && s.K >= 1 && s.N >= 0 && !(s.spatial_dims == 3 && s.channels_last());
}

bool conv1x1_applies(const ConvShape& s, DType dtype) { return dtype == DType::f32 && conv1x1_applies(s); }

bool conv1x1_runs_on_tma(const Tensor& out, const Tensor& in, const ConvShape& s, bool grad_input) {
  if (!out.defined() || !in.defined() || !conv1x1_applies(s) || out.dtype() != DType::f32 ||
      in.dtype() != DType::f32 || !out.device().is_cuda() || !kernel_policy().conv1x1.tma)
    return false;
  const int64_t M = grad_input ? s.C : s.K, R = grad_input ? s.K : s.C;
  const PointwiseTmaProblem q{const_cast<float*>(out.data<float>()), in.data<float>(), nullptr, 0, 0, nullptr, s.N,
                              s.out_volume(), M, R, !s.channels_last(), false};
  return pointwise_tma_applies(q, out.device().index);
}

void conv1x1_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                     Precision precision) {
  if (b.defined())
    check_args("conv1x1_forward", s, {{&y, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}, {&b, Shape{s.K}}});
  else
    check_args("conv1x1_forward", s, {{&y, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}});
  if (y.numel() == 0) return;
  run_pointwise(y, x, w, b, /*M=*/s.K, /*R=*/s.C, /*w_stride_m=*/s.C, /*w_stride_r=*/1, s, precision);
}

void conv1x1_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                        Precision precision) {
  check_args("conv1x1_grad_input", s, {{&dx, s.x_shape()}, {&dy, s.y_shape()}, {&w, s.w_shape()}});
  if (dx.numel() == 0) return;
  run_pointwise(dx, dy, w, Tensor(), /*M=*/s.C, /*R=*/s.K, /*w_stride_m=*/1, /*w_stride_r=*/s.C, s, precision);
}

void conv1x1_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                         Precision precision) {
  check_args("conv1x1_grad_weight", s, {{&dw, s.w_shape()}, {&dy, s.y_shape()}, {&x, s.x_shape()}});
  run_backward(Tensor(), dw, dy, x, Tensor(), s, false, precision);
}

void conv1x1_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const ConvShape& s, Precision precision) {
  if (!dx.defined() && !dw.defined()) return;
  if (dx.defined() && dw.defined()) {
    check_args("conv1x1_backward", s,
               {{&dx, s.x_shape()}, {&dw, s.w_shape()}, {&dy, s.y_shape()}, {&x, s.x_shape()}, {&w, s.w_shape()}});
    const int dev = dw.device().index;
    set_device(dev);
    if (dx.numel() > 0 && fused_backward_fits(s, device_limits(dev).smem_block)) {
      run_backward(dx, dw, dy, x, w, s, true, precision);
      return;
    }
  }
  if (dx.defined()) conv1x1_grad_input(dx, dy, w, s, precision);
  if (dw.defined()) conv1x1_grad_weight(dw, dy, x, s, precision);
}

namespace {

// The channels-last 1x1 convolution whose pixels are the rows of a matrix: one image of
// 1 x rows pixels, so x (rows, C) and y (rows, K) are its (N, H, W, C) tensors as stored.
ConvShape rows_as_pixels(int64_t rows, int64_t C, int64_t K) {
  ConvShape s;
  s.N = 1;
  s.C = C;
  s.K = K;
  s.in[2] = s.out[2] = rows;
  s.layout = Layout::NHWC;
  return s;
}

// The three matrices of a pointwise product -- (rows, K): y or dy; (rows, C): x or dx;
// (K, C): w or dw -- checked together: 2-D, f32, one CUDA device, sizes that agree.
struct MatrixSizes {
  int64_t rows, C, K;
};
MatrixSizes check_matrices(const char* op, const Tensor& rows_k, const Tensor& rows_c, const Tensor& k_c) {
  for (const Tensor* t : {&rows_k, &rows_c, &k_c}) {
    TG_CHECK(t->dtype() == DType::f32 && t->dim() == 2, op, ": expected 2-D f32 matrices, got ", describe(*t));
    TG_CHECK(t->device().is_cuda() && t->device() == k_c.device(), op, ": expected tensors on one CUDA device, got ",
             describe(*t), " and ", describe(k_c));
  }
  const MatrixSizes m{rows_c.size(0), rows_c.size(1), k_c.size(0)};
  TG_CHECK(k_c.size(1) == m.C && rows_k.shape() == Shape({m.rows, m.K}), op, ": shapes ", rows_k.shape(), " (rows, K), ",
           rows_c.shape(), " (rows, C) and ", k_c.shape(), " (K, C) do not agree");
  return m;
}

}  // namespace

void pointwise_matmul_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, Precision precision) {
  const MatrixSizes m = check_matrices("pointwise_matmul_forward", y, x, w);
  TG_CHECK(!b.defined() || (b.dtype() == DType::f32 && b.device() == y.device() && b.shape() == Shape({m.K})),
           "pointwise_matmul_forward: bias ", describe(b), " does not match ", m.K, " f32 outputs on ", y.device().str());
  TG_CHECK(m.C >= 1, "pointwise_matmul_forward: x ", x.shape(), " has no columns to reduce over");
  if (y.numel() == 0) return;
  run_pointwise(y, x, w, b, /*M=*/m.K, /*R=*/m.C, /*w_stride_m=*/m.C, /*w_stride_r=*/1, rows_as_pixels(m.rows, m.C, m.K),
                precision);
}

void pointwise_matmul_grad_input(const Tensor& dx, const Tensor& dy, const Tensor& w, Precision precision) {
  const MatrixSizes m = check_matrices("pointwise_matmul_grad_input", dy, dx, w);
  TG_CHECK(m.K >= 1, "pointwise_matmul_grad_input: dy ", dy.shape(), " has no columns to reduce over");
  if (dx.numel() == 0) return;
  run_pointwise(dx, dy, w, Tensor(), /*M=*/m.C, /*R=*/m.K, /*w_stride_m=*/1, /*w_stride_r=*/m.C,
                rows_as_pixels(m.rows, m.C, m.K), precision);
}

void pointwise_matmul_grad_weight(const Tensor& dw, const Tensor& dy, const Tensor& x, Precision precision) {
  const MatrixSizes m = check_matrices("pointwise_matmul_grad_weight", dy, x, dw);
  if (dw.numel() == 0) return;
  run_backward(Tensor(), dw, dy, x, Tensor(), rows_as_pixels(m.rows, m.C, m.K), false, precision);
}

void pointwise_matmul_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                               Precision precision) {
  const MatrixSizes m = check_matrices("pointwise_matmul_backward", dy, x, w);
  check_matrices("pointwise_matmul_backward", dy, dx, dw);
  TG_CHECK(m.K >= 1, "pointwise_matmul_backward: dy ", dy.shape(), " has no columns to reduce over");
  const ConvShape s = rows_as_pixels(m.rows, m.C, m.K);
  // conv1x1_backward's own tensors are the 4-D NHWC views of the same storage (detached: a
  // kernel call records nothing on the tape).
  auto as = [](const Tensor& t, const Shape& shape) { return t.detach().reshape(shape); };
  conv1x1_backward(as(dx, s.x_shape()), as(dw, s.w_shape()), as(dy, s.y_shape()), as(x, s.x_shape()),
                   as(w, s.w_shape()), s, precision);
}

}  // namespace tg::cuda
