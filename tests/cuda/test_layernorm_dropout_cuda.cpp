// The CUDA layer_norm and dropout against the CPU reference: layer_norm forward, dx, dweight
// and dbias through the tape (f32 GPU vs f64 CPU) on warp-per-row and block-per-row shapes,
// the launchers into NaN-poisoned outputs in f32 and f64, bitwise determinism, the empty
// batch; dropout's masks and gradients bit for bit equal to the CPU's for the same seed, and
// the typed device errors.
#include <cuda_runtime.h>

#include <cmath>

#include "common/cuda_compare.h"
#include "common/test_util.h"
#include "ops/cuda/dropout.h"
#include "ops/cuda/layer_norm.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr double kTol = 1e-5;
const Device kGpu = Device::cuda(0);

struct Case {
  Shape shape;
  std::vector<int64_t> normalized_shape;
};

// Rows shorter and longer than a warp's 32 lanes, the last warp-per-row length (1024), the
// first block-per-row one (1025), long rows, many rows (several rows per warp of the grid),
// and a single element per row.
const std::vector<Case> kCases = {
    {{7, 9}, {9}},          {{37, 129}, {129}},       {{3, 5, 7, 9}, {7, 9}}, {{6, 1024}, {1024}},
    {{5, 1025}, {1025}},    {{3, 40000}, {40000}},    {{2, 3, 50, 61}, {3, 50, 61}},
    {{70001, 33}, {33}},    {{13, 1}, {1}},
};

LayerNormProblem problem_of(const Tensor& x, const std::vector<int64_t>& ns) {
  const int64_t D = Shape(ns).numel();
  return {.M = x.numel() / D, .D = D, .eps = 1e-5};
}

}  // namespace

TEST(LayerNormCuda, ForwardAndEveryGradientMatchCpu) {
  TG_REQUIRE_GPU();
  manual_seed(201);
  for (const Case& k : kCases) {
    for (int affine = 0; affine < 3; ++affine) {  // weight and bias, weight only, neither
      SCOPED_TRACE(testing::Message() << k.shape << " affine=" << affine);
      const Shape ns(k.normalized_shape);
      Tensor x = uniform(k.shape, -2, 3, {.device = kGpu}).requires_grad_();
      Tensor w = affine < 2 ? uniform(ns, 0.5, 1.5, {.device = kGpu}).requires_grad_() : Tensor();
      Tensor b = affine < 1 ? random(ns, f32, kGpu).requires_grad_() : Tensor();
      Tensor dy = random(k.shape, f32, kGpu);
      const auto nsv = k.normalized_shape;
      expect_matches_f64_cpu([nsv](const std::vector<Tensor>& in) { return layer_norm(in[0], nsv, in[1], in[2]); },
                             {x, w, b}, dy, kTol);
    }
  }
}

