// conv3d_group_norm_mean on the GPU against the CPU reference (f64, from the same f32
// values): each launcher called directly on NaN-poisoned outputs at odd shapes that break
// the tiles, for every kernel family (tensor-core, FFMA fused, materialized) and both
// precisions, the public op's forward and every gradient with and without x requiring grad,
// determinism, and the shape classes; the persistent tensor-core forward at tile counts above
// and below the resident grid, and both tensor-core kernels with edge tiles reusing a buffer.
// gamma is random and non-uniform throughout: with uniform gamma the output does not depend
// on the conv at all.
#include <cmath>
#include <vector>

#include "common/cuda_compare.h"
#include "common/test_util.h"
#include "nn/fused.h"
#include "ops/cuda/fused.h"
#include "ops/fused.h"

using namespace tg;
using namespace tg::test;
using Kernels = cuda::Conv3dGnMeanKernels;

namespace {

const Device kGpu = Device::cuda(0);

struct Case {
  int64_t N, C, D, H, W, K, groups, k = 3;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "N=" << c.N << " C=" << c.C << " DHW=" << c.D << "x" << c.H << "x" << c.W << " K=" << c.K
            << " groups=" << c.groups << " k=" << c.k;
}

struct Inputs {
  Tensor x, w, b, gamma, beta;  // f32 on the CPU
};

Inputs make_inputs(const Case& c) {
  Inputs in;
  in.x = random({c.N, c.C, c.D, c.H, c.W}, f32);
  in.w = random({c.K, c.C, c.k, c.k, c.k}, f32) * (1.0 / std::sqrt(double(c.C * c.k * c.k * c.k)));
  in.b = random({c.K}, f32);
  in.gamma = uniform({c.K}, 0.5, 1.5, {.dtype = f32});
  in.beta = random({c.K}, f32);
  return in;
}

Tensor gpu(const Tensor& t) { return t.defined() ? t.to(kGpu) : Tensor(); }
Tensor f64_of(const Tensor& t) { return t.defined() ? t.to(f64) : Tensor(); }

// rel_l2 within tol of the reference; or, where the true value is zero, an absolute bound.
// With one channel per group (groups = K) every channel's normalized mean is 0, so out =
// mean(beta) and A, B, db, dw, dx vanish: both sides hold rounding noise.
void expect_matches(const Tensor& got, const Tensor& ref, bool zero_expected, const char* name, double tol = 1e-5) {
  if (!zero_expected) {
    EXPECT_LE(rel_l2(got, ref), tol) << name;
    return;
  }
  for (double v : got.to_vector<double>()) {
    ASSERT_TRUE(std::isfinite(v)) << name << " holds an unwritten element";
    EXPECT_LE(std::abs(v), 1e-6) << name;
  }
}

Conv3dGnMeanProblem problem_of(const Inputs& in, int64_t groups) {
  return make_conv3d_gn_mean_problem("test", in.x, in.w, in.b, groups, 1e-5);
}

const char* name_of(Kernels k) {
  return k == Kernels::ffma ? "ffma" : k == Kernels::tensor_core ? "tensor_core" : "automatic";
}

// Every launcher on poisoned outputs, against the CPU reference run in f64 on the same values,
// with the kernel family `kernels`; tol bounds the conv-derived results (1e-5: FP32-accurate).
void check_launchers(const Case& c, Kernels kernels, double tol = 1e-5, bool with_bias = true) {
  SCOPED_TRACE(::testing::Message() << c << " bias=" << with_bias << " kernels=" << name_of(kernels)
                                    << " tol=" << tol);
  Inputs in = make_inputs(c);
  if (!with_bias) in.b = Tensor();
  const Conv3dGnMeanProblem p = problem_of(in, c.groups);
  const int64_t N = c.N, K = c.K, G = c.groups;
  const TensorOptions d64{.dtype = f64};

  // CPU reference in f64.
  Tensor rS1 = Tensor::empty({N, K}, d64), rS2 = Tensor::empty({N, K}, d64);
  cpu::conv3d_gn_mean_stats(rS1, rS2, f64_of(in.x), f64_of(in.w), f64_of(in.b), p);
  Tensor rout = Tensor::empty({N}, d64), rmean = Tensor::empty({N, G}, d64), rrstd = Tensor::empty({N, G}, d64);
  cpu::conv3d_gn_mean_finish(rout, rmean, rrstd, rS1, rS2, f64_of(in.gamma), f64_of(in.beta), p);
  Tensor gout = random({N}, f32);
  Tensor rA = Tensor::empty({N, K}, d64), rB = Tensor::empty({N, G}, d64);
  Tensor rdg = Tensor::empty({K}, d64), rdbt = Tensor::empty({K}, d64), rdb = Tensor::empty({K}, d64);
  cpu::conv3d_gn_mean_coefficients(rA, rB, rdg, rdbt, rdb, f64_of(gout), rS1, rmean, rrstd, f64_of(in.gamma), p);
  Tensor rdw = Tensor::empty(in.w.shape(), d64), rdx = Tensor::empty(in.x.shape(), d64);
  cpu::conv3d_gn_mean_grad_conv(rdw, rdx, f64_of(in.x), f64_of(in.w), f64_of(in.b), rA, rB, p);

  // GPU, stage by stage, each stage fed the GPU's own previous results.
  Tensor x = gpu(in.x), w = gpu(in.w), b = gpu(in.b), gamma = gpu(in.gamma), beta = gpu(in.beta);
  Tensor S1 = poisoned_gpu({N, K}, f64), S2 = poisoned_gpu({N, K}, f64);
  cuda::conv3d_gn_mean_stats(S1, S2, x, w, b, p, kernels);
  EXPECT_LE(rel_l2(S1, rS1), tol) << "S1";
  EXPECT_LE(rel_l2(S2, rS2), tol) << "S2";
  Tensor out = poisoned_gpu({N}), mean = poisoned_gpu({N, G}, f64), rstd = poisoned_gpu({N, G}, f64);
  cuda::conv3d_gn_mean_finish(out, mean, rstd, S1, S2, gamma, beta, p);
  // The finish stage is f64 arithmetic on S1, S2: fed the GPU's own sums it must agree to
  // FP32 rounding whatever the precision. End to end, group normalization's cancellation
  // (mu_c - mu_g, E[y^2] - mu^2) amplifies the error of the sums, so `out` is held to the
  // product tolerance against the exact reference only at FP32 accuracy; in TF32 the sums
  // themselves are what TF32's 1e-3 bounds (checked above).
  Tensor fout = Tensor::empty({N}, d64), fmean = Tensor::empty({N, G}, d64), frstd = Tensor::empty({N, G}, d64);
  cpu::conv3d_gn_mean_finish(fout, fmean, frstd, S1.cpu(), S2.cpu(), f64_of(in.gamma), f64_of(in.beta), p);
  EXPECT_LE(rel_l2(out, fout), 1e-5) << "out, finished from the GPU's own sums";
  if (tol <= 1e-5) {
    EXPECT_LE(rel_l2(out, rout), tol) << "out";
  }
  EXPECT_LE(rel_l2(mean, rmean), tol) << "mean";
  EXPECT_LE(rel_l2(rstd, rrstd), tol) << "rstd";
  Tensor A = poisoned_gpu({N, K}), B = poisoned_gpu({N, G});
  Tensor dg = poisoned_gpu({K}), dbt = poisoned_gpu({K}), db = poisoned_gpu({K});
  cuda::conv3d_gn_mean_coefficients(A, B, dg, dbt, db, gpu(gout), S1, mean, rstd, gamma, p);
  const bool degenerate = c.groups == c.K;
  expect_matches(A, rA, degenerate, "A", tol);
  expect_matches(B, rB, degenerate, "B", tol);
  expect_matches(dg, rdg, degenerate, "dgamma", tol);
  EXPECT_LE(rel_l2(dbt, rdbt), 1e-5) << "dbeta";
  expect_matches(db, rdb, degenerate, "db", tol);
  // Conv gradients: both, then each alone (x not requiring grad is the training case).
  // Tensor cores compute dw only; dx then comes from the FFMA (or materialized) kernels.
  Tensor dw = poisoned_gpu(in.w.shape()), dx = poisoned_gpu(in.x.shape());
  cuda::conv3d_gn_mean_grad_conv(dw, dx, x, w, b, A, B, p, kernels);
  expect_matches(dw, rdw, degenerate, "dw", tol);
  expect_matches(dx, rdx, degenerate, "dx", tol);
  Tensor dw_only = poisoned_gpu(in.w.shape());
  cuda::conv3d_gn_mean_grad_conv(dw_only, Tensor(), x, w, b, A, B, p, kernels);
  if (kernels == Kernels::automatic) {
    expect_matches(dw_only, rdw, degenerate, "dw alone", tol);  // may be another family than dw with dx
  } else {
    EXPECT_EQ(dw_only.to_vector<float>(), dw.to_vector<float>()) << "dw alone differs from dw with dx";
  }
  Tensor dx_only = poisoned_gpu(in.x.shape());
  cuda::conv3d_gn_mean_grad_conv(Tensor(), dx_only, x, w, b, A, B, p, kernels);
  EXPECT_EQ(dx_only.to_vector<float>(), dx.to_vector<float>()) << "dx alone differs from dx with dw";

  // Determinism: the same bits on a second run.
  Tensor S1b = poisoned_gpu({N, K}, f64), S2b = poisoned_gpu({N, K}, f64);
  cuda::conv3d_gn_mean_stats(S1b, S2b, x, w, b, p, kernels);
  EXPECT_EQ(S1b.to_vector<double>(), S1.to_vector<double>()) << "S1 not deterministic";
  EXPECT_EQ(S2b.to_vector<double>(), S2.to_vector<double>()) << "S2 not deterministic";
  Tensor dw2 = poisoned_gpu(in.w.shape()), dx2 = poisoned_gpu(in.x.shape());
  cuda::conv3d_gn_mean_grad_conv(dw2, dx2, x, w, b, A, B, p, kernels);
  EXPECT_EQ(dw2.to_vector<float>(), dw.to_vector<float>()) << "dw not deterministic";
  EXPECT_EQ(dx2.to_vector<float>(), dx.to_vector<float>()) << "dx not deterministic";
}

// The public op through the tape on the GPU against the same on the CPU in f64.
void check_op(const Case& c, bool x_grad, double tol = 1e-5) {
  SCOPED_TRACE(::testing::Message() << c << " x_grad=" << x_grad << " tol=" << tol);
  Inputs in = make_inputs(c);
  Tensor seed = random({c.N}, f32);
  std::vector<Tensor> cpu_leaves, gpu_leaves;
  for (const Tensor& t : {in.x, in.w, in.b, in.gamma, in.beta}) {
    cpu_leaves.push_back(t.to(f64));
    gpu_leaves.push_back(t.to(kGpu));
  }
  for (size_t i = 0; i < 5; ++i) {
    const bool want = i > 0 || x_grad;
    cpu_leaves[i].requires_grad_(want);
    gpu_leaves[i].requires_grad_(want);
  }
  auto run = [&](std::vector<Tensor>& v, const Tensor& s) {
    Tape tape;
    Tensor out = conv3d_group_norm_mean(v[0], v[1], v[2], v[3], v[4], c.groups);
    EXPECT_EQ(tape.entries().size(), 1u);
    tape.backward(out, s);
    return out;
  };
  Tensor ref = run(cpu_leaves, seed.to(f64));
  Tensor out = run(gpu_leaves, seed.to(kGpu));
  EXPECT_LE(rel_l2(out, ref), tol) << "output";
  const char* names[] = {"x", "w", "b", "gamma", "beta"};
  for (size_t i = 0; i < 5; ++i) {
    if (i == 0 && !x_grad) {
      EXPECT_FALSE(gpu_leaves[0].grad().defined());
      continue;
    }
    ASSERT_TRUE(gpu_leaves[i].grad().defined()) << names[i];
    expect_matches(gpu_leaves[i].grad(), cpu_leaves[i].grad(), c.groups == c.K && i < 4, names[i], tol);
  }
}

// Odd shapes that break the tiles: depths not a multiple of 4 (tail of 1, 2, 3 outputs),
// rows and columns that do not divide, C_in 1..4, K on both channel-chunk paths, groups 1
// and K, a row of one output, a wide W' split into several column tiles.
const std::vector<Case> kFusedCases = {
    {.N = 3, .C = 3, .D = 9, .H = 13, .W = 7, .K = 24, .groups = 8},   // workload C's channels
    {.N = 2, .C = 1, .D = 5, .H = 7, .W = 9, .K = 24, .groups = 1},
    {.N = 2, .C = 2, .D = 8, .H = 11, .W = 13, .K = 16, .groups = 16}, // K % 24 != 0; groups = K
    {.N = 1, .C = 4, .D = 7, .H = 9, .W = 13, .K = 8, .groups = 2},
    {.N = 2, .C = 3, .D = 6, .H = 3, .W = 70, .K = 24, .groups = 4},   // W' = 68: three column tiles
    {.N = 2, .C = 1, .D = 3, .H = 40, .W = 32, .K = 56, .groups = 7},  // seven chunks: one-row tiles
    {.N = 2, .C = 3, .D = 3, .H = 3, .W = 3, .K = 24, .groups = 1},    // a single output position
    {.N = 2, .C = 12, .D = 6, .H = 9, .W = 11, .K = 8, .groups = 2},   // C_in 12: several phase-C passes
};

// The tensor-core kernels' class (C_in 1 or 3, K 24) at shapes that break their tiles: W' of
// 5 (the second m16 tile of a row masked), 68 (three column tiles, the last 4 wide), 35 and
// exactly 32; odd row and depth counts (last row pair half valid); a single output; C_in 1;
// groups 1, 2 channels per group, 8; workload C's per-sample shape.
const std::vector<Case> kTensorCoreCases = {
    {.N = 3, .C = 3, .D = 9, .H = 13, .W = 7, .K = 24, .groups = 8},
    {.N = 2, .C = 3, .D = 6, .H = 5, .W = 70, .K = 24, .groups = 4},
    {.N = 2, .C = 3, .D = 3, .H = 3, .W = 3, .K = 24, .groups = 1},
    {.N = 1, .C = 3, .D = 7, .H = 9, .W = 37, .K = 24, .groups = 3},
    {.N = 2, .C = 3, .D = 5, .H = 18, .W = 34, .K = 24, .groups = 12},
    {.N = 2, .C = 1, .D = 5, .H = 7, .W = 9, .K = 24, .groups = 1},
    {.N = 2, .C = 3, .D = 24, .H = 32, .W = 32, .K = 24, .groups = 8},
};

// The forward statistics alone against the CPU in f64, and the same bits on a second run: for
// the persistent, prefetching tensor-core stats kernel at tile counts above and below the
// number of resident blocks.
void check_stats(const Case& c, Kernels kernels, double tol) {
  SCOPED_TRACE(::testing::Message() << c << " kernels=" << name_of(kernels) << " tol=" << tol);
  const Inputs in = make_inputs(c);
  const Conv3dGnMeanProblem p = problem_of(in, c.groups);
  const int64_t N = c.N, K = c.K, G = c.groups;
  const TensorOptions d64{.dtype = f64};
  Tensor rS1 = Tensor::empty({N, K}, d64), rS2 = Tensor::empty({N, K}, d64);
  cpu::conv3d_gn_mean_stats(rS1, rS2, f64_of(in.x), f64_of(in.w), f64_of(in.b), p);
  Tensor rout = Tensor::empty({N}, d64), rmean = Tensor::empty({N, G}, d64), rrstd = Tensor::empty({N, G}, d64);
  cpu::conv3d_gn_mean_finish(rout, rmean, rrstd, rS1, rS2, f64_of(in.gamma), f64_of(in.beta), p);

  const Tensor x = gpu(in.x), w = gpu(in.w), b = gpu(in.b);
  Tensor S1 = poisoned_gpu({N, K}, f64), S2 = poisoned_gpu({N, K}, f64);
  cuda::conv3d_gn_mean_stats(S1, S2, x, w, b, p, kernels);
  EXPECT_LE(rel_l2(S1, rS1), tol) << "S1";
  EXPECT_LE(rel_l2(S2, rS2), tol) << "S2";
  Tensor out = poisoned_gpu({N}), mean = poisoned_gpu({N, G}, f64), rstd = poisoned_gpu({N, G}, f64);
  cuda::conv3d_gn_mean_finish(out, mean, rstd, S1, S2, gpu(in.gamma), gpu(in.beta), p);
  EXPECT_LE(rel_l2(mean, rmean), tol) << "mean";
  EXPECT_LE(rel_l2(rstd, rrstd), tol) << "rstd";
  if (tol <= 1e-5) {
    EXPECT_LE(rel_l2(out, rout), tol) << "out";
  }

  Tensor S1b = poisoned_gpu({N, K}, f64), S2b = poisoned_gpu({N, K}, f64);
  cuda::conv3d_gn_mean_stats(S1b, S2b, x, w, b, p, kernels);
  EXPECT_EQ(S1b.to_vector<double>(), S1.to_vector<double>()) << "S1 not deterministic";
  EXPECT_EQ(S2b.to_vector<double>(), S2.to_vector<double>()) << "S2 not deterministic";
}

// Tile counts against the persistent grid (workload C's sample is 33 tiles of 2 x 10 x 32
// outputs, 5 warps; three blocks per SM, so 396 resident blocks on 132 SMs): N = 13 -> 429
// tiles, 2 per block on 215 blocks, the last block with one (the count is not a multiple of
// the grid); N = 30 -> 990 tiles, 3 per block; N = 1 -> 33 tiles, fewer than the SMs. Then a
// C_in 1 sample with a partial third column tile, and a single output.
// Many tiles per block (1680 tiles: ~4 per forward block, ~6 per backward block) with tiles
// at the row and column edges after interior ones in the same x buffer: the staging copies
// only what lies inside the input and leaves the rest of the buffer as the previous tile left
// it (read only by outputs that are skipped or masked); W 37 also takes the two-column tail
// copy (32 + lane < W) in the first column tile and not in the second.
const Case kStaleBufferCase{.N = 120, .C = 3, .D = 9, .H = 13, .W = 37, .K = 24, .groups = 8};

const std::vector<Case> kPersistentCases = {
    {.N = 13, .C = 3, .D = 24, .H = 32, .W = 32, .K = 24, .groups = 8},
    {.N = 30, .C = 3, .D = 24, .H = 32, .W = 32, .K = 24, .groups = 8},
    {.N = 1, .C = 3, .D = 24, .H = 32, .W = 32, .K = 24, .groups = 8},
    {.N = 1, .C = 1, .D = 9, .H = 40, .W = 75, .K = 24, .groups = 6},
    {.N = 1, .C = 3, .D = 3, .H = 3, .W = 3, .K = 24, .groups = 2},
    kStaleBufferCase,
};

}  // namespace

