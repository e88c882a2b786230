// The engine's BF16 convolution passes on Hopper. The forward is the im2col TMA kernel of the f32 forward
// (conv_fprop_sm90_tma.cu) with bf16 boxes. A k-tile is (tap, 64-channel slice): one request
// brings 128 output pixels' inputs at that tap, 64 bf16 channels each (the same 128-byte
// swizzled rows as 32 f32 channels), and the consumers run m64nNk16 BF16 products on it
// (tma_mainloop_sm90.cuh). B is the bf16 weights packed per tap, channels padded to 64. The
// products are exact in f32 and accumulate in f32; the output is f32, or bf16 with each sum
// rounded once in the epilogue (the forward and grad-input).
//
// NDHWC inputs with C % 8 == 0 (16-byte rows) are read in place; NCDHW inputs are transposed
// into a channels-last bf16 scratch first (C padded to 8). Fewer than 16 channels, geometry the
// im2col map cannot express, or a device without sm_90a code: the f32 dispatcher on f32
// copies at TF32 (bf16 values are exact in TF32: the same products). The stride-1 grad-input is
// the forward of dy with the weights transposed and flipped; the grad-weight the columns
// product of conv_wgrad_sm90_tma.cu over bf16 rows and columns. Design note:
// docs/kernels/gemm_tma.md.
#include "core/cuda_context.h"
#include "core/error.h"
#include "core/tensor_kernels.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/gemm/engine.h"
#include "ops/cuda/gemm/im2col_boxes.cuh"
#include "ops/cuda/gemm/planning.h"
#include "ops/cuda/gemm/tma_mainloop_sm90.cuh"

