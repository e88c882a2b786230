// Host side of the TMA kernels (ops/cuda/arch/tma.cuh): the descriptor ("tensor map") through which
// the TMA unit reads and writes boxes of a row-major f32 matrix.
#pragma once
#include <cstdint>

#include <cuda.h>  // CUtensorMap

namespace tg::cuda {

// What one TMA request moves: a box of `rows` x `cols` elements, and its layout in shared memory.
struct TmaBox {
  int rows, cols;
  // false: dense, rows of cols elements. true: the 128-byte swizzle (rows of 128 bytes: cols 32
  // floats or 64 bf16): the 16-byte chunk c of box row r lands at chunk position c ^ (r % 8), so that 8
  // rows' chunk c fall in 8 different bank groups (ldmatrix without conflicts); such boxes must
  // start 1024-byte aligned in shared memory.
  bool swizzle128;
  int planes = 1;  // f32_planes_map only: consecutive planes per box (box rows x cols each)
};

// A tensor map over the row-major f32 matrix at `data` (rows x cols, row stride cols floats),
// moved in boxes `box`. Loads fill what lies outside the matrix with zeros; stores skip it.
// Needs data 16-byte aligned, cols % 4 == 0 (16-byte row stride), rows < 2^31, box sides 1..256
// (cols * 4 a multiple of 16): a TG_CHECK naming op_name says so otherwise.
CUtensorMap f32_matrix_map(const char* op_name, const float* data, int64_t rows, int64_t cols, TmaBox box);
// The same over bf16 elements (bit patterns): rows of cols * 2 bytes, a multiple of 16; the
// 128-byte swizzle needs box.cols 64.
CUtensorMap bf16_matrix_map(const char* op_name, const uint16_t* data, int64_t rows, int64_t cols, TmaBox box);

// The same over `planes` such matrices stored one after another (planes x rows x cols, e.g. an
// NCHW tensor as N planes of C x HW), boxes of box.planes planes: rows past a plane's last are
// outside (zeros / skipped), never the next plane's.
CUtensorMap f32_planes_map(const char* op_name, const float* data, int64_t planes, int64_t rows, int64_t cols,
                           TmaBox box);
CUtensorMap bf16_planes_map(const char* op_name, const uint16_t* data, int64_t planes, int64_t rows, int64_t cols,
                            TmaBox box);

// A channels-last activation (N, [D,] H, W, C) read through the TMA unit's im2col mode: one
// request brings `pixels` consecutive output pixels' inputs at one kernel tap, `channels`
// channels each (rows of channels * 4 bytes, 128-byte swizzled when channels is 32). The walk
// over output pixels runs W, then H, [then D,] then N, each spatial coordinate starting at -pad
// and stepping by the stride up to in - 1 + pad_hi - dilation * (kernel - 1) (the box's lower
// and upper corners); what falls outside the input (padding, past the last image) arrives as
// zeros. A convolution has pad_hi = pad; a negative pad starts the walk inside the input (the
// strided grad-input's phases). `dims` 2 or 3 spatial dimensions, each array in (D, H, W) order
// with only the last `dims` entries used. Needs data 16-byte aligned and C % 4 == 0; the corners
// and tap offsets within the hardware's ranges (im2col_map_fits).
struct Im2colGeometry {
  int dims;  // 2: rank-4 map (N, H, W, C); 3: rank-5 map (N, D, H, W, C)
  int64_t N, C;
  int64_t in[3], kernel[3], stride[3], pad[3], dilation[3];
  int64_t pad_hi[3];  // the upper side's padding: the upper corner is pad_hi - dilation * (kernel - 1)
};
bool im2col_map_fits(const Im2colGeometry& g);
CUtensorMap f32_im2col_map(const char* op_name, const float* data, const Im2colGeometry& g, int channels,
                           int pixels);
// The same over a bf16 activation (bit patterns): C % 8 == 0 (16-byte rows), `channels` a
// multiple of 8 up to 64 (64: the 128-byte swizzle).
CUtensorMap bf16_im2col_map(const char* op_name, const uint16_t* data, const Im2colGeometry& g, int channels,
                            int pixels);

}  // namespace tg::cuda
