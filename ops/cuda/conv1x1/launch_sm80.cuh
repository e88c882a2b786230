// Host side shared by the 1x1 launchers: device limits, pipeline depth and occupancy, the
// persistent grid's tile walk, and the entry points that conv1x1/dispatch.cu's public functions call
// (run_pointwise in conv1x1/fprop_sm80.cu, run_backward in conv1x1/backward_sm80.cu).
// Design: docs/kernels/conv1x1.md.
#pragma once
#include <algorithm>
#include <cstdint>

#include "../../../core/cuda_context.h"
#include "../../../core/tensor.h"
#include "../../conv.h"
#include "../arch/int_math.h"
#include "epilogue_sm80.cuh"

namespace tg::cuda::conv1x1_detail {

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

struct DeviceLimits {
  int sms = 0;
  int smem_block = 0;  // shared memory per block with opt-in
  int smem_sm = 0;     // shared memory per multiprocessor
  int reserved = 0;    // shared memory the system keeps per block
  // The most dynamic shared memory a block may use for `blocks` blocks to share one SM.
  int smem_for(int blocks) const { return std::min(smem_block, smem_sm / blocks - reserved); }
};
inline DeviceLimits device_limits(int dev) {
  DeviceLimits l;
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&l.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
  return l;
}

// The most pipeline stages (at most kMaxStages) that fit beside `fixed` bytes.
inline int stages_that_fit(int smem_limit, int fixed, int stage_bytes) {
  return std::min(kMaxStages, std::max(0, (smem_limit - fixed) / stage_bytes));
}

// Blocks of `kernel` that fit on one multiprocessor with `smem` bytes of dynamic shared memory.
template <class Kernel>
int blocks_per_sm(Kernel kernel, int threads, int smem) {
  allow_dynamic_smem(kernel, smem);
  int blocks = 0;
  TG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
  TG_CHECK(blocks > 0, "conv1x1: a kernel does not fit on the device with ", smem, " bytes of shared memory");
  return blocks;
}

inline int64_t tiles_per_image(const ConvShape& s) {
  return s.channels_last() ? 0 : ceil_div(s.out_volume(), kTilePixels);
}
inline int64_t tile_count(const ConvShape& s) {
  return s.channels_last() ? ceil_div(s.N * s.out_volume(), kTilePixels) : s.N * tiles_per_image(s);
}
// How `grid` blocks walk the tiles of s (block b: tiles b, b + grid, ...).
inline TileGrid tile_grid(const ConvShape& s, int64_t grid) {
  TG_CHECK(s.N < (int64_t(1) << 31) && tiles_per_image(s) < (int64_t(1) << 31),
           "conv1x1: more than 2^31 images or tiles per image (", s.x_shape(), ")");
  TileGrid t{};
  t.num_tiles = tile_count(s);
  t.tiles_per_image = tiles_per_image(s);
  t.step = grid;
  if (t.tiles_per_image > 0) {
    t.step_n = grid / t.tiles_per_image;
    t.step_rem = grid % t.tiles_per_image;
  }
  return t;
}

// out (M channels) = A (M x R) in (R channels) at every pixel, A(m, r) = w[m * w_stride_m + r * w_stride_r].
// Reduction groups beyond the first accumulate into out (one launch each, in order).
// precision FP32: split products (FP32-accurate); TF32: one TF32 product.
void run_pointwise(const Tensor& out, const Tensor& in, const Tensor& w, const Tensor& bias, int64_t M, int64_t R,
                   int64_t w_stride_m, int64_t w_stride_r, const ConvShape& s, Precision precision);
// True when the fused backward (dx and dw in one kernel) serves s within smem_limit bytes.
bool fused_backward_fits(const ConvShape& s, int smem_limit);
// dw (and dx when with_dx) from dy and x; with_dx needs fused_backward_fits.
void run_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                  const ConvShape& s, bool with_dx, Precision precision);

}  // namespace tg::cuda::conv1x1_detail