TEST(CudaConv3dGroupNormMean, FusedShapeClass) {
  TG_REQUIRE_GPU();
  auto p_of = [](const Case& c) {
    Inputs in = make_inputs(c);
    return problem_of(in, c.groups);
  };
  for (const Case& c : kFusedCases) EXPECT_TRUE(cuda::conv3d_gn_mean_applies(p_of(c), f32)) << c;
  for (const Case& c : kTensorCoreCases) EXPECT_TRUE(cuda::conv3d_gn_mean_mma_applies(p_of(c), f32)) << c;
  const Case wc{.N = 128, .C = 3, .D = 24, .H = 32, .W = 32, .K = 24, .groups = 8};
  EXPECT_TRUE(cuda::conv3d_gn_mean_applies(p_of(wc), f32)) << "workload C";
  EXPECT_TRUE(cuda::conv3d_gn_mean_mma_applies(p_of(wc), f32)) << "workload C";
  EXPECT_FALSE(cuda::conv3d_gn_mean_mma_applies(p_of(wc), f64)) << "f64";
  EXPECT_FALSE(cuda::conv3d_gn_mean_mma_applies(p_of(kFusedCases[2]), f32)) << "K 16: FFMA only";
  EXPECT_FALSE(cuda::conv3d_gn_mean_mma_applies(p_of(kFusedCases[3]), f32)) << "C_in 4: FFMA only";
  EXPECT_FALSE(cuda::conv3d_gn_mean_applies(p_of(wc), f64)) << "f64 is materialized";
  const Case k2{.N = 2, .C = 3, .D = 5, .H = 5, .W = 5, .K = 6, .groups = 2, .k = 2};
  EXPECT_FALSE(cuda::conv3d_gn_mean_applies(p_of(k2), f32)) << "2x2x2 kernel";
  EXPECT_FALSE(cuda::conv3d_gn_mean_mma_applies(p_of(k2), f32)) << "2x2x2 kernel";
  const Case wide{.N = 2, .C = 8, .D = 5, .H = 5, .W = 5, .K = 64, .groups = 8};
  EXPECT_FALSE(cuda::conv3d_gn_mean_applies(p_of(wide), f32)) << "C_in 8 with K 64: too many phase-B owners";
}

