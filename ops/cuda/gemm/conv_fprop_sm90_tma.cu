// The engine's TF32 and FP32 convolution forward on Hopper, fed by the TMA unit's im2col mode: the
// GEMM's A (output pixels x taps * channels) is never formed; each k-tile is one kernel tap
// and 32 channels, and one TMA request brings the 128 output pixels' inputs at that tap from a
// channels-last activation, zeros where the window leaves the input (tma_mainloop_sm90.cuh runs
// the products). B is the weights packed per tap with the channels padded to 32:
// packed[k][t][c] (zeros for c >= C), so every k-tile is whole.
//
// Few channels (channel_quads: below 16 where it pays, FP32 below 32; EnginePolicy::tma_quads
// forces it): each k-tile is 8 (tap, 4-channel quad) pairs instead (Im2colQuadBoxes), the
// weights packed in that order, so that a 3-channel stem wastes a quarter of each product, not
// 29/32.
//
// NDHWC inputs with C % 4 == 0 are read in place; NCDHW inputs are first transposed into a
// channels-last scratch (channels padded to a multiple of 4, the TMA's 16-byte stride rule),
// which costs one read and one write of x. The output goes through the engine's output map
// (channels-first or -last, bias, split partial sums). Design note: docs/kernels/gemm_tma.md.
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/gemm/im2col_boxes.cuh"
#include "ops/cuda/gemm/operands.cuh"
#include "ops/cuda/gemm/planning.h"
#include "ops/cuda/gemm/tma_mainloop_sm90.cuh"

