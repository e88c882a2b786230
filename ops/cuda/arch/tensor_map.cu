// See tensor_map.h. The encoder is a driver function: fetched through the runtime's entry-point
// query, so the library needs no link against libcuda.
#include "ops/cuda/arch/tensor_map.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "core/cuda_context.h"
#include "core/error.h"

namespace tg::cuda {
namespace {

// The driver's encoders, looked up once.
template <class Fn>
Fn driver_function(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult found{};
  TG_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &found));
  TG_CHECK(found == cudaDriverEntryPointSuccess && f != nullptr, "tensor map: the CUDA driver has no ", name,
           " (TMA needs a 12.0+ driver)");
  return reinterpret_cast<Fn>(f);
}

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const auto fn = driver_function<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled");
  return fn;
}

// planes x rows x cols elements of `bytes` bytes (4: f32, 2: bf16), row-major, as a map of
// `rank` dimensions (2: planes must be 1).
CUtensorMap encode(const char* op_name, int rank, const void* data, int bytes, int64_t planes, int64_t rows,
                   int64_t cols, TmaBox box) {
  const int64_t limit = int64_t(1) << 31, per_16 = 16 / bytes;
  TG_CHECK(reinterpret_cast<uintptr_t>(data) % 16 == 0 && cols % per_16 == 0 && cols > 0 && rows > 0 && planes > 0 &&
               rows < limit && cols < limit && planes < limit && box.rows > 0 && box.rows <= 256 && box.cols > 0 &&
               box.cols <= 256 && box.cols % per_16 == 0 && box.planes > 0 && box.planes <= 256 &&
               (rank == 3 || box.planes == 1) && (!box.swizzle128 || box.cols * bytes == 128),
           op_name, ": no tensor map for ", planes, " x ", rows, " x ", cols, bytes == 4 ? " floats" : " bf16",
           " in boxes of ", box.planes, " x ", box.rows, " x ", box.cols, box.swizzle128 ? " (128-byte swizzle)" : "",
           " (needs 16-byte aligned rows, fewer than 2^31)");
  CUtensorMap map{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(planes)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols) * bytes, static_cast<cuuint64_t>(cols * rows) * bytes};
  const cuuint32_t box_dims[3] = {static_cast<cuuint32_t>(box.cols), static_cast<cuuint32_t>(box.rows),
                                   static_cast<cuuint32_t>(box.planes)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type = bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = encoder()(&map, type, rank, const_cast<void*>(data), dims, strides,
                               box_dims, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                               box.swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TG_CHECK(r == CUDA_SUCCESS, op_name, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(r), ") for ",
           planes, " x ", rows, " x ", cols, bytes == 4 ? " floats" : " bf16");
  return map;
}

}  // namespace

CUtensorMap f32_matrix_map(const char* op_name, const float* data, int64_t rows, int64_t cols, TmaBox box) {
  return encode(op_name, 2, data, 4, 1, rows, cols, box);
}

CUtensorMap bf16_matrix_map(const char* op_name, const uint16_t* data, int64_t rows, int64_t cols, TmaBox box) {
  return encode(op_name, 2, data, 2, 1, rows, cols, box);
}

CUtensorMap f32_planes_map(const char* op_name, const float* data, int64_t planes, int64_t rows, int64_t cols,
                           TmaBox box) {
  return encode(op_name, 3, data, 4, planes, rows, cols, box);
}

CUtensorMap bf16_planes_map(const char* op_name, const uint16_t* data, int64_t planes, int64_t rows, int64_t cols,
                            TmaBox box) {
  return encode(op_name, 3, data, 2, planes, rows, cols, box);
}