TEST(CudaConv3dGroupNormMean, FusedLaunchersMatchCpu) {
  TG_REQUIRE_GPU();
  for (const Case& c : kFusedCases) check_launchers(c, Kernels::ffma);
  check_launchers(kFusedCases[0], Kernels::ffma, 1e-5, /*with_bias=*/false);
}

TEST(CudaConv3dGroupNormMean, TensorCoreLaunchersMatchCpu) {
  TG_REQUIRE_GPU();
  for (const Case& c : kTensorCoreCases) check_launchers(c, Kernels::tensor_core);
  check_launchers(kTensorCoreCases[0], Kernels::tensor_core, 1e-5, /*with_bias=*/false);
}

TEST(CudaConv3dGroupNormMean, TensorCoreLaunchersTf32MatchCpu) {
  TG_REQUIRE_GPU();
  PrecisionGuard tf32(Precision::TF32);  // one TF32 tensor op per product: TF32 tolerance
  for (const Case& c : {kTensorCoreCases[0], kTensorCoreCases[1], kTensorCoreCases[5], kTensorCoreCases[6]})
    check_launchers(c, Kernels::tensor_core, 1e-3);
}

TEST(CudaConv3dGroupNormMean, TensorCoreStatsOnPersistentGridMatchCpu) {
  TG_REQUIRE_GPU();
  for (const Case& c : kPersistentCases) check_stats(c, Kernels::tensor_core, 1e-5);
  PrecisionGuard tf32(Precision::TF32);
  for (const Case& c : kPersistentCases) check_stats(c, Kernels::tensor_core, 1e-3);
}