namespace tg::cuda::engine {

namespace {

// packed[k][t * c_pad + c] = w[k][c][t] for c < C, k < K and t < kvol; 0 for the padding up to
// c_pad, k_rows and the row length `row` (>= kvol * c_pad: quad mode rounds the reduction up to
// whole k-tiles). Grad-input (`flipped`): the problem's w is the forward's transposed and
// flipped, read from the forward's (C, K, kvol) array: w[k][c][t] = forward_w[c][k][kvol - 1 - t].
__global__ void pack_tap_slices_kernel(float* __restrict__ packed, const float* __restrict__ w, int64_t K,
                                       int64_t k_rows, int64_t C, int64_t kvol, int64_t c_pad, int64_t row,
                                       bool flipped) {
  const int64_t total = k_rows * row;
  TG_GRID_STRIDE(e, total) {
    const int64_t j = e % row, k = e / row, c = j % c_pad, t = j / c_pad;
    const int64_t from = flipped ? (c * K + k) * kvol + (kvol - 1 - t) : (k * C + c) * kvol + t;
    packed[e] = c < C && k < K && t < kvol ? w[from] : 0.f;
  }
}

// The channels of the map: C itself for channels-last inputs, C padded to 4 for the scratch.
int64_t map_channels(const ConvShape& s) { return s.channels_last() ? s.C : round_up(s.C, 4); }

// Whether the k-tiles are (tap, channel quad) pairs rather than (tap, 32-channel slice). Below 16
// channels they are the only TMA form, and pay against the cp.async kernels (which pack C x kvol
// densely) where padding C to 4 costs at most half as many k-tiles again: on an H200, 7x7 with 3
// channels (7 k-tiles against 5) 0.80x the time at TF32, 5x5 with 8 channels 0.72x, 3x3x3 with
// 4 channels 0.77x; 3x3 with 1 or 3 channels (2 k-tiles against 1) 1.0-1.7x, 3x3x3 with 1
// channel (4 against 1) 1.3-1.9x. From 16 to 31 channels quads replace one 32-channel slice per
// tap, which FP32 mode's slower k-tiles favour (0.78-0.89x) and TF32's do not (1.37-1.46x: eight
// requests per k-tile outrun the one producer thread).
bool channel_quads(const ConvShape& s, const EnginePolicy& policy, Precision precision) {
  if (policy.tma_quads < 0 || s.C >= kBK) return false;
  if (policy.tma_quads == 1) return true;
  if (s.C >= kTmaMinChannels) return precision == Precision::FP32;
  const int64_t quad_tiles = ceil_div(s.kernel_volume() * round_up(s.C, 4), kBK);
  const int64_t dense_tiles = ceil_div(s.kernel_volume() * s.C, kBK);
  return 2 * quad_tiles <= 3 * dense_tiles;
}

// The reduction's length: taps x channels padded to whole k-tiles.
int64_t padded_reduction(const ConvShape& s, bool quads) {
  return quads ? round_up(s.kernel_volume() * round_up(s.C, 4), kBK) : s.kernel_volume() * round_up(s.C, kBK);
}

}  // namespace

bool conv_fprop_tma_applies(const ConvShape& s, const float* x, int dev, const EnginePolicy& policy,
                            Precision precision) {
  const bool quads = channel_quads(s, policy, precision);
  if (!device_runs_wgmma(dev) || (s.C < kTmaMinChannels && !quads)) return false;
  if (s.channels_last() && (s.C % 4 != 0 || !aligned16(x))) return false;
  return padded_reduction(s, quads) <= kIndexLimit && fits(s.N * s.out_volume()) &&
         im2col_map_fits(im2col_geometry(s, map_channels(s)));
}

// The grad-input of a stride-1 convolution is the forward of dy with the weights transposed
// and flipped, padded by dil (k - 1) - pad: the same kernel serves it where that padding is
// not negative.
bool grad_input_as_forward(const ConvShape& s, ConvShape& forward) {
  forward = s;
  forward.C = s.K;
  forward.K = s.C;
  for (int d = 0; d < 3; ++d) {
    if (s.stride[d] != 1) return false;
    forward.in[d] = s.out[d];
    forward.out[d] = s.in[d];
    forward.pad[d] = s.dilation[d] * (s.kernel[d] - 1) - s.pad[d];
    if (forward.pad[d] < 0) return false;
  }
  return true;
}

void conv_fprop_tma(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const ConvShape& s,
                    Precision precision, const EnginePolicy& policy, bool flipped) {
  const int dev = y.device().index;
  cudaStream_t st = stream(dev);
  const bool quads = channel_quads(s, policy, precision);
  const int64_t kvol = s.kernel_volume(), c_pad = round_up(s.C, quads ? 4 : kBK), channels = map_channels(s);
  const int64_t red = padded_reduction(s, quads);
  const TensorOptions f32{.dtype = DType::f32, .device = y.device()};

  // FP32 (split TF32) runs on 64- or 128-wide tiles (policy.tile 128 forces the wider).
  const int narrow = s.K <= 64 ? 64 : 128;
  const int cols = precision == Precision::FP32 ? (policy.tile == 128 ? 128 : narrow)
                   : policy.tile == 256 ? 256 : narrow;
  // The weights are packed with zero rows up to whole tiles: a B box that reaches past the
  // operand's last row is filled by the TMA unit far more slowly than one read from memory.
  const int64_t k_rows = round_up(s.K, cols);
  Tensor packed = Tensor::empty({k_rows * red}, f32);
  pack_tap_slices_kernel<<<grid_for(packed.numel(), kThreads), kThreads, 0, st>>>(
      packed.data<float>(), w.data<float>(), s.K, k_rows, s.C, kvol, c_pad, red, flipped);
  TG_LAUNCH_CHECK();
  Tensor staged;
  const float* x_last = x.data<float>();
  if (!s.channels_last()) {
    const int64_t pixels = s.in_volume();
    staged = Tensor::empty({s.N * pixels * channels}, f32);
    transpose_into(staged.data<float>(), x.data<float>(), s.N, s.C, pixels, channels, st);
    x_last = staged.data<float>();
  }

  const Plan plan = make_tma_plan(s.N * s.out_volume(), s.K, red, cols, dev, policy, precision);
  const MainloopArgs args = conv_forward_args(y, b.defined() ? b.data<float>() : nullptr, s, red);

  const Im2colGeometry geometry_x = im2col_geometry(s, channels);
  const char* x_name = flipped ? "conv grad-input (dy)" : "conv forward (x)";
  const auto fill = [&](auto& boxes) {
    boxes.w = f32_matrix_map("conv forward (w)", packed.data<float>(), k_rows, red,
                             {.rows = cols, .cols = kBK, .swizzle128 = true});
    set_walk_geometry(boxes, s, geometry_x.dims == 3);
    run_plan(plan, args, y.device(),
             [&](const MainloopArgs& a, cudaStream_t stm) { launch_im2col_tma(boxes, plan, a, stm); });
  };
  if (quads) {
    Im2colQuadBoxes boxes{};
    boxes.x = f32_im2col_map(x_name, x_last, geometry_x, 4, kTmaBM);
    boxes.quads = int32_t(c_pad / 4);
    boxes.pairs = int32_t(kvol * boxes.quads);
    boxes.past_channel = int32_t(channels);
    fill(boxes);
  } else {
    Im2colBoxes boxes{};
    boxes.x = f32_im2col_map(x_name, x_last, geometry_x, kBK, kTmaBM);
    boxes.slices = int32_t(c_pad / kBK);
    fill(boxes);
  }
}

void launch_im2col_tma(const Im2colBoxes& boxes, const Plan& plan, const MainloopArgs& args, cudaStream_t stream) {
  launch_tma_wgmma(boxes, plan, args, stream);
}
void launch_im2col_tma(const Im2colQuadBoxes& boxes, const Plan& plan, const MainloopArgs& args, cudaStream_t stream) {
  launch_tma_wgmma(boxes, plan, args, stream);
}

}  // namespace tg::cuda::engine
