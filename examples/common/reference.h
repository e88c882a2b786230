// f64 references computed directly from the definitions (plain loops, no GEMM tricks), for
// the examples and the benchmark. They evaluate only the requested elements, so a
// full-size workload is checked on a few hundred samples in a second or two.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "common/host.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace ex {

// The geometry of a 2-D or 3-D convolution, the one struct shared by every reference below.
// Unused spatial dims have size 1. Weight is always (K, C, k...) as in PyTorch.
struct ConvGeometry {
  int64_t N = 0, C = 0, K = 0;
  int spatial = 2;
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1};
  std::array<int64_t, 3> stride{1, 1, 1}, pad{0, 0, 0}, dilation{1, 1, 1};
  bool channels_last = false;  // x (N, H, W, C) and y (N, H, W, K); 2-D only

  // x (N, C, spatial...) or (N, H, W, C); w (K, C, k...); stride/pad/dilation: one value
  // for every dim or one per dim.
  static ConvGeometry make(const tg::Shape& x, const tg::Shape& w, const std::vector<int64_t>& stride,
                           const std::vector<int64_t>& pad, const std::vector<int64_t>& dilation,
                           bool channels_last);
  tg::Shape y_shape() const;
  int64_t out_positions() const { return out[0] * out[1] * out[2]; }
  int64_t in_positions() const { return in[0] * in[1] * in[2]; }
  int64_t kernel_positions() const { return kernel[0] * kernel[1] * kernel[2]; }
  int64_t x_index(int64_t n, int64_t c, int64_t pos) const;  // pos: flat spatial position
  int64_t y_index(int64_t n, int64_t k, int64_t pos) const;
  // Multiply-adds of the forward pass (the backward pass does twice as many).
  double macs() const { return double(N) * K * C * out_positions() * kernel_positions(); }
};

// y[n, k, o] = sum_{c, r} w[k, c, r] * x[n, c, o * stride - pad + r * dilation] (+ b[k]),
// at the flat output indices given. `b` may be empty.
std::vector<double> conv_forward_ref(const ConvGeometry& g, const HostTensor& x, const HostTensor& w,
                                     const std::vector<float>& b, const std::vector<int64_t>& y_indices);
// dx at the flat input indices: every (k, r) whose output position o maps onto that input.
std::vector<double> conv_input_grad_ref(const ConvGeometry& g, const HostTensor& dy, const HostTensor& w,
                                        const std::vector<int64_t>& x_indices);
// dw at the flat weight indices: a sum over the whole batch and every output position.
std::vector<double> conv_weight_grad_ref(const ConvGeometry& g, const HostTensor& x, const HostTensor& dy,
                                         const std::vector<int64_t>& w_indices);

// Linear without bias as workload D uses it: y (M, 1) = A (M, K) w(1, K)^T.
// A may be on the GPU: only the rows / column blocks needed are read.
std::vector<double> linear_forward_ref(const tg::Tensor& A, const std::vector<float>& w,
                                       const std::vector<int64_t>& rows);
// dw[j] = sum_i dy[i] A[i, j] for the columns given (consecutive columns are read together).
std::vector<double> linear_weight_grad_ref(const tg::Tensor& A, const std::vector<float>& dy,
                                           const std::vector<int64_t>& columns);

// Workload C, whole: z = conv3d(x, w, b); g = group_norm(z, gamma, beta); y[n] = mean(g[n]).
// With dy (N) given, also every gradient of sum(y * dy).
struct ConvNormMeanReference {
  std::vector<double> z, normalized, y;
  std::vector<double> dx, dw, db, dgamma, dbeta;  // filled when dy is given
};
ConvNormMeanReference conv_norm_mean_ref(const ConvGeometry& g, const HostTensor& x, const HostTensor& w,
                                         const std::vector<float>& b, const std::vector<float>& gamma,
                                         const std::vector<float>& beta, int64_t groups, double eps,
                                         const std::vector<float>* dy);

// Picks the elements of `all` at `indices`.
std::vector<double> gather(const std::vector<double>& all, const std::vector<int64_t>& indices);

}  // namespace ex