TEST(CudaConv3dGroupNormMean, TensorCoreStaleTileBuffersMatchCpu) {
  TG_REQUIRE_GPU();
  check_launchers(kStaleBufferCase, Kernels::tensor_core);  // grad_w_mma: consecutive tiles per block
  PrecisionGuard tf32(Precision::TF32);
  check_launchers(kStaleBufferCase, Kernels::tensor_core, 1e-3);
}

TEST(CudaConv3dGroupNormMean, AutomaticLaunchersMatchCpu) {
  TG_REQUIRE_GPU();
  check_launchers(kTensorCoreCases[3], Kernels::automatic);  // tensor cores (dw), FFMA (dw with dx)
  check_launchers(kFusedCases[2], Kernels::automatic);       // FFMA
}

TEST(CudaConv3dGroupNormMean, MaterializedLaunchersMatchCpu) {
  TG_REQUIRE_GPU();
  check_launchers({.N = 2, .C = 2, .D = 6, .H = 7, .W = 5, .K = 6, .groups = 3, .k = 2}, Kernels::automatic);
  check_launchers({.N = 2, .C = 8, .D = 5, .H = 6, .W = 7, .K = 64, .groups = 8}, Kernels::automatic);
}

TEST(CudaConv3dGroupNormMean, ForcedKernelFamilyThatDoesNotApplyFails) {
  TG_REQUIRE_GPU();
  auto run_stats = [](const Case& c, Kernels k) {
    Inputs in = make_inputs(c);
    const Conv3dGnMeanProblem p = problem_of(in, c.groups);
    Tensor S1 = poisoned_gpu({c.N, c.K}, f64), S2 = poisoned_gpu({c.N, c.K}, f64);
    cuda::conv3d_gn_mean_stats(S1, S2, gpu(in.x), gpu(in.w), gpu(in.b), p, k);
  };
  TG_EXPECT_ERROR(run_stats(kFusedCases[2], Kernels::tensor_core), "tensor-core kernels forced", "K 16");
  const Case k2{.N = 2, .C = 2, .D = 6, .H = 7, .W = 5, .K = 6, .groups = 3, .k = 2};
  TG_EXPECT_ERROR(run_stats(k2, Kernels::ffma), "FFMA kernels forced");
}

