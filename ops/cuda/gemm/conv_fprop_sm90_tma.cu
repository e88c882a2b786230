// The engine's TF32 and FP32 convolution forward on Hopper, fed by the TMA unit's im2col mode: the
// GEMM's A (output pixels x taps * channels) is never formed; each k-tile is one kernel tap
// and 32 channels, and one TMA request brings the 128 output pixels' inputs at that tap from a
// channels-last activation, zeros where the window leaves the input (tma_mainloop_sm90.cuh runs
// the products). B is the weights packed per tap with the channels padded to 32:
// packed[k][t][c] (zeros for c >= C), so every k-tile is whole.
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

// packed[k][t][c] = w[k][c][t] for c < C and k < K, 0 for the padding up to c_pad and k_rows.
// Grad-input (`flipped`): the problem's w is the forward's transposed and flipped, read from
// the forward's (C, K, kvol) array: w[k][c][t] = forward_w[c][k][kvol - 1 - t].
__global__ void pack_tap_slices_kernel(float* __restrict__ packed, const float* __restrict__ w, int64_t K,
                                       int64_t k_rows, int64_t C, int64_t kvol, int64_t c_pad, bool flipped) {
  const int64_t total = k_rows * kvol * c_pad;
  TG_GRID_STRIDE(e, total) {
    const int64_t c = e % c_pad, t = (e / c_pad) % kvol, k = e / (c_pad * kvol);
    const int64_t from = flipped ? (c * K + k) * kvol + (kvol - 1 - t) : (k * C + c) * kvol + t;
    packed[e] = c < C && k < K ? w[from] : 0.f;
  }
}

Im2colGeometry im2col_geometry(const ConvShape& s, int64_t channels) {
  Im2colGeometry g{};
  g.dims = s.in[0] == 1 && s.kernel[0] == 1 && s.out[0] == 1 ? 2 : 3;
  g.N = s.N;
  g.C = channels;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = s.in[d];
    g.kernel[d] = s.kernel[d];
    g.stride[d] = s.stride[d];
    g.pad[d] = s.pad[d];
    g.pad_hi[d] = s.pad[d];
    g.dilation[d] = s.dilation[d];
  }
  return g;
}

// The channels of the map: C itself for channels-last inputs, C padded to 4 for the scratch.
int64_t map_channels(const ConvShape& s) { return s.channels_last() ? s.C : round_up(s.C, 4); }

}  // namespace

bool conv_fprop_tma_applies(const ConvShape& s, const float* x, int dev) {
  if (s.C < kTmaMinChannels || !device_runs_wgmma(dev)) return false;
  if (s.channels_last() && (s.C % 4 != 0 || !aligned16(x))) return false;
  const int64_t red = s.kernel_volume() * round_up(s.C, kBK);
  return red <= kIndexLimit && fits(s.N * s.out_volume()) && im2col_map_fits(im2col_geometry(s, map_channels(s)));
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
  const int64_t kvol = s.kernel_volume(), c_pad = round_up(s.C, kBK), channels = map_channels(s);
  const TensorOptions f32{.dtype = DType::f32, .device = y.device()};

  // FP32 (split TF32) runs on 128-wide tiles only.
  const int cols = precision == Precision::FP32 ? 128 : policy.tile == 256 ? 256 : s.K <= 64 ? 64 : 128;
  // The weights are packed with zero rows up to whole tiles: a B box that reaches past the
  // operand's last row is filled by the TMA unit far more slowly than one read from memory.
  const int64_t k_rows = round_up(s.K, cols);
  Tensor packed = Tensor::empty({k_rows * kvol * c_pad}, f32);
  pack_tap_slices_kernel<<<grid_for(packed.numel(), kThreads), kThreads, 0, st>>>(
      packed.data<float>(), w.data<float>(), s.K, k_rows, s.C, kvol, c_pad, flipped);
  TG_LAUNCH_CHECK();
  Tensor staged;
  const float* x_last = x.data<float>();
  if (!s.channels_last()) {
    const int64_t pixels = s.in_volume();
    staged = Tensor::empty({s.N * pixels * channels}, f32);
    transpose_into(staged.data<float>(), x.data<float>(), s.N, s.C, pixels, channels, st);
    x_last = staged.data<float>();
  }

  const int64_t M = s.N * s.out_volume(), red = kvol * c_pad;
  const Plan plan = make_tma_plan(M, s.K, red, cols, dev, policy, precision);
  MainloopArgs args{};
  args.M = int32_t(M);
  args.N = int32_t(s.K);
  args.red = int32_t(red);
  args.out = output_map(y.data<float>(), b.defined() ? b.data<float>() : nullptr, M, s.K);
  if (!s.channels_last()) {
    args.out.mode = OutputMap::kChannelsFirst;
    args.out.div = FastDivmod(uint32_t(s.out_volume()));
  }

  const Im2colGeometry geometry_x = im2col_geometry(s, channels);
  Im2colBoxes boxes{};
  boxes.x = f32_im2col_map(flipped ? "conv grad-input (dy)" : "conv forward (x)", x_last, geometry_x, kBK, kTmaBM);
  boxes.w = f32_matrix_map("conv forward (w)", packed.data<float>(), k_rows, red,
                           {.rows = cols, .cols = kBK, .swizzle128 = true});
  boxes.slices = int32_t(c_pad / kBK);
  boxes.kernel_w = int32_t(s.kernel[2]);
  boxes.kernel_h = int32_t(s.kernel[1]);
  boxes.out_w = int32_t(s.out[2]);
  boxes.out_h = int32_t(s.out[1]);
  boxes.out_volume = int32_t(s.out_volume());
  for (int d = 0; d < 3; ++d) {
    boxes.stride[d] = int32_t(s.stride[d]);
    boxes.pad[d] = int32_t(s.pad[d]);
    boxes.dil[d] = int32_t(s.dilation[d]);
  }
  boxes.three_d = geometry_x.dims == 3;
  run_plan(plan, args, y.device(),
           [&](const MainloopArgs& a, cudaStream_t stm) { launch_im2col_tma(boxes, plan, a, stm); });
}

void launch_im2col_tma(const Im2colBoxes& boxes, const Plan& plan, const MainloopArgs& args, cudaStream_t stream) {
  launch_tma_wgmma(boxes, plan, args, stream);
}

}  // namespace tg::cuda::engine
