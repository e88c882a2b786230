// Fused layers: explicit modules whose forward is one fused op. A model opts into a fusion by
// using the fused module instead of the sequence of layers it replaces; nothing is fused
// behind the user's back, and the parameters keep the names of the layers they replace, so
// a state dict maps one to one onto the PyTorch model written with those layers.
#pragma once
#include <cstdint>
#include <memory>

#include "layers.h"
#include "module.h"

namespace tg::nn {

struct Conv3dGroupNormMeanOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel_size = 3;  // cubic; stride 1, padding 0, dilation 1, with bias
  int64_t num_groups = 0;
  double eps = 1e-5;
};

// Workload C as one layer: x (N, C, D, H, W) -> (N), the same function as PyTorch's
//
//   class Conv3dGroupNormMean(nn.Module):
//       def __init__(self, c_in, c_out, k, groups, eps):
//           super().__init__()
//           self.conv = nn.Conv3d(c_in, c_out, k)
//           self.norm = nn.GroupNorm(groups, c_out, eps=eps)
//       def forward(self, x):
//           return self.norm(self.conv(x)).mean(dim=(1, 2, 3, 4))
//
// with parameters "conv.weight", "conv.bias", "norm.weight", "norm.bias" initialized as
// those layers are (kaiming-uniform conv, gamma = 1, beta = 0). Forward is one call of
// conv3d_group_norm_mean (one tape entry); the conv output is never materialized on the GPU.
// Note that at gamma = 1 the output is mean(beta) whatever the input: gradients reach the
// conv only once training has made gamma non-uniform within a group.
class Conv3dGroupNormMean : public Module {
 public:
  explicit Conv3dGroupNormMean(Conv3dGroupNormMeanOptions options, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  const Conv3dGroupNormMeanOptions& options() const { return options_; }

  std::shared_ptr<Conv3d> conv;
  std::shared_ptr<GroupNorm> norm;

 private:
  Conv3dGroupNormMeanOptions options_;
};

}  // namespace tg::nn
