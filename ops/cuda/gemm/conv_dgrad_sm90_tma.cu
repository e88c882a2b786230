// The engine's strided convolution grad-input on Hopper's TMA kernel, TF32 or FP32 (split TF32).
// dx splits into stride phases (dgrad_phases.h): the input pixels first + stride * j of each dim
// receive from a fixed subset of the taps, through dy pixels that advance by one per j. With
// those taps reversed, each phase is a stride-1 forward convolution over dy (K input channels,
// dy's spatial size, `taps` taps at dilation out_step, a padding that may be negative) giving the
// phase's pixels, C output channels: the forward's im2col producer (im2col_boxes.cuh) runs it
// unchanged, and the output map's phase mode scatters its rows into dx.
//
// dy is read through the im2col map in place when channels-last with K % 4 == 0; NCDHW dy is
// transposed once into a channels-last scratch (K padded to 4) that every phase reads. B per
// phase is the weights packed per reversed tap with dy's channels padded to 32, rows (dx's
// channels) padded with zeros to whole tiles, as the forward packs them. Phases no tap reaches
// are zeroed up front. Design note: docs/kernels/gemm_tma.md.
#include <algorithm>

#include "core/cuda_context.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/arch/int_math.h"
#include "ops/cuda/arch/tensor_map.h"
#include "ops/cuda/gemm/im2col_boxes.cuh"
#include "ops/cuda/gemm/operands.cuh"
#include "ops/cuda/gemm/planning.h"
#include "ops/cuda/gemm/tma_mainloop_sm90.cuh"

namespace tg::cuda::engine {
namespace {

// One phase's B: packed[c][t][k] = w[k][c][tap(t)] for c < C and k < K, zeros up to c_rows and
// k_pad. t = (iz, iy, ix), x fastest, is the phase forward's tap in the order Im2colBoxes steps
// through them; per dim it carries the weight of tap tap0 + (taps - 1 - i) * tap_step (the
// reversed order, dgrad_phases.h).
// T: float, or uint16_t (bf16 bit patterns; zeros +0).
template <class T>
__global__ void pack_phase_slices_kernel(T* __restrict__ packed, const T* __restrict__ w, int64_t K, int64_t k_pad,
                                         int64_t C, int64_t c_rows, PhaseTaps pt) {
  const int64_t taps = int64_t(pt.taps[0]) * pt.taps[1] * pt.taps[2];
  const int64_t kvol = int64_t(pt.kernel[0]) * pt.kernel[1] * pt.kernel[2];
  const int64_t total = c_rows * taps * k_pad;
  TG_GRID_STRIDE(e, total) {
    const int64_t k = e % k_pad, t = (e / k_pad) % taps, c = e / (k_pad * taps);
    packed[e] = c < C && k < K ? w[(k * C + c) * kvol + pt.kernel_tap</*kReversed=*/true>(t)] : T(0);
  }
}

int64_t pixel_volume(const DimPhase (&dims)[3]) { return int64_t(dims[0].count) * dims[1].count * dims[2].count; }
int64_t tap_volume(const DimPhase (&dims)[3]) { return int64_t(dims[0].taps) * dims[1].taps * dims[2].taps; }

// Elements of T in 16 bytes (the TMA's stride rule): 4 floats, 8 bf16; and per k-tile slice.
template <class T>
constexpr int64_t kPer16 = 16 / sizeof(T);
template <class T>
constexpr int64_t kSliceOf = Im2colSlices<sizeof(T) == 2>::kSlice;

// The channels of dy's map: K itself for channels-last dy, K padded to 16 bytes for the scratch.
template <class T>
int64_t map_channels(const ConvShape& s) { return s.channels_last() ? s.K : round_up(s.K, kPer16<T>); }

template <class T>
bool phases_apply(const ConvShape& s, const void* dy, int dev) {
  if (s.stride[0] == 1 && s.stride[1] == 1 && s.stride[2] == 1) return false;
  if (s.K < kTmaMinChannels || !device_runs_wgmma(dev)) return false;
  if (s.channels_last() && (s.K % kPer16<T> != 0 || !aligned16(dy))) return false;
  const int64_t channels = map_channels<T>(s), k_pad = round_up(s.K, kSliceOf<T>);
  bool fit = true;
  for_each_phase(s, [&](const DimPhase (&dims)[3]) {
    const int64_t pixels = pixel_volume(dims), taps = tap_volume(dims);
    if (pixels == 0 || taps == 0) return;  // nothing to run
    fit = fit && fits(s.N * pixels) && taps * k_pad <= kIndexLimit &&
          im2col_map_fits(phase_im2col_geometry(s, dims, channels));
  });
  return fit;
}

// dx (f32, or bf16 for bf16 T) from dy and w of element type T (f32, or bf16 with BF16 products).
template <class T>
void dgrad_phases(const Tensor& dx, const T* dy, const T* w, const ConvShape& s, Precision precision,
                  const EnginePolicy& policy) {
  constexpr bool kBf16 = sizeof(T) == 2;
  const int dev = dx.device().index;
  cudaStream_t st = stream(dev);
  const TensorOptions elements{.dtype = kBf16 ? DType::bf16 : DType::f32, .device = dx.device()};
  const int64_t channels = map_channels<T>(s), k_pad = round_up(s.K, kSliceOf<T>);
  // As the forward picks for its K (here C); FP32 (split TF32) on 64- or 128-wide tiles.
  const bool split = !kBf16 && precision == Precision::FP32;
  const int narrow = s.C <= 64 ? 64 : 128;
  const int cols = split ? (policy.tile == 128 ? 128 : narrow) : policy.tile == 256 ? 256 : narrow;
  // dx's channels are B's rows, padded with zero rows to whole tiles: a B box reaching past the
  // operand's last row is filled far more slowly than one read from memory.
  const int64_t c_rows = round_up(s.C, cols);

  int64_t packed_elements = 0;
  bool gradless = false;
  for_each_phase(s, [&](const DimPhase (&dims)[3]) {
    if (pixel_volume(dims) == 0) return;
    if (tap_volume(dims) == 0) gradless = true;
    else packed_elements += c_rows * tap_volume(dims) * k_pad;
  });
  // Every dx pixel belongs to exactly one phase: zeros first where some phase gets no gradient,
  // and the phases with taps overwrite their own pixels.
  if (gradless) TG_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.numel() * dtype_size(dx.dtype()), st));
  if (packed_elements == 0) return;

