// Upsampling of (N, C, H, W) and (N, C, D, H, W) tensors, PyTorch's F.interpolate semantics
// for the modes nearest, bilinear (4-D) and trilinear (5-D), by a scale factor or to a size.
//
//   Tensor y = tg::upsample_nearest(x, {2});                 // every spatial dim doubled
//   Tensor z = tg::upsample_bilinear2d(x, {1.5, 2}, true);   // align_corners = true
//   Tensor u = tg::upsample(x, {.mode = UpsampleMode::trilinear, .size = {9, 17, 33}});
//
// Source coordinates follow PyTorch exactly, including its arithmetic types: nearest reads
// index min(floor(dst * r), in - 1) with r in float; linear modes read
// max(r * (dst + 0.5) - 0.5, 0) (or r * dst with align_corners) in the tensor's type; r is
// 1/scale_factor when a scale factor is given (PyTorch's recompute_scale_factor=None),
// in/out when a size is, (in-1)/(out-1) with align_corners.
//
// Every output is a weighted sum of at most 2 taps per spatial dim, and the weights are
// separable, so the op is described by one small table per dim, built once on the host and
// shared by both backends (the CPU and the GPU read the same indices and weights). Backward
// is a gather: each input element sums the outputs that read it, in output order, through
// the transposed tables; no atomics, the same bits on every run.
#pragma once
#include <cstdint>
#include <vector>

#include "../core/tensor.h"

namespace tg {

enum class UpsampleMode { nearest, bilinear, trilinear };

struct UpsampleParams {
  UpsampleMode mode = UpsampleMode::nearest;
  std::vector<double> scale_factor = {};  // one for every spatial dim, or one per dim; or ...
  std::vector<int64_t> size = {};         // ... the output's spatial size (exactly one of the two)
  bool align_corners = false;        // bilinear and trilinear only, as in PyTorch
};

Tensor upsample(const Tensor& x, const UpsampleParams& p);
// 4-D or 5-D input: 2-D or 3-D nearest upsampling.
Tensor upsample_nearest(const Tensor& x, const std::vector<double>& scale_factor);
Tensor upsample_bilinear2d(const Tensor& x, const std::vector<double>& scale_factor, bool align_corners = false);
Tensor upsample_trilinear3d(const Tensor& x, const std::vector<double>& scale_factor, bool align_corners = false);

// The flattened problem: x viewed as (NC, in[0], in[1], in[2]) (a 2-D problem has in[0] =
// out[0] = 1); scale[d] > 0 where a scale factor was given for that dim, else 0.
struct UpsampleProblem {
  int64_t NC = 0;
  int64_t in[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  double scale[3] = {0, 0, 0};
  UpsampleMode mode = UpsampleMode::nearest;
  bool align_corners = false;

  int taps() const { return mode == UpsampleMode::nearest ? 1 : 2; }
  int64_t in_numel() const { return NC * in[0] * in[1] * in[2]; }
  int64_t out_numel() const { return NC * out[0] * out[1] * out[2]; }
};

// Where each dim's tables sit in UpsampleTables::ints / reals.
struct UpsampleLayout {
  int taps = 1;
  int64_t fwd_index[3];  // ints: (out[d], taps) source indices
  int64_t fwd_weight[3];  // reals: (out[d], taps) weights
  int64_t bwd_offset[3];  // ints: (in[d] + 1) CSR row starts of the transposed table
  int64_t bwd_output[3];  // ints: the outputs that read each input index, ascending
  int64_t bwd_weight[3];  // reals: their weights
};

struct UpsampleTables {
  std::vector<int64_t> ints;
  std::vector<double> reals;
  UpsampleLayout layout;
};

// The per-dim tables of a problem; `dtype` selects the arithmetic of the linear modes'
// coordinates (float for f32, double for f64), as PyTorch's opmath type does.
UpsampleTables upsample_tables(const UpsampleProblem& p, DType dtype);

// Throws unless the buffers fit the problem (y: out_numel, x: in_numel; one floating dtype,
// one device). Both backends call it first; backward passes (dx, dy) as (x, y).
void check_upsample_buffers(const char* op, const Tensor& y, const Tensor& x, const UpsampleProblem& p);

}  // namespace tg

// Kernel entry points; the CUDA twins are in ops/cuda/upsample.h.
namespace tg::cpu {
void upsample_forward(const Tensor& y, const Tensor& x, const UpsampleProblem& p);
void upsample_backward(const Tensor& dx, const Tensor& dy, const UpsampleProblem& p);
}  // namespace tg::cpu
