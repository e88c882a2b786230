// The TMA kernel's producer (tma_mainloop_sm90.cuh) for convolutions whose A operand the TMA unit
// reads in im2col mode from a channels-last activation: the forward (conv_fprop_sm90_tma.cu) and
// the strided grad-input's phases, each a stride-1 forward over dy (conv_dgrad_sm90_tma.cu).
// Both launch it through launch_im2col_tma, defined once beside the forward, so that the kernel
// is instantiated in one translation unit. Design note: docs/kernels/gemm_tma.md.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

#include "../../conv.h"
#include "../arch/tma.cuh"
#include "kernels.h"

namespace tg::cuda::engine {

// Fewer input channels than this (dy's channels for the grad-input) waste most of each
// 32-channel k-tile: the cp.async kernels serve them.
constexpr int64_t kTmaMinChannels = 16;

// What both im2col producers share: the maps, the convolution's geometry and the walk over
// taps. Spatial arrays are (D, H, W). Window corner of output pixel o: o * stride - pad (pad may
// be negative: the window starts inside the input); tap t's offset from it: t * dil (never
// negative). Taps run W fastest, then H, then D.
struct Im2colWalk {
  CUtensorMap x, w;
  int32_t kernel_w, kernel_h;
  int32_t out_w, out_h, out_volume;
  int32_t stride[3], pad[3], dil[3];
  bool three_d;

  __device__ __forceinline__ void prefetch() const {
    tma::prefetch_map(&x);
    tma::prefetch_map(&w);
  }
  // The window corner of output pixel m0 (image, then spatial position).
  __device__ __forceinline__ void corner(int32_t m0, int32_t& iw, int32_t& ih, int32_t& id, int32_t& img) const {
    img = m0 / out_volume;
    const int32_t pix = m0 - img * out_volume;
    const int32_t ow = pix % out_w, oh = (pix / out_w) % out_h, od = pix / (out_w * out_h);
    iw = ow * stride[2] - pad[2];
    ih = oh * stride[1] - pad[1];
    id = od * stride[0] - pad[0];
  }
  __device__ __forceinline__ void tap_of(int32_t tap, int32_t& tx, int32_t& ty, int32_t& tz) const {
    tx = tap % kernel_w;
    ty = (tap / kernel_w) % kernel_h;
    tz = tap / (kernel_w * kernel_h);
  }
  __device__ __forceinline__ void next_tap(int32_t& tx, int32_t& ty, int32_t& tz) const {
    if (++tx < kernel_w) return;
    tx = 0;
    if (++ty < kernel_h) return;
    ty = 0;
    ++tz;
  }
};

// The walk's geometry from s (the caller sets the maps): tiles of output pixels over s's output,
// taps over its kernel.
inline void set_walk_geometry(Im2colWalk& walk, const ConvShape& s, bool three_d) {
  walk.kernel_w = int32_t(s.kernel[2]);
  walk.kernel_h = int32_t(s.kernel[1]);
  walk.out_w = int32_t(s.out[2]);
  walk.out_h = int32_t(s.out[1]);
  walk.out_volume = int32_t(s.out_volume());
  for (int d = 0; d < 3; ++d) {
    walk.stride[d] = int32_t(s.stride[d]);
    walk.pad[d] = int32_t(s.pad[d]);
    walk.dil[d] = int32_t(s.dilation[d]);
  }
  walk.three_d = three_d;
}

// k-tile kt = (tap, channel slice): A from the im2col map at that tap's offsets, B the packed
// weights' columns kt * kSlice.. . A slice is 32 f32 channels, or 64 bf16 ones (kBf16: the
// same 128-byte rows; tma_mainloop_sm90.cuh runs BF16 products on them). The cursor holds the
// block's window corner (fixed) and the k-tile's channel and tap (stepped).
template <bool kBf16Elements>
struct Im2colSlices : Im2colWalk {
  static constexpr bool kBf16 = kBf16Elements;
  static constexpr int kSlice = kBf16Elements ? 2 * kBK : kBK;  // channels per k-tile
  int32_t slices;  // channel slices per tap
  struct Cursor {
    int32_t iw, ih, id, img;  // the tile's first output pixel's window corner: where the walk starts
    int32_t c0, tx, ty, tz;   // the k-tile's first channel and its tap
  };