  // Scratch freed at the end of this function is stream-ordered: safe once the launches are queued.
  Tensor packed = Tensor::empty({packed_elements}, elements);
  Tensor staged;
  const T* dy_last = dy;
  if (!s.channels_last()) {
    staged = Tensor::empty({s.N * s.out_volume() * channels}, elements);
    transpose_into(static_cast<T*>(staged.raw_data()), dy, s.N, s.K, s.out_volume(), channels, st);
    dy_last = static_cast<const T*>(staged.raw_data());
  }

  int64_t packed_offset = 0;  // a multiple of one slice (128 bytes): every phase's B stays 16-byte aligned
  for_each_phase(s, [&](const DimPhase (&dims)[3]) {
    const int64_t pixels = pixel_volume(dims), taps = tap_volume(dims);
    if (pixels == 0 || taps == 0) return;
    const int64_t M = s.N * pixels, red = taps * k_pad;
    T* phase_w = static_cast<T*>(packed.raw_data()) + packed_offset;
    packed_offset += c_rows * red;
    const PhaseTaps pt = phase_taps(s, dims);
    pack_phase_slices_kernel<T><<<grid_for(c_rows * red, kThreads), kThreads, 0, st>>>(phase_w, w, s.K, k_pad, s.C,
                                                                                        c_rows, pt);
    TG_LAUNCH_CHECK();

    const Plan plan = make_tma_plan(M, s.C, red, cols, dev, policy, precision, kBf16);
    MainloopArgs args{};
    args.M = int32_t(M);
    args.N = int32_t(s.C);
    args.red = int32_t(red);
    // Permuted rows: the kernel stores element by element through the map (tile_store_for);
    // split partial sums reach it in the reduction pass.
    args.out = phase_output_map(dx, s, phase_geometry(dims));

    const Im2colGeometry geometry = phase_im2col_geometry(s, dims, channels);
    Im2colSlices<kBf16> boxes{};
    const TmaBox w_box{.rows = cols, .cols = int(kSliceOf<T>), .swizzle128 = true};
    if constexpr (kBf16) {
      boxes.x = bf16_im2col_map("conv grad-input phase, bf16 (dy)", dy_last, geometry, int(kSliceOf<T>), kTmaBM);
      boxes.w = bf16_matrix_map("conv grad-input phase, bf16 (w)", phase_w, c_rows, red, w_box);
    } else {
      boxes.x = f32_im2col_map("conv grad-input phase (dy)", dy_last, geometry, kBK, kTmaBM);
      boxes.w = f32_matrix_map("conv grad-input phase (w)", phase_w, c_rows, red, w_box);
    }
    boxes.slices = int32_t(k_pad / kSliceOf<T>);
    boxes.kernel_w = dims[2].taps;
    boxes.kernel_h = dims[1].taps;
    boxes.out_w = dims[2].count;
    boxes.out_h = dims[1].count;
    boxes.out_volume = int32_t(pixels);
    for (int d = 0; d < 3; ++d) {
      boxes.stride[d] = 1;
      boxes.pad[d] = int32_t(geometry.pad[d]);
      boxes.dil[d] = dims[d].out_step;
    }
    boxes.three_d = geometry.dims == 3;
    run_plan(plan, args, dx.device(),
             [&](const MainloopArgs& a, cudaStream_t stm) { launch_im2col_tma(boxes, plan, a, stm); });
  });
}

}  // namespace

bool conv_dgrad_phases_tma_applies(const ConvShape& s, const float* dy, int dev) {
  return phases_apply<float>(s, dy, dev);
}

void conv_dgrad_phases_tma(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                           Precision precision, const EnginePolicy& policy) {
  dgrad_phases<float>(dx, dy.data<float>(), w.data<float>(), s, precision, policy);
}

bool conv_dgrad_phases_bf16_tma_applies(const ConvShape& s, const Tensor& dy) {
  return phases_apply<uint16_t>(s, dy.raw_data(), dy.device().index);
}

void conv_dgrad_phases_bf16_tma(const Tensor& dx, const Tensor& dy, const Tensor& w, const ConvShape& s,
                                const EnginePolicy& policy) {
  dgrad_phases<uint16_t>(dx, bf16_bits(dy), bf16_bits(w), s, Precision::TF32, policy);
}

}  // namespace tg::cuda::engine