TEST(CudaConv3dGroupNormMean, OpForwardAndEveryGradientMatchCpu) {
  TG_REQUIRE_GPU();
  for (const Case& c : {kFusedCases[0], kFusedCases[2], kFusedCases[4]}) {
    check_op(c, /*x_grad=*/true);
    check_op(c, /*x_grad=*/false);
  }
  check_op({.N = 2, .C = 2, .D = 6, .H = 7, .W = 5, .K = 6, .groups = 3, .k = 2}, true);  // materialized
}

TEST(CudaConv3dGroupNormMean, WorkloadCShapesAtReducedBatch) {
  TG_REQUIRE_GPU();
  // Workload C's per-sample shape with a batch small enough for the CPU reference.
  const Case c{.N = 6, .C = 3, .D = 24, .H = 32, .W = 32, .K = 24, .groups = 8};
  check_op(c, false);
  check_op(c, true);
}

TEST(CudaConv3dGroupNormMean, Tf32PrecisionWithinTf32Tolerance) {
  TG_REQUIRE_GPU();
  PrecisionGuard tf32(Precision::TF32);
  check_op(kFusedCases[0], false, 1e-3);  // tensor cores, one TF32 op per product
  check_op(kFusedCases[0], true, 1e-3);
  check_op(kFusedCases[2], true);  // K 16: FFMA, FP32-accurate under either setting
}

