// A fixed-order reduction of one double per thread over a 1-D block (warp shuffles, then one
// warp over the warp results), shared by the kernels that reduce in f64: the result does not
// depend on scheduling, so repeated runs give the same bits.
#pragma once

namespace tg::cuda {
namespace {

struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// Reduces v over a 1-D block whose size is a multiple of 32; every thread gets the result.
// `identity` fills the lanes of the missing warps.
template <class Op>
__device__ double block_reduce(double v, Op op, double identity) {
  __shared__ double part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? part[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) part[0] = v;
  }
  __syncthreads();
  v = part[0];
  __syncthreads();  // the next call may overwrite part
  return v;
}

}  // namespace
}  // namespace tg::cuda
