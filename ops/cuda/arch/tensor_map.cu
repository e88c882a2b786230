// See tensor_map.h. The encoder is a driver function: fetched through the runtime's entry-point
// query, so the library needs no link against libcuda.
#include "ops/cuda/arch/tensor_map.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "core/cuda_context.h"
#include "core/error.h"

namespace tg::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    TG_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    TG_CHECK(found == cudaDriverEntryPointSuccess && f != nullptr,
             "tensor map: the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a 12.0+ driver)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// planes x rows x cols, row-major, as a map of `rank` dimensions (2: planes must be 1).
CUtensorMap encode(const char* op_name, int rank, const float* data, int64_t planes, int64_t rows, int64_t cols,
                   TmaBox box) {
  const int64_t limit = int64_t(1) << 31;
  TG_CHECK(reinterpret_cast<uintptr_t>(data) % 16 == 0 && cols % 4 == 0 && cols > 0 && rows > 0 && planes > 0 &&
               rows < limit && cols < limit && planes < limit && box.rows > 0 && box.rows <= 256 && box.cols > 0 &&
               box.cols <= 256 && box.cols % 4 == 0 && box.planes > 0 && box.planes <= 256 &&
               (rank == 3 || box.planes == 1) && (!box.swizzle128 || box.cols == 32),
           op_name, ": no tensor map for ", planes, " x ", rows, " x ", cols, " floats in boxes of ", box.planes,
           " x ", box.rows, " x ", box.cols, box.swizzle128 ? " (128-byte swizzle)" : "",
           " (needs 16-byte aligned rows, fewer than 2^31)");
  CUtensorMap map{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(planes)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols) * 4, static_cast<cuuint64_t>(cols * rows) * 4};
  const cuuint32_t box_dims[3] = {static_cast<cuuint32_t>(box.cols), static_cast<cuuint32_t>(box.rows),
                                   static_cast<cuuint32_t>(box.planes)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, const_cast<float*>(data), dims, strides,
                               box_dims, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                               box.swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TG_CHECK(r == CUDA_SUCCESS, op_name, ": cuTensorMapEncodeTiled failed (error ", static_cast<int>(r), ") for ",
           planes, " x ", rows, " x ", cols, " floats");
  return map;
}

}  // namespace

CUtensorMap f32_matrix_map(const char* op_name, const float* data, int64_t rows, int64_t cols, TmaBox box) {
  return encode(op_name, 2, data, 1, rows, cols, box);
}

CUtensorMap f32_planes_map(const char* op_name, const float* data, int64_t planes, int64_t rows, int64_t cols,
                           TmaBox box) {
  return encode(op_name, 3, data, planes, rows, cols, box);
}

}  // namespace tg::cuda