  __device__ __forceinline__ Cursor start(int32_t kt, int32_t m0) const {
    Cursor at;
    corner(m0, at.iw, at.ih, at.id, at.img);
    const int32_t tap = kt / slices;
    at.c0 = (kt - tap * slices) * kSlice;
    tap_of(tap, at.tx, at.ty, at.tz);
    return at;
  }
  __device__ __forceinline__ void advance(Cursor& at) const {
    at.c0 += kSlice;
    if (at.c0 < slices * kSlice) return;
    at.c0 = 0;
    next_tap(at.tx, at.ty, at.tz);
  }
  __device__ __forceinline__ void load(unsigned char* a_dst, unsigned char* b_dst, uint64_t* bar, const Cursor& at,
                                       int32_t kt, int32_t n0) const {
    const uint16_t off_w = uint16_t(at.tx * dil[2]), off_h = uint16_t(at.ty * dil[1]), off_d = uint16_t(at.tz * dil[0]);
    if (three_d) tma::load_im2col_5d(a_dst, &x, bar, at.c0, at.iw, at.ih, at.id, at.img, off_w, off_h, off_d);
    else tma::load_im2col_4d(a_dst, &x, bar, at.c0, at.iw, at.ih, at.img, off_w, off_h);
    tma::load_box(b_dst, &w, bar, kt * kSlice, n0);
  }
};
using Im2colBoxes = Im2colSlices<false>;

// Few channels (a forward's C, or a grad-input's dy channels, below kTmaMinChannels): a
// 32-channel slice per tap would be mostly zeros. Instead k-tile kt holds the 8 (tap, channel
// quad) pairs 8 kt .. 8 kt + 7 of the reduction, pair = tap * quads + quad: eight im2col requests
// of 128 pixels x 4 channels (2 KB each, no swizzle), placed one after another, so that A's
// stage is 8 K-major core-matrix columns: k 4j..4j+3 of the tile is pair j's box (the wgmma
// descriptor's LBO steps from one box to the next, SBO = 128 bytes is 8 pixels). B is the
// weights packed in the same pair order (packed[k][pair * 4 + c]). Pairs past the last
// (kvol * quads) are requested at a channel past the map's last, which the TMA unit fills with
// zeros: the products over them add exact zeros, whatever the stage held before.
struct Im2colQuadBoxes : Im2colWalk {
  static constexpr bool kChannelQuads = true;  // A's stage layout (tma_mainloop_sm90.cuh)
  static constexpr int kPairsPerKTile = kBK / 4;
  static constexpr int kBoxBytes = 128 * 4 * 4;  // 128 pixels x 4 channels
  int32_t quads;         // channel quads per tap
  int32_t pairs;         // kvol * quads
  int32_t past_channel;  // a channel coordinate past the map's last
  struct Cursor {
    int32_t iw, ih, id, img;      // the tile's first output pixel's window corner
    int32_t pair, q, tx, ty, tz;  // the next pair: its quad and tap
  };

  __device__ __forceinline__ Cursor start(int32_t kt, int32_t m0) const {
    Cursor at;
    corner(m0, at.iw, at.ih, at.id, at.img);
    at.pair = kt * kPairsPerKTile;
    const int32_t tap = at.pair / quads;
    at.q = at.pair - tap * quads;
    tap_of(tap, at.tx, at.ty, at.tz);
    return at;
  }
  __device__ __forceinline__ void step(Cursor& at) const {
    ++at.pair;
    if (++at.q < quads) return;
    at.q = 0;
    next_tap(at.tx, at.ty, at.tz);
  }
  __device__ __forceinline__ void advance(Cursor& at) const {
#pragma unroll
    for (int j = 0; j < kPairsPerKTile; ++j) step(at);
  }
  __device__ __forceinline__ void load(unsigned char* a_dst, unsigned char* b_dst, uint64_t* bar, const Cursor& from,
                                       int32_t kt, int32_t n0) const {
    Cursor at = from;
#pragma unroll
    for (int j = 0; j < kPairsPerKTile; ++j) {
      // A pair past the last: tap offsets 0 (within the map's offset range), no channel inside.
      const bool real = at.pair < pairs;
      const int32_t c0 = real ? at.q * 4 : past_channel;
      const uint16_t off_w = uint16_t(real ? at.tx * dil[2] : 0), off_h = uint16_t(real ? at.ty * dil[1] : 0);
      unsigned char* dst = a_dst + j * kBoxBytes;
      if (three_d)
        tma::load_im2col_5d(dst, &x, bar, c0, at.iw, at.ih, at.id, at.img, off_w, off_h,
                            uint16_t(real ? at.tz * dil[0] : 0));
      else tma::load_im2col_4d(dst, &x, bar, c0, at.iw, at.ih, at.img, off_w, off_h);
      step(at);
    }
    tma::load_box(b_dst, &w, bar, kt * kBK, n0);
  }
};

// One launch of the TMA kernel with each producer over plan's tiles (conv_fprop_sm90_tma.cu;
// the bf16 one in conv_bf16_sm90_tma.cu).
void launch_im2col_tma(const Im2colBoxes& boxes, const Plan& plan, const MainloopArgs& args, cudaStream_t stream);
void launch_im2col_tma(const Im2colQuadBoxes& boxes, const Plan& plan, const MainloopArgs& args, cudaStream_t stream);
void launch_im2col_tma(const Im2colSlices<true>& boxes, const Plan& plan, const MainloopArgs& args,
                       cudaStream_t stream);

}  // namespace tg::cuda::engine
