// Data-parallel training: every rank holds a replica of the model, runs forward and backward
// on its own slice of the batch, and the gradients are averaged over the ranks while
// backward is still running, so that each optimizer step sees the gradient of the whole
// batch and the replicas stay identical.
//
//   tg::dist::ProcessGroup pg;
//   auto model = std::make_shared<Net>();
//   model->to(pg.device());
//   tg::dist::DistributedDataParallel ddp(pg, model);   // rank 0's parameters everywhere
//   tg::nn::SGD opt(ddp.parameters(), {.lr = 0.1});
//   for (...) {
//     tg::Tape tape;
//     tg::Tensor loss = tg::cross_entropy(ddp(x_shard), y_shard);
//     tape.backward(loss);   // gradients averaged over the ranks when it returns
//     opt.step();
//     ddp.zero_grad();
//   }
//
// Buckets. The parameters are grouped, in reverse registration order (roughly the order
// backward produces their gradients), into buckets of about bucket_cap_mb; a parameter
// larger than that gets a bucket of its own. A gradient-ready hook on every parameter
// (autograd/grad_hooks.h) copies the gradient into its bucket; when a bucket is complete it
// is all-reduced (average) at once, while backward computes the rest. Buckets start in a
// fixed order (bucket k after bucket k-1, on every rank), so collectives match across ranks
// and results are deterministic. At the end of backward the buckets not yet started (those
// holding parameters that got no gradient) start, everything is waited for, and the
// averages are copied back into the gradients: on the GPU the framework's stream waits for
// NCCL, so the optimizer step that follows is ordered after it without the host blocking.
//
// Unused parameters. A parameter that gets no gradient in a backward contributes zeros.
// With find_unused_parameters, one extra small all-reduce per step counts, per parameter,
// the ranks that produced a gradient: a parameter no rank used keeps an undefined grad (so
// optimizers skip it, as PyTorch), one that some rank used gets the average over all ranks.
// Without it, every parameter in a bucket gets the averaged grad (zeros where unused).
//
// Gradient accumulation: inside a no_sync() scope backward only accumulates locally; the
// first synchronised backward after it averages the accumulated gradients.
//
// Construction is collective: every rank checks that its parameter list (names, shapes,
// dtypes) matches rank 0's, and all ranks throw DistError naming the first mismatch if not;
// then rank 0's parameters and buffers are broadcast. With broadcast_buffers, buffers are
// broadcast from rank 0 again at every forward (PyTorch's default).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "../nn/module.h"
#include "process_group.h"

namespace tg::dist {

struct DDPOptions {
  double bucket_cap_mb = 25;
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;
};

class DistributedDataParallel : public nn::Module {
 public:
  DistributedDataParallel(ProcessGroup& group, std::shared_ptr<nn::Module> module, DDPOptions options = {});
  ~DistributedDataParallel() override;

  Tensor forward(const Tensor& x) override;
  nn::Module& module() { return *module_; }

  // Within the returned scope, backward accumulates gradients locally without communicating.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // The buckets in the order they are reduced, as lists of the wrapped module's parameter
  // names ("0.weight", without DDP's "module." prefix).
  std::vector<std::vector<std::string>> bucket_layout() const;

  struct State;

 private:
  ProcessGroup& group_;
  std::shared_ptr<nn::Module> module_;
  std::unique_ptr<State> state_;
};

// Writes a checkpoint from rank 0 only (nn/checkpoint.h's save, atomic: a reader never sees
// a half-written file); the other ranks wait at a barrier until it is written.
void save_checkpoint(ProcessGroup& group, const nn::Module& module, const std::string& path);

}  // namespace tg::dist