namespace tg::cuda {
namespace engine {
namespace {

constexpr int kSlice = Im2colSlices<true>::kSlice;  // 64 bf16 channels per k-tile

// packed[k][t * c_pad + c] = w[k][c][t] (bf16 bits) for c < C and k < K; +0 for the padding up
// to c_pad and k_rows. Grad-input (`flipped`): the problem's w is the forward's transposed and
// flipped, read from the forward's (C, K, kvol) array: w[k][c][t] = forward_w[c][k][kvol - 1 - t].
__global__ void pack_bf16_taps_kernel(uint16_t* __restrict__ packed, const uint16_t* __restrict__ w, int64_t K,
                                      int64_t k_rows, int64_t C, int64_t kvol, int64_t c_pad, bool flipped) {
  const int64_t total = k_rows * kvol * c_pad;
  TG_GRID_STRIDE(e, total) {
    const int64_t c = e % c_pad, t = (e / c_pad) % kvol, k = e / (c_pad * kvol);
    const int64_t from = flipped ? (c * K + k) * kvol + (kvol - 1 - t) : (k * C + c) * kvol + t;
    packed[e] = c < C && k < K ? w[from] : uint16_t(0);
  }
}


// The channels of the map: C itself for channels-last inputs, C padded to 8 for the scratch.
int64_t map_channels(const ConvShape& s) { return s.channels_last() ? s.C : round_up(s.C, 8); }

}  // namespace

void launch_im2col_tma(const Im2colSlices<true>& boxes, const Plan& plan, const MainloopArgs& args,
                       cudaStream_t stream) {
  launch_tma_wgmma(boxes, plan, args, stream);
}

}  // namespace engine

bool engine_conv_forward_bf16_uses_tma(const ConvShape& s, const Tensor& x, const EnginePolicy& policy) {
  using namespace engine;
  const bool tile = policy.tile == 0 || policy.tile == 128 || policy.tile == 256;
  if (!tile || policy.arch == 80 || x.dtype() != DType::bf16 || !x.device().is_cuda()) return false;
  if (s.C < kTmaMinChannels || !engine_conv_can_implement(s, DType::f32) || !device_runs_wgmma(x.device().index))
    return false;
  if (s.channels_last() && (s.C % 8 != 0 || !aligned16(bf16_bits(x)))) return false;
  const int64_t red = s.kernel_volume() * round_up(s.C, kSlice);
  return red <= kIndexLimit && fits(s.N * s.out_volume()) && im2col_map_fits(im2col_geometry(s, map_channels(s)));
}

namespace {

// Every pass's checks before any work, then its device: bf16 activations and weights, an f32
// output (or bf16 where out_bf16: the forward and grad-input), an f32 bias, a problem within the
// engine's limits.
void begin_bf16_pass(const char* op, const Tensor& out, const Tensor& a, const Tensor& w, const Tensor& b,
                     const ConvShape& s, bool out_bf16) {
  const bool out_ok = out.dtype() == DType::f32 || (out_bf16 && out.dtype() == DType::bf16);
  TG_CHECK_AS(DTypeError, a.dtype() == DType::bf16 && w.dtype() == DType::bf16 && out_ok &&
                              (!b.defined() || b.dtype() == DType::f32),
              op, ": wants bf16 activations and weights, an f32 ", out_bf16 ? "or bf16 " : "",
              "output and an f32 bias; got ", describe(a), ", w ", describe(w), ", out ", describe(out),
              b.defined() ? ", b " + describe(b) : std::string());
  TG_CHECK(engine_conv_can_implement(s, DType::f32), op, ": problem x ", s.x_shape(), ", w ", s.w_shape(),
           " is outside the engine's limits");
  set_device(out.device().index);
}

// The TMA pass: y = conv(x, w) + b for a problem engine_conv_forward_bf16_uses_tma accepts.
// `flipped`: s is a stride-1 grad-input posed as a forward (grad_input_as_forward): x is dy,
// y is dx and w the forward's weights, read transposed and flipped.
void conv_fprop_bf16_tma(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                         const EnginePolicy& policy, bool flipped) {
  using namespace engine;
  const int dev = y.device().index;
  cudaStream_t st = stream(dev);
  const TensorOptions bf16{.dtype = DType::bf16, .device = y.device()};
  const int64_t kvol = s.kernel_volume(), c_pad = round_up(s.C, kSlice), channels = map_channels(s);
  const int64_t red = kvol * c_pad, M = s.N * s.out_volume();
  const int cols = policy.tile == 256 ? 256 : s.K <= 64 ? 64 : 128;
  const int64_t k_rows = round_up(s.K, cols);  // whole B boxes (as the f32 forward)
  Tensor packed = Tensor::empty({k_rows * red}, bf16);
  pack_bf16_taps_kernel<<<grid_for(packed.numel(), kThreads), kThreads, 0, st>>>(
      static_cast<uint16_t*>(packed.raw_data()), bf16_bits(w), s.K, k_rows, s.C, kvol, c_pad, flipped);
  TG_LAUNCH_CHECK();
  Tensor staged;
  const uint16_t* x_last = bf16_bits(x);
  if (!s.channels_last()) {
    staged = Tensor::empty({s.N * s.in_volume() * channels}, bf16);
    transpose_into(static_cast<uint16_t*>(staged.raw_data()), bf16_bits(x), s.N, s.C, s.in_volume(), channels, st);
    x_last = bf16_bits(staged);
  }
  const Plan plan = make_tma_plan(M, s.K, red, cols, dev, policy, Precision::TF32, /*bf16=*/true);
  const MainloopArgs args = conv_forward_args(y, b.defined() ? b.data<float>() : nullptr, s, red);
  const Im2colGeometry geometry_x = im2col_geometry(s, channels);
  Im2colSlices<true> boxes{};
  boxes.x = bf16_im2col_map(flipped ? "conv grad-input, bf16 (dy)" : "conv forward, bf16 (x)", x_last, geometry_x,
                            kSlice, kTmaBM);
  boxes.w = bf16_matrix_map("conv forward, bf16 (w)", static_cast<const uint16_t*>(packed.raw_data()), k_rows, red,
                            {.rows = cols, .cols = kSlice, .swizzle128 = true});
  boxes.slices = int32_t(c_pad / kSlice);
  set_walk_geometry(boxes, s, geometry_x.dims == 3);
  run_plan(plan, args, y.device(),
           [&](const MainloopArgs& a, cudaStream_t stm) { launch_im2col_tma(boxes, plan, a, stm); });
}

}  // namespace

void engine_conv_forward_bf16(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                              const EnginePolicy& policy) {
  begin_bf16_pass("engine_conv_forward_bf16", y, x, w, b, s, /*out_bf16=*/true);
  if (engine_conv_forward_bf16_uses_tma(s, x, policy)) return conv_fprop_bf16_tma(y, x, w, b, s, policy, false);
  // The same exact products on the f32 dispatcher's TF32 kernels.
  engine::into_f32(y, [&](const Tensor& y32) {
    conv_forward(y32, engine::widened(x), engine::widened(w), b, s, Precision::TF32);
  });
}

bool engine_conv_grad_input_bf16_uses_tma(const ConvShape& s, const Tensor& dy, const EnginePolicy& policy) {
  ConvShape forward;
  if (engine::grad_input_as_forward(s, forward)) return engine_conv_forward_bf16_uses_tma(forward, dy, policy);
  const bool tile = policy.tile == 0 || policy.tile == 128 || policy.tile == 256;
  return tile && policy.arch != 80 && dy.dtype() == DType::bf16 && dy.device().is_cuda() &&
         engine_conv_can_implement(s, DType::f32) && engine::conv_dgrad_phases_bf16_tma_applies(s, dy);
}

void engine_conv_grad_input_bf16(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                                 const EnginePolicy& policy) {
  begin_bf16_pass("engine_conv_grad_input_bf16", dx, dy, w, Tensor(), s, /*out_bf16=*/true);
  if (engine_conv_grad_input_bf16_uses_tma(s, dy, policy)) {
    ConvShape forward;
    if (engine::grad_input_as_forward(s, forward))
      return conv_fprop_bf16_tma(dx, dy, w, Tensor(), forward, policy, /*flipped=*/true);
    return engine::conv_dgrad_phases_bf16_tma(dx, dy, w, s, policy);
  }
  engine::into_f32(dx, [&](const Tensor& dx32) {
    conv_grad_input(dx32, engine::widened(dy), engine::widened(w), s, Precision::TF32);
  });
}

bool engine_conv_grad_weight_bf16_uses_tma(const ConvShape& s, const Tensor& dw, const EnginePolicy& policy) {
  const bool tile = policy.tile == 0 || policy.tile == 128 || policy.tile == 256;
  return tile && policy.arch != 80 && dw.device().is_cuda() && engine_conv_can_implement(s, DType::f32) &&
         engine::conv_wgrad_bf16_tma_applies(s, dw.device().index, policy);
}

void engine_conv_grad_weight_bf16(const Tensor& dw, const Tensor& dy, const Tensor& x, const ConvShape& s,
                                  const EnginePolicy& policy) {
  begin_bf16_pass("engine_conv_grad_weight_bf16", dw, dy, x, Tensor(), s, /*out_bf16=*/false);
  if (engine_conv_grad_weight_bf16_uses_tma(s, dw, policy)) return engine::conv_wgrad_bf16_tma(dw, dy, x, s, policy);
  conv_grad_weight(dw, engine::widened(dy), engine::widened(x), s, Precision::TF32);
}

}  // namespace tg::cuda
