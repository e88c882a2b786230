// ZeRO stage 1: the optimizer state sharded over the ranks (PyTorch's
// ZeroRedundancyOptimizer). Each rank owns a share of the parameters and keeps optimizer
// state (Adam's two moments, SGD's momentum) for those alone; step() updates the owned
// parameters from their (already averaged) gradients, then every parameter is broadcast from
// its owner, so the replicas stay identical. With Adam this divides the optimizer's memory,
// twice the model's size, by the number of ranks.
//
//   tg::dist::DistributedDataParallel ddp(pg, model);          // averages the gradients
//   tg::dist::ZeroRedundancyOptimizer opt(pg, ddp.parameters(), [](std::vector<tg::Tensor> shard) {
//     return std::make_unique<tg::nn::Adam>(std::move(shard), tg::nn::AdamOptions{.lr = 1e-3});
//   });
//   ... tape.backward(loss); opt.step(); opt.zero_grad();
//
// Ownership: parameters in decreasing size, each to the rank that owns the fewest elements
// so far (the lowest such rank on ties): the same on every rank, since construction checks
// that the ranks pass the same parameter list. A rank may own nothing (more ranks than
// parameters). The local optimizer sees only the owned parameters, so its updates are
// exactly those of an unsharded optimizer for them: training gives the same bits.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "../nn/optim/optimizer.h"
#include "process_group.h"

namespace tg::dist {

class ZeroRedundancyOptimizer {
 public:
  using MakeOptimizer = std::function<std::unique_ptr<nn::Optimizer>(std::vector<Tensor> owned)>;
  ZeroRedundancyOptimizer(ProcessGroup& group, std::vector<Tensor> params, MakeOptimizer make);

  // Updates the owned parameters, then broadcasts every parameter from its owner.
  void step();
  void zero_grad();  // every parameter's grad, owned or not

  const std::vector<Tensor>& params() const { return params_; }
  int owner(size_t param_index) const { return owner_[param_index]; }
  // The optimizer over this rank's parameters; null when it owns none.
  nn::Optimizer* local() { return local_.get(); }

 private:
  ProcessGroup& group_;
  std::vector<Tensor> params_;
  std::vector<int> owner_;
  std::unique_ptr<nn::Optimizer> local_;
};

}  // namespace tg::dist
