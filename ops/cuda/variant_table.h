// The ordered variant tables of the CUDA dispatchers (conv_variants.h, gemm_variants.h): a row
// type for any problem description, and the one rule by which a table picks its row under the
// KernelPolicy (policy.h), so that every family forces, skips and falls back alike.
#pragma once
#include <span>
#include <string_view>

#include "../../core/error.h"
#include "policy.h"

namespace tg::cuda {

template <class Problem, class Operands>
struct KernelVariant {
  std::string_view name;  // what KernelPolicy's *_variant fields name it by
  std::string_view gpus;  // the GPUs it runs on
  bool specialised;       // a fast path for a shape class (KernelPath::Engine skips these)
  // Whether it computes the problem correctly (within its precision) on this GPU.
  bool (*can_implement)(const Problem&, const Operands&);
  // Whether the default order takes it here: it can implement the problem and was measured
  // faster than the rows below it (each dispatcher's .cu has the measurements).
  bool (*preferred)(const Problem&, const Operands&);
  void (*run)(const Problem&, const Operands&);
};

// The row to run: the row named `forced` when not empty (an UnsupportedError naming `op` and
// describe() when it cannot implement the problem, or when no row has that name); the last row
// under KernelPath::Direct; else the first row that prefers the problem, skipping specialised
// rows under KernelPath::Engine, and the last row when none does. `family` names the table in
// errors ("convolution"); describe() (the problem in words) runs only for an error.
template <class Problem, class Operands, class Describe>
const KernelVariant<Problem, Operands>& choose_variant(std::span<const KernelVariant<Problem, Operands>> rows,
                                                       std::string_view forced, KernelPath path,
                                                       const Problem& problem, const Operands& operands,
                                                       std::string_view op, std::string_view family,
                                                       Describe&& describe) {
  if (!forced.empty()) {
    for (const KernelVariant<Problem, Operands>& v : rows) {
      if (v.name != forced) continue;
      TG_CHECK_AS(UnsupportedError, v.can_implement(problem, operands), op, ": the policy forces the '", v.name,
                  "' kernels, which cannot implement this problem (", describe(), ")");
      return v;
    }
    TG_FAIL_AS(UnsupportedError, op, ": no ", family, " kernels named '", forced, "'");
  }
  if (path == KernelPath::Direct) return rows.back();
  for (const KernelVariant<Problem, Operands>& v : rows) {
    if (path == KernelPath::Engine && v.specialised) continue;
    if (v.preferred(problem, operands)) return v;
  }
  return rows.back();
}

}  // namespace tg::cuda