TEST(LayerNormCuda, LaunchersWriteEveryPoisonedOutput) {
  TG_REQUIRE_GPU();
  manual_seed(202);
  for (DType dt : {f32, f64}) {
    const double tol = dt == f32 ? kTol : 1e-12;
    for (const Case& k : kCases) {
      SCOPED_TRACE(testing::Message() << k.shape << " " << dtype_name(dt));
      const Shape ns(k.normalized_shape);
      const LayerNormProblem p = problem_of(Tensor::empty(k.shape), k.normalized_shape);
      Tensor x = uniform(k.shape, -2, 3, {.dtype = dt, .device = kGpu}), dy = random(k.shape, dt, kGpu);
      Tensor w = uniform(ns, 0.5, 1.5, {.dtype = dt, .device = kGpu}), b = random(ns, dt, kGpu);
      Tensor y = poisoned_gpu(k.shape, dt), mean = poisoned_gpu({p.M}, dt), rstd = poisoned_gpu({p.M}, dt);
      cuda::layer_norm_forward(y, mean, rstd, x, w, b, p);
      const TensorOptions h{.dtype = f64};
      Tensor rx = ref_of(x), rw = ref_of(w), rb = ref_of(b);
      Tensor ry = Tensor::empty(k.shape, h), rmean = Tensor::empty({p.M}, h), rrstd = Tensor::empty({p.M}, h);
      cpu::layer_norm_forward(ry, rmean, rrstd, rx, rw, rb, p);
      EXPECT_LE(rel_l2(y, ry), tol);
      EXPECT_LE(rel_l2(mean, rmean), tol);
      EXPECT_LE(rel_l2(rstd, rrstd), tol);

      // Backward from the GPU's own statistics; the reference uses the same values.
      Tensor dx = poisoned_gpu(k.shape, dt), dw = poisoned_gpu(ns, dt), db = poisoned_gpu(ns, dt);
      cuda::layer_norm_backward(dx, dw, db, dy, x, w, mean, rstd, p);
      Tensor rdx = Tensor::empty(k.shape, h), rdw = Tensor::empty(ns, h), rdb = Tensor::empty(ns, h);
      cpu::layer_norm_backward(rdx, rdw, rdb, ref_of(dy), rx, rw, ref_of(mean), ref_of(rstd), p);
      EXPECT_LE(rel_l2(dx, rdx), tol);
      EXPECT_LE(rel_l2(dw, rdw), tol);
      EXPECT_LE(rel_l2(db, rdb), tol);

      // Each output alone, and without a weight.
      Tensor only_db = poisoned_gpu(ns, dt);
      cuda::layer_norm_backward(Tensor(), Tensor(), only_db, dy, x, w, mean, rstd, p);
      EXPECT_LE(rel_l2(only_db, rdb), tol);
      Tensor only_dx = poisoned_gpu(k.shape, dt);
      cuda::layer_norm_backward(only_dx, Tensor(), Tensor(), dy, x, Tensor(), mean, rstd, p);
      Tensor rdx_nw = Tensor::empty(k.shape, h);
      cpu::layer_norm_backward(rdx_nw, Tensor(), Tensor(), ref_of(dy), rx, Tensor(), ref_of(mean), ref_of(rstd), p);
      EXPECT_LE(rel_l2(only_dx, rdx_nw), tol);
    }
  }
}

TEST(LayerNormCuda, DeterministicAndEmptyBatch) {
  TG_REQUIRE_GPU();
  manual_seed(203);
  auto grads = [] {
    Tensor x = random({3001, 257}, f32, kGpu);
    Tensor w = random({257}, f32, kGpu).requires_grad_(), b = random({257}, f32, kGpu).requires_grad_();
    Tensor dy = random({3001, 257}, f32, kGpu);
    Tape tape;
    tape.backward(layer_norm(x, {257}, w, b), dy);
    return std::pair{w.grad().to_vector<float>(), b.grad().to_vector<float>()};
  };
  manual_seed(5);
  auto first = grads();
  manual_seed(5);
  auto second = grads();
  EXPECT_EQ(first.first, second.first);
  EXPECT_EQ(first.second, second.second);

  Tensor x = Tensor::empty({0, 5}, {.device = kGpu}).requires_grad_();
  Tensor w = random({5}, f32, kGpu).requires_grad_(), b = random({5}, f32, kGpu).requires_grad_();
  {
    Tape tape;
    tape.backward(layer_norm(x, {5}, w, b), Tensor::empty({0, 5}, {.device = kGpu}));
  }
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(5, 0.0f));
  EXPECT_EQ(b.grad().to_vector<float>(), std::vector<float>(5, 0.0f));
}

TEST(LayerNormCuda, DeviceErrors) {
  TG_REQUIRE_GPU();
  Tensor x = random({4, 6}, f32, kGpu);
  EXPECT_THROW(layer_norm(x, {6}, random({6}, f32)), DeviceError);
  EXPECT_THROW(layer_norm(x, {6}, Tensor(), random({6}, f64, kGpu)), DTypeError);
  nn::LayerNorm ln({.normalized_shape = {6}});
  ln.to(kGpu);
  EXPECT_LE(rel_l2(ln(x), layer_norm(ref_of(x), {6})), kTol);
}