// The problem carries the precision it was described under: the backward recorded by a TF32
// forward runs the TF32 kernels even when the global setting has changed since. On the
// tensor-core case the two precisions give different dw bits, so the comparison can fail.
TEST(CudaConv3dGroupNormMean, BackwardRunsUnderTheForwardsPrecision) {
  TG_REQUIRE_GPU();
  const Case c = kTensorCoreCases[0];
  Inputs in = make_inputs(c);
  Tensor seed = random({c.N}, f32).to(kGpu);
  // forward_tf32 / backward_tf32: the global precision during each half.
  auto weight_grad = [&](bool forward_tf32, bool backward_tf32) {
    Tensor x = gpu(in.x), w = gpu(in.w).requires_grad_(true), b = gpu(in.b), g = gpu(in.gamma), be = gpu(in.beta);
    Tape tape;
    Tensor out;
    {
      PrecisionGuard guard(forward_tf32 ? Precision::TF32 : Precision::FP32);
      out = conv3d_group_norm_mean(x, w, b, g, be, c.groups);
    }
    PrecisionGuard guard(backward_tf32 ? Precision::TF32 : Precision::FP32);
    tape.backward(out, seed);
    return w.grad().to_vector<float>();
  };
  const std::vector<float> tf32 = weight_grad(true, true), fp32 = weight_grad(false, false);
  ASSERT_NE(tf32, fp32) << "this case does not tell the precisions apart";
  EXPECT_EQ(weight_grad(true, false), tf32) << "a TF32 forward's backward ran under the later FP32 setting";
  EXPECT_EQ(weight_grad(false, true), fp32) << "an FP32 forward's backward ran under the later TF32 setting";
}

