// The pooling options (max pooling's dilation, ceil_mode, average pooling's
// count_include_pad) on the CUDA kernels against the CPU reference: the kernels called
// directly into NaN-poisoned outputs (indices poisoned with -1) in f32 and f64, indices
// identical to the CPU's (ties included), and every case forward and backward through the
// tape in f32 against f64 CPU.
#include <string>

#include "common/cuda_compare.h"
#include "common/pool_kernels_check.h"
#include "ops/cpu/shape_pool_kernels.h"
#include "ops/cuda/shape_pool_kernels.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

struct OptCase {
  Shape shape;
  PoolKind kind;
  PoolParams params;
};

std::vector<OptCase> cases() {
  std::vector<OptCase> out = {
      {{2, 3, 7, 9}, PoolKind::max, {.kernel_size = {3}, .stride = {2}, .padding = {1}, .dilation = {2}}},
      {{2, 3, 7, 9}, PoolKind::max,
       {.kernel_size = {3}, .stride = {2}, .padding = {2}, .dilation = {2}, .ceil_mode = true}},
      {{1, 2, 9, 13}, PoolKind::max,
       {.kernel_size = {3, 2}, .stride = {2, 3}, .padding = {2, 1}, .dilation = {2, 3}, .ceil_mode = true}},
      {{2, 1, 5, 11}, PoolKind::max, {.kernel_size = {2}, .stride = {3}, .padding = {1}, .ceil_mode = true}},
      {{1, 2, 5, 7, 6}, PoolKind::max,
       {.kernel_size = {2}, .stride = {2}, .padding = {1}, .dilation = {2}, .ceil_mode = true}},
      {{2, 1, 7, 5, 9}, PoolKind::max,
       {.kernel_size = {2, 3, 2}, .stride = {3, 1, 2}, .padding = {1, 1, 0}, .dilation = {1, 2, 3}}},
      // More outputs than the grid has threads, dilated.
      {{4, 16, 130, 257}, PoolKind::max, {.kernel_size = {3}, .stride = {1}, .padding = {2}, .dilation = {2}}},
  };
  const std::vector<std::pair<Shape, PoolParams>> avg = {
      {{2, 3, 7, 9}, {.kernel_size = {3}, .stride = {2}, .padding = {1}}},
      {{1, 2, 9, 13}, {.kernel_size = {3, 2}, .stride = {2, 3}, .padding = {1, 1}}},
      {{2, 1, 5, 11}, {.kernel_size = {2}, .stride = {3}, .padding = {1}}},
      {{1, 1, 6, 6}, {.kernel_size = {3}, .stride = {3}, .padding = {1}}},
      {{1, 2, 5, 7, 6}, {.kernel_size = {3}, .stride = {2}, .padding = {1}}},
      {{2, 1, 7, 5, 9}, {.kernel_size = {2, 3, 4}, .stride = {3, 1, 3}, .padding = {1, 1, 2}}},
      {{4, 16, 130, 257}, {.kernel_size = {3}, .stride = {2}, .padding = {1}}},
  };
  for (auto [shape, params] : avg)
    for (bool ceil_mode : {false, true})
      for (bool include : {true, false}) {
        params.ceil_mode = ceil_mode;
        params.count_include_pad = include;
        out.push_back({shape, PoolKind::avg, params});
      }
  return out;
}

std::string describe_case(const OptCase& c) {
  const PoolParams& p = c.params;
  return c.shape.str() + (c.kind == PoolKind::max ? " max" : " avg") + " k " + Shape(p.kernel_size).str() + " s " +
         Shape(p.stride).str() + " p " + Shape(p.padding).str() + " d " + Shape(p.dilation).str() +
         (p.ceil_mode ? " ceil" : "") + (p.count_include_pad ? "" : " exclude_pad");
}

Tensor run_pool(const Tensor& x, const OptCase& c) {
  const bool is3d = c.shape.rank() == 5;
  if (c.kind == PoolKind::max) return is3d ? max_pool3d(x, c.params) : max_pool2d(x, c.params);
  return is3d ? avg_pool3d(x, c.params) : avg_pool2d(x, c.params);
}

}  // namespace

TEST(CudaPoolOptions, KernelsWriteEveryOutputAndIndicesMatchTheCpu) {
  TG_REQUIRE_GPU();
  manual_seed(211);
  for (DType dt : {f32, f64}) {
    const double tol = dt == f32 ? 1e-7 : 1e-15;
    for (const OptCase& c : cases()) {
      // Inputs of few distinct values: many ties, which the indices must break alike.
      for (bool ties : {false, true}) {
        SCOPED_TRACE(describe_case(c) + (ties ? " ties " : " ") + dtype_name(dt));
        Tensor x = random(c.shape, dt, kGpu);
        if (ties) x = (x * 2.0 + 2.0).to(DType::i64).to(dt);
        const int sp = static_cast<int>(c.shape.rank()) - 2;
        const PoolProblem p = make_pool_problem("test", c.kind, sp, x, c.params);
        expect_pool_kernels_match_cpu(x, p, dt, tol);
      }
    }
  }
}

TEST(CudaPoolOptions, EveryCaseMatchesF64CpuThroughTheTape) {
  TG_REQUIRE_GPU();
  manual_seed(212);
  for (const OptCase& c : cases()) {
    SCOPED_TRACE(describe_case(c));
    Tensor x = random(c.shape, f32, kGpu).requires_grad_();
    Shape out_shape;
    {
      NoGradGuard guard;
      out_shape = run_pool(x, c).shape();
    }
    // Max picks the same element from the same values in f32 and f64; its gradient is
    // rounded to f32 where windows overlap.
    expect_matches_f64_cpu([&](const std::vector<Tensor>& in) { return run_pool(in[0], c); }, {x},
                           random(out_shape, f32, kGpu), 1e-6);
  }
}