// ---- dropout ------------------------------------------------------------------------------

TEST(DropoutCuda, SameMaskAndValuesAsTheCpuBitForBit) {
  TG_REQUIRE_GPU();
  manual_seed(211);
  for (DType dt : {f32, f64}) {
    for (int spatial : {0, 2, 3}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " spatial=" << spatial);
      const Shape s = spatial == 3 ? Shape{3, 7, 5, 9, 13} : Shape{3, 7, 97, 131};
      Tensor x = random(s, dt);
      const DropoutParams params{.p = 0.37, .seed = 1234567, .offset = 89};
      auto run = [&](const Tensor& in) {
        return spatial == 0 ? dropout(in, params) : spatial == 2 ? dropout2d(in, params) : dropout3d(in, params);
      };
      Tensor xg = x.cuda().requires_grad_(), xc = x.clone().requires_grad_();
      Tensor dy = random(s, dt);
      Tensor yg, yc;
      {
        Tape tape;
        yg = run(xg);
        tape.backward(yg, dy.cuda());
      }
      {
        Tape tape;
        yc = run(xc);
        tape.backward(yc, dy);
      }
      if (dt == f32) {
        EXPECT_EQ(yg.to_vector<float>(), yc.to_vector<float>());
        EXPECT_EQ(xg.grad().to_vector<float>(), xc.grad().to_vector<float>());
      } else {
        EXPECT_EQ(yg.to_vector<double>(), yc.to_vector<double>());
        EXPECT_EQ(xg.grad().to_vector<double>(), xc.grad().to_vector<double>());
      }
    }
  }
}

TEST(DropoutCuda, LauncherWritesEveryPoisonedOutput) {
  TG_REQUIRE_GPU();
  // p = 0.5: about half the outputs are zeros the kernel must write, not leave as NaN.
  const Shape s{7, 9, 13};
  Tensor x = random(s, f32, kGpu);
  Tensor y = poisoned_gpu(s, f32);
  const DropoutProblem q{.units = 7 * 9, .inner = 13, .p = 0.5, .seed = 3};
  cuda::dropout_apply(y, x, q);
  Tensor ry = Tensor::empty(s);
  cpu::dropout_apply(ry, x.cpu(), q);
  EXPECT_EQ(y.to_vector<float>(), ry.to_vector<float>());
  int zeros = 0;
  for (float v : y.to_vector<float>()) zeros += v == 0.0f;
  EXPECT_GT(zeros, 0);
}

TEST(DropoutCuda, StatisticsModulesAndGlobalGenerator) {
  TG_REQUIRE_GPU();
  const int64_t n = 1 << 22;
  Tensor x = ones({n}, {.device = kGpu});
  Tensor y = dropout(x, {.p = 0.2, .seed = 8});
  int64_t kept = 0;
  for (float v : y.to_vector<float>()) {
    if (v == 0.0f) continue;
    ++kept;
    ASSERT_EQ(v, static_cast<float>(1.0 * (1.0 / (1.0 - 0.2))));
  }
  EXPECT_NEAR(double(kept) / double(n), 0.8, 2e-3);
  // Without a seed: the same draws as on the CPU after the same manual_seed.
  Tensor xs = random({4, 3, 17, 19}, f32);
  manual_seed(77);
  Tensor a = dropout(xs.cuda(), 0.5);
  manual_seed(77);
  Tensor b = dropout(xs, 0.5);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  // Modules on the GPU: train differs call to call, eval is the identity.
  nn::Dropout2d d({.p = 0.5, .seed = 4});
  Tensor xg = xs.cuda();
  EXPECT_NE(d(xg).to_vector<float>(), d(xg).to_vector<float>());
  d.eval();
  EXPECT_TRUE(d(xg).same(xg));
}