// The im2col corners and tap offsets are narrow fields whose width shrinks with the rank: for a
// rank-4 map (2 spatial dims) corners lie in [-128, 127], for rank 5 in [-16, 15] (CUDA driver
// API, cuTensorMapEncodeIm2col); the tap offsets are kept to the same magnitude. Traversal
// strides are 1..8. The box must not be empty (the driver asks for a non-zero area): at least
// one window corner per dim. A negative pad (lower corner inside the input) is allowed.
bool im2col_map_fits(const Im2colGeometry& g) {
  if (g.dims != 2 && g.dims != 3) return false;
  const int64_t lo = g.dims == 2 ? -128 : -16, hi = g.dims == 2 ? 127 : 15;
  for (int d = 3 - g.dims; d < 3; ++d) {
    const int64_t reach = g.dilation[d] * (g.kernel[d] - 1);
    const int64_t lower = -g.pad[d], upper = g.pad_hi[d] - reach;  // the corners
    if (lower < lo || lower > hi || upper < lo || upper > hi) return false;
    if (reach < 0 || reach > hi || g.stride[d] < 1 || g.stride[d] > 8) return false;
    if (g.in[d] < 1 || g.in[d] >= (int64_t(1) << 31) || g.in[d] + upper - lower < 1) return false;
  }
  // A rank-4 map has no D coordinate: the D dim must be the identity (one plane, one tap, no
  // padding), or its window would read the plane where padding zeros belong.
  if (g.dims == 2 && (g.in[0] != 1 || g.kernel[0] != 1 || g.pad[0] != 0 || g.pad_hi[0] != 0)) return false;
  return g.N >= 1 && g.N < (int64_t(1) << 31) && g.C >= 1 && g.C % 4 == 0 && g.C < (int64_t(1) << 31);
}

namespace {

// Elements of `bytes` bytes (4: f32, 2: bf16); a request's row of channels is at most 128 bytes,
// swizzled at exactly 128.
CUtensorMap im2col_map(const char* op_name, const void* data, int bytes, const Im2colGeometry& g, int channels,
                       int pixels) {
  const int per_16 = 16 / bytes;
  TG_CHECK(reinterpret_cast<uintptr_t>(data) % 16 == 0 && im2col_map_fits(g) && g.C % per_16 == 0 && channels > 0 &&
               channels * bytes <= 128 && channels % per_16 == 0 && pixels > 0 && pixels <= 256,
           op_name, ": no im2col tensor map for ", g.N, " images of ", g.C, bytes == 4 ? " f32" : " bf16",
           " channels (", channels, " channels x ", pixels, " pixels per request)");
  static const auto encode_im2col = driver_function<PFN_cuTensorMapEncodeIm2col_v12000>("cuTensorMapEncodeIm2col");
  const int rank = g.dims + 2;
  // Innermost first: C, W, H, [D,] N; corners and strides W, H, [D].
  cuuint64_t dims[5], strides[4];
  cuuint32_t element_strides[5];
  int lower[3], upper[3];
  dims[0] = cuuint64_t(g.C);
  element_strides[0] = 1;
  cuuint64_t stride_bytes = cuuint64_t(g.C) * bytes;
  for (int i = 0; i < g.dims; ++i) {
    const int d = 2 - i;  // W, H, D
    dims[1 + i] = cuuint64_t(g.in[d]);
    strides[i] = stride_bytes;
    stride_bytes *= cuuint64_t(g.in[d]);
    element_strides[1 + i] = cuuint32_t(g.stride[d]);
    lower[i] = int(-g.pad[d]);
    upper[i] = int(g.pad_hi[d] - g.dilation[d] * (g.kernel[d] - 1));
  }
  dims[rank - 1] = cuuint64_t(g.N);
  strides[rank - 2] = stride_bytes;
  element_strides[rank - 1] = 1;
  CUtensorMap map{};
  const CUtensorMapDataType type = bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = encode_im2col(&map, type, cuuint32_t(rank), const_cast<void*>(data),
                                   dims, strides, lower, upper, cuuint32_t(channels), cuuint32_t(pixels),
                                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                   channels * bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TG_CHECK(r == CUDA_SUCCESS, op_name, ": cuTensorMapEncodeIm2col failed (error ", static_cast<int>(r), ") for ",
           g.N, " images of ", g.C, " channels");
  return map;
}

}  // namespace

CUtensorMap f32_im2col_map(const char* op_name, const float* data, const Im2colGeometry& g, int channels,
                           int pixels) {
  return im2col_map(op_name, data, 4, g, channels, pixels);
}

CUtensorMap bf16_im2col_map(const char* op_name, const uint16_t* data, const Im2colGeometry& g, int channels,
                            int pixels) {
  return im2col_map(op_name, data, 2, g, channels, pixels);
}

}  // namespace tg::cuda
