// Host side of one engine launch: picks the kernel (sm90 wgmma, or the sm80 tile
// configuration and precision instantiation) for a plan made by engine.cu. Included by the per-role .cu files only.
#pragma once
#include <type_traits>

#include "../../../core/cuda_context.h"
#include "kernels.h"
#include "mainloop_sm80.cuh"
#include "mainloop_sm90.cuh"

namespace tg::cuda::engine {

template <class Cfg, class OpA, class OpB, bool kSplitTf32>
void launch_config(const OpA& a, const OpB& b, const Plan& plan, const MainloopArgs& args, cudaStream_t stream) {
  const auto kernel = igemm_sm80_kernel<Cfg, OpA, OpB, kSplitTf32>;
  constexpr int kBytes = smem_bytes<Cfg, OpA, OpB>();
  allow_dynamic_smem(kernel, kBytes);
  const dim3 grid(static_cast<unsigned>(int64_t(plan.tiles_m) * plan.tiles_n), static_cast<unsigned>(plan.splits));
  kernel<<<grid, Cfg::kThreads, kBytes, stream>>>(a, b, args);
  TG_LAUNCH_CHECK();
}

template <class OpA, class OpB, bool kSplitTf32>
void launch_sm90(const OpA& a, const OpB& b, const Plan& plan, const MainloopArgs& args, cudaStream_t stream) {
  using P = Sm90Pipeline<kSplitTf32>;
  const auto kernel = igemm_sm90_kernel<OpA, OpB, kSplitTf32>;
  allow_dynamic_smem(kernel, P::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(int64_t(plan.tiles_m) * plan.tiles_n), static_cast<unsigned>(plan.splits));
  kernel<<<grid, P::kThreads, P::kSmemBytes, stream>>>(a, b, args);
  TG_LAUNCH_CHECK();
}

template <class Op>
struct is_matrix : std::false_type {};
template <bool kK>
struct is_matrix<MatrixOperand<kK>> : std::true_type {};

template <class OpA, class OpB>
void launch(OpA a, OpB b, const Plan& plan, const MainloopArgs& args, bool split_tf32, cudaStream_t stream) {
  a.k4 = a.groups_of_four();
  b.k4 = b.groups_of_four();
  if (plan.sm90) {
    if (split_tf32) launch_sm90<OpA, OpB, true>(a, b, plan, args, stream);
    else launch_sm90<OpA, OpB, false>(a, b, plan, args, stream);
    return;
  }
  if (plan.shape == TileShape::Big) {
    using Big = std::conditional_t<is_matrix<OpA>::value && is_matrix<OpB>::value, BigTile, BigTileDeep>;
    if (split_tf32) launch_config<Big, OpA, OpB, true>(a, b, plan, args, stream);
    else launch_config<Big, OpA, OpB, false>(a, b, plan, args, stream);
  } else if (plan.shape == TileShape::Small) {
    if (split_tf32) launch_config<SmallTile, OpA, OpB, true>(a, b, plan, args, stream);
    else launch_config<SmallTile, OpA, OpB, false>(a, b, plan, args, stream);
  } else {
    // The narrow tile's B loader needs B's k contiguous; make_plan only picks it then.
    if constexpr (OpB::kContiguousK) {
      if (split_tf32) launch_config<NarrowTile, OpA, OpB, true>(a, b, plan, args, stream);
      else launch_config<NarrowTile, OpA, OpB, false>(a, b, plan, args, stream);
    } else {
      TG_CHECK(false, "implicit-GEMM engine: the narrow tile needs a k-contiguous B operand");
    }
  }
}

}  // namespace tg::cuda::engine