// ---- past 2^31 elements: every index and offset is 64-bit ---------------------------------

namespace {

// Raw copies run on the legacy stream, which does not wait for the framework's.
std::vector<float> tail_of(const Tensor& t, int64_t count) {
  synchronize(kGpu);
  std::vector<float> out(static_cast<size_t>(count));
  EXPECT_EQ(cudaMemcpy(out.data(), t.data<float>() + (t.numel() - count), count * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

}  // namespace

TEST(LayerNormCuda, RowsPast2To31Elements) {
  TG_REQUIRE_GPU();
  manual_seed(204);
  // Warp rows and block rows; the last row starts past element 2^31.
  for (Shape s : {Shape{(int64_t{1} << 21) + 1, 1024}, Shape{(int64_t{1} << 11) + 1, int64_t{1} << 20}}) {
    SCOPED_TRACE(s.str());
    const LayerNormProblem p{.M = s[0], .D = s[1], .eps = 1e-5};
    Tensor x = random(s, f32, kGpu);
    ASSERT_GT(x.numel(), int64_t{1} << 31);
    Tensor y = poisoned_gpu(s, f32), mean = poisoned_gpu({p.M}, f32), rstd = poisoned_gpu({p.M}, f32);
    cuda::layer_norm_forward(y, mean, rstd, x, Tensor(), Tensor(), p);
    // Every row of y sums to 0: also false for an unwritten (NaN) element anywhere.
    EXPECT_NEAR(sum(y).item(), 0.0, 1e-6 * double(x.numel()));
    const LayerNormProblem row{.M = 1, .D = p.D, .eps = 1e-5};
    const Tensor rx = from_vector(tail_of(x, p.D), {1, p.D});
    EXPECT_LE(rel_l2(from_vector(tail_of(y, p.D), {1, p.D}), layer_norm(rx, {p.D})), kTol);
    y = Tensor();

    Tensor dy = random(s, f32, kGpu);
    Tensor dx = poisoned_gpu(s, f32), db = poisoned_gpu({p.D}, f32);
    cuda::layer_norm_backward(dx, Tensor(), db, dy, x, Tensor(), mean, rstd, p);
    EXPECT_NEAR(sum(dx).item(), 0.0, 1e-6 * double(x.numel()));  // without a weight, rows of dx sum to 0
    EXPECT_TRUE(std::isfinite(sum(db).item()));
    Tensor rdx = Tensor::empty({1, p.D});
    cpu::layer_norm_backward(rdx, Tensor(), Tensor(), from_vector(tail_of(dy, p.D), {1, p.D}), rx, Tensor(),
                             from_vector(tail_of(mean, 1), {1}), from_vector(tail_of(rstd, 1), {1}), row);
    EXPECT_LE(rel_l2(from_vector(tail_of(dx, p.D), {1, p.D}), rdx), kTol);
  }
}

TEST(DropoutCuda, Past2To31Elements) {
  TG_REQUIRE_GPU();
  // Elements, and channels of 1024 whose last one starts past element 2^31.
  for (int64_t inner : {int64_t{1}, int64_t{1024}}) {
    SCOPED_TRACE(inner);
    const int64_t units = inner == 1 ? (int64_t{1} << 31) + 7 : (int64_t{1} << 21) + 1;
    const int64_t n = units * inner;
    Tensor x = ones({n}, {.device = kGpu});
    Tensor y = poisoned_gpu({n}, f32);
    const DropoutProblem q{.units = units, .inner = inner, .p = 0.5, .seed = 3};
    cuda::dropout_apply(y, x, q);
    EXPECT_NEAR(sum(y).item() / double(n), 1.0, 1e-2);  // NaN fails too
    const auto t = tail_of(y, 16);
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t u = (n - 16 + i) / inner;
      EXPECT_EQ(t[size_t(i)], dropout_keeps(q, u) ? 2.0f : 0.0f) << "element " << n - 16 + i;
    }
  }
}