TEST(CudaConv3dGroupNormMean, ChangingWeightChangesOutput) {
  TG_REQUIRE_GPU();
  // A kernel that skipped the conv would pass a test with uniform gamma; not this one.
  const Case c = kFusedCases[0];
  Inputs in = make_inputs(c);
  Tensor before = conv3d_group_norm_mean(gpu(in.x), gpu(in.w), gpu(in.b), gpu(in.gamma), gpu(in.beta), c.groups);
  Tensor w2 = in.w + random(in.w.shape(), f32) * 0.2;
  Tensor after = conv3d_group_norm_mean(gpu(in.x), gpu(w2), gpu(in.b), gpu(in.gamma), gpu(in.beta), c.groups);
  auto vb = before.to_vector<float>(), va = after.to_vector<float>();
  for (int64_t n = 0; n < c.N; ++n) EXPECT_GT(std::abs(vb[n] - va[n]), 1e-4) << "sample " << n;
  Tensor ref = conv3d_group_norm_mean(in.x, w2, in.b, in.gamma, in.beta, c.groups);
  EXPECT_LE(rel_l2(after, ref), 1e-5);
}

TEST(CudaConv3dGroupNormMean, ModuleOnGpu) {
  TG_REQUIRE_GPU();
  manual_seed(3);
  nn::Conv3dGroupNormMean m({.in_channels = 3, .out_channels = 24, .num_groups = 8});
  fill_uniform_(m.norm->weight, 0.5, 1.5);
  Tensor x = random({2, 3, 9, 10, 11}, f32);
  Tensor ref = m(x);
  m.to(kGpu);
  EXPECT_LE(rel_l2(m(x.to(kGpu)), ref), 1e-5);
}
