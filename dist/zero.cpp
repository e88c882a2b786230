#include "dist/zero.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "autograd/tape.h"
#include "dist/process_group_impl.h"

namespace tg::dist {

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(ProcessGroup& group, std::vector<Tensor> params,
                                                 MakeOptimizer make)
    : group_(group), params_(std::move(params)) {
  TG_CHECK(static_cast<bool>(make), "ZeroRedundancyOptimizer: empty optimizer factory");
  // The same list on every rank, or the owners would disagree.
  std::ostringstream list;
  for (const Tensor& p : params_) {
    TG_CHECK(p.defined(), "ZeroRedundancyOptimizer: undefined parameter");
    list << dtype_name(p.dtype()) << p.shape() << ";";
  }
  const std::string mine = list.str();
  const bool same = group.broadcast_string(mine, 0) == mine;
  if (!group.all_true(same))
    throw DistError("ZeroRedundancyOptimizer: the ranks pass different parameter lists (" +
                    std::to_string(params_.size()) + " parameters on rank " + std::to_string(group.rank()) +
                    "); every rank must pass the same parameters in the same order");

  std::vector<size_t> by_size(params_.size());
  std::iota(by_size.begin(), by_size.end(), size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return params_[a].numel() > params_[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(group.size()), 0);
  owner_.assign(params_.size(), 0);
  for (size_t i : by_size) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[i] = r;
    load[static_cast<size_t>(r)] += params_[i].numel();
  }
  std::vector<Tensor> owned;
  for (size_t i = 0; i < params_.size(); ++i)
    if (owner_[i] == group.rank()) owned.push_back(params_[i]);
  if (!owned.empty()) local_ = make(std::move(owned));
}

void ZeroRedundancyOptimizer::step() {
  if (local_) local_->step();
  NoGradGuard no_grad;
  group_.impl().check_usable("ZeroRedundancyOptimizer::step");
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i];
    group_.impl().start_broadcast(p, owner_[i])->wait();
  }
}

void ZeroRedundancyOptimizer::zero_grad() {
  for (const Tensor& p : params_) p.zero_grad();
}

}  // namespace tg::dist
