// The shape and pooling CUDA kernels against the CPU reference: every op forward and
// backward through the tape in f32 against f64 CPU; the kernels called directly into
// NaN-poisoned outputs (indices poisoned with -1) in f32, f64 and, for the copies, i64;
// max-pool indices identical to the CPU's (ties included); more elements than the grid
// has threads; typed device/dtype errors; and tensors past 2^31 elements (64-bit offsets).
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/cuda_compare.h"
#include "common/pool_kernels_check.h"
#include "core/cuda_context.h"
#include "ops/cpu/shape_pool_kernels.h"
#include "ops/cuda/shape_pool_kernels.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

// Random values of any dtype (i64: small integers), the same on the GPU and the CPU.
Tensor random_of(const Shape& s, DType dt) {
  if (dt != DType::i64) return random(s, dt, kGpu);
  return uniform(s, -1000, 1000, {.dtype = f64}).to(DType::i64).to(kGpu);
}

// Runs f on the GPU in f32 and on the CPU in f64, forward and backward, seeded with random
// output gradients. Copies are exact; sums and averages carry f32 rounding only.
void expect_op_matches(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                       double tol) {
  for (const Tensor& t : inputs) t.zero_grad();  // leaves accumulate: start each comparison afresh
  Shape out_shape;
  {
    NoGradGuard guard;
    out_shape = f(inputs).shape();
  }
  expect_matches_f64_cpu(f, inputs, random(out_shape, f32, kGpu), tol);
}

struct PoolCase {
  Shape shape;
  std::vector<int64_t> kernel, stride, padding;
};
std::vector<PoolCase> pool_cases() {
  return {
      {{2, 3, 7, 9}, {3}, {2}, {1}},            // overlapping windows, padding
      {{2, 3, 7, 9}, {2}, {3}, {0}},            // stride > kernel
      {{1, 2, 9, 13}, {3, 2}, {1, 2}, {1, 0}},  // per-dim values
      {{2, 1, 7, 9}, {7, 9}, {}, {0}},          // one window per plane
      {{1, 2, 5, 7, 6}, {3}, {2}, {1}},         // 3-D
      {{2, 1, 7, 5, 9}, {2, 3, 1}, {3, 1, 2}, {1, 1, 0}},
      {{4, 16, 130, 257}, {3}, {1}, {1}},       // 2.1M inputs and outputs: more than the grid
  };
}

// Every problem of a case: max, avg, and adaptive average to a size that does not divide.
std::vector<PoolProblem> problems_of(const PoolCase& c, const Tensor& x) {
  const int sp = static_cast<int>(c.shape.rank()) - 2;
  const PoolParams p{.kernel_size = c.kernel, .stride = c.stride, .padding = c.padding};
  std::vector<int64_t> adaptive;
  for (int d = 0; d < sp; ++d) adaptive.push_back(c.shape[2 + d] / 2 + 1);
  return {make_pool_problem("test", PoolKind::max, sp, x, p), make_pool_problem("test", PoolKind::avg, sp, x, p),
          make_adaptive_pool_problem("test", sp, x, adaptive), make_adaptive_pool_problem("test", sp, x, {3})};
}

Tensor run_pool(const Tensor& x, const PoolCase& c, PoolKind kind) {
  const bool is3d = c.shape.rank() == 5;
  const PoolParams p{.kernel_size = c.kernel, .stride = c.stride, .padding = c.padding};
  if (kind == PoolKind::max) return is3d ? max_pool3d(x, p) : max_pool2d(x, p);
  if (kind == PoolKind::avg) return is3d ? avg_pool3d(x, p) : avg_pool2d(x, p);
  return is3d ? adaptive_avg_pool3d(x, {2, 3, 4}) : adaptive_avg_pool2d(x, {4, 5});
}

}  // namespace

TEST(CudaShapeOps, EveryOpMatchesF64CpuThroughTheTape) {
  TG_REQUIRE_GPU();
  manual_seed(201);
  auto gpu_param = [](const Shape& s) { return random(s, f32, kGpu).requires_grad_(); };
  Tensor a = gpu_param({3, 2, 7}), b = gpu_param({3, 5, 7}), c = gpu_param({3, 1, 7});
  // in[0] twice: its two gradients are summed in f32 on the GPU (rounding only).
  expect_op_matches([](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[2], in[0]}, -2); }, {a, b, c},
                    1e-7);
  expect_op_matches([](const std::vector<Tensor>& in) { return cat({in[2], in[1], in[0]}, 1); }, {a, b, c}, 0);
  Tensor x = gpu_param({3, 13, 5});
  expect_op_matches([](const std::vector<Tensor>& in) {
    auto parts = split(in[0], {4, 2, 7}, 1);
    return cat({parts[2], parts[0]}, 1);  // parts[1] unused: zeros in the gradient
  }, {x}, 0);
  expect_op_matches([](const std::vector<Tensor>& in) {
    auto parts = chunk(in[0], 2, -1);
    return cat({parts[1], parts[0]}, -1);
  }, {x}, 0);
  expect_op_matches([](const std::vector<Tensor>& in) { return slice(in[0], 1, -12, 13, 3); }, {x}, 0);
  expect_op_matches([](const std::vector<Tensor>& in) { return narrow(in[0], 2, 1, 3); }, {x}, 0);
  expect_op_matches([](const std::vector<Tensor>& in) { return unflatten(flatten(in[0], 1), 1, {5, -1}); }, {x}, 0);
  // Millions of elements: more than the grid-stride loops' grid.
  Tensor big = gpu_param({3, 1000003});
  expect_op_matches([](const std::vector<Tensor>& in) { return slice(in[0], 1, 1, 1000003, 2); }, {big}, 0);
  expect_op_matches([](const std::vector<Tensor>& in) {
    auto parts = split(in[0], {500000, 500003}, 1);
    return cat({parts[1], parts[0]}, 1);
  }, {big}, 0);
}

TEST(CudaShapeOps, KernelsWriteEveryOutput) {
  TG_REQUIRE_GPU();
  manual_seed(202);
  struct W {
    Shape big;
    int64_t dim, start, length, step;
  };
  for (DType dt : {f32, f64, DType::i64}) {
    for (W w : {W{{3, 13, 5}, 1, 1, 4, 3}, W{{3, 13, 5}, 2, 4, 1, 1}, W{{13}, 0, 0, 13, 1}, W{{7, 9}, 0, 2, 3, 2},
                W{{7, 9}, 1, 8, 0, 1}, W{{2, 100003, 3}, 1, 5, 33330, 3}}) {
      SCOPED_TRACE(w.big.str() + " dim " + std::to_string(w.dim) + " " + dtype_name(dt));
      const SliceProblem p = make_slice_problem("test", w.big, w.dim, w.start, w.length, w.step);
      const Shape small_shape = slice_shape(w.big, w.dim, w.length);
      Tensor big = random_of(w.big, dt);
      Tensor small = poisoned_gpu(small_shape, dt);
      cuda::slice_gather(small, big, p);
      Tensor small_ref = Tensor::empty(small_shape, {.dtype = dt});
      cpu::slice_gather(small_ref, big.cpu(), p);
      EXPECT_EQ(small.to_vector<double>(), small_ref.to_vector<double>()) << "gather";

      // The scatter writes the window and leaves the rest: both start from the same values.
      Tensor src = random_of(small_shape, dt);
      Tensor target = random_of(w.big, dt);
      Tensor target_ref = target.cpu();
      cuda::slice_scatter(target, src, p);
      cpu::slice_scatter(target_ref, src.cpu(), p);
      EXPECT_EQ(target.to_vector<double>(), target_ref.to_vector<double>()) << "scatter";
    }
  }
}

TEST(CudaPool, EveryKindMatchesF64CpuThroughTheTape) {
  TG_REQUIRE_GPU();
  manual_seed(203);
  for (const PoolCase& c : pool_cases()) {
    for (PoolKind kind : {PoolKind::max, PoolKind::avg, PoolKind::adaptive_avg}) {
      SCOPED_TRACE(c.shape.str() + " kernel " + Shape(c.kernel).str() + " kind " + std::to_string(int(kind)));
      Tensor x = random(c.shape, f32, kGpu).requires_grad_();
      // Max picks the same element from the same values in f32 and f64; its gradient is
      // rounded to f32 where windows overlap.
      expect_op_matches([&](const std::vector<Tensor>& in) { return run_pool(in[0], c, kind); }, {x}, 1e-6);
    }
  }
}

TEST(CudaPool, KernelsWriteEveryOutputAndIndicesMatchTheCpu) {
  TG_REQUIRE_GPU();
  manual_seed(204);
  for (DType dt : {f32, f64}) {
    const double tol = dt == f32 ? 1e-7 : 1e-15;
    for (const PoolCase& c : pool_cases()) {
      // Inputs of few distinct values: many ties, which the indices must break alike.
      for (bool ties : {false, true}) {
        Tensor x = random(c.shape, dt, kGpu);
        if (ties) x = (x * 2.0 + 2.0).to(DType::i64).to(dt);
        for (const PoolProblem& p : problems_of(c, x)) {
          SCOPED_TRACE(c.shape.str() + " out " + pool_output_shape(p).str() + " kind " + std::to_string(int(p.kind)) +
                       (ties ? " ties " : " ") + dtype_name(dt));
          expect_pool_kernels_match_cpu(x, p, dt, tol);
        }
      }
    }
  }
}

TEST(CudaPool, NaNAndPaddingMatchTheCpu) {
  TG_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = from_vector(std::vector<float>{1, nan, 5, 2, -3, -4, -1, -2, 7}, {1, 1, 3, 3});
  auto expect_same = [](const Tensor& got, const Tensor& want) {
    auto g = got.to_vector<float>(), w = want.to_vector<float>();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      if (std::isnan(w[i])) {
        EXPECT_TRUE(std::isnan(g[i])) << i;
      } else {
        EXPECT_EQ(g[i], w[i]) << i;
      }
    }
  };
  // Windows with the NaN, with padding only beside negative values, and with both.
  const PoolParams p{.kernel_size = {2}, .stride = {1}, .padding = {1}};
  MaxPoolResult g = max_pool2d_with_indices(x.to(kGpu), p), r = max_pool2d_with_indices(x, p);
  EXPECT_EQ(g.indices.to_vector<int64_t>(), r.indices.to_vector<int64_t>());
  expect_same(g.output, r.output);
  expect_same(avg_pool2d(x.to(kGpu), p), avg_pool2d(x, p));
}

TEST(CudaShapePool, DeviceAndDtypeMismatchesAreTypedErrors) {
  TG_REQUIRE_GPU();
  Tensor g = random({2, 3, 4, 4}, f32, kGpu), c = random({2, 3, 4, 4}, f32);
  EXPECT_THROW(cat({g, c}, 0), DeviceError);
  TG_EXPECT_ERROR(cat({g, c}, 0), "cat", "cuda:0", "cpu");
  const SliceProblem sp = make_slice_problem("test", g.shape(), 1, 0, 2, 1);
  EXPECT_THROW(cuda::slice_gather(Tensor::empty({2, 2, 4, 4}), g, sp), DeviceError);
  EXPECT_THROW(cuda::slice_gather(Tensor::empty({2, 2, 4, 4}, {.dtype = f64, .device = kGpu}), g, sp), DTypeError);
  EXPECT_THROW(cuda::slice_gather(Tensor::empty({2, 3, 4, 4}, {.device = kGpu}), g, sp), ShapeError);

  MaxPoolResult r = max_pool2d_with_indices(g, {.kernel_size = {2}});
  const PoolProblem p = make_pool_problem("test", PoolKind::max, 2, g, {.kernel_size = {2}});
  EXPECT_THROW(max_pool_backward(r.output, r.indices.cpu(), p), DeviceError);
  TG_EXPECT_ERROR(max_pool_backward(r.output, r.indices.cpu(), p), "max_pool2d_backward", "cuda:0", "cpu");
  EXPECT_THROW(max_pool_backward(r.output.cpu(), r.indices, p), DeviceError);
  EXPECT_THROW(cuda::pool_forward(Tensor::empty({2, 3, 2, 2}, {.dtype = f64, .device = kGpu}), r.indices, g, p),
               DTypeError);
  EXPECT_THROW(cuda::pool_forward(r.output, r.indices.to(f32), g, p), DTypeError);
  EXPECT_THROW(cuda::pool_backward(Tensor::empty({2, 3, 4, 5}, {.device = kGpu}), r.output, r.indices, p), ShapeError);
  // Empty batches launch nothing and fail nothing.
  EXPECT_EQ(max_pool2d(Tensor::empty({0, 3, 4, 4}, {.device = kGpu}), {.kernel_size = {2}}).shape(),
            Shape({0, 3, 2, 2}));
  EXPECT_EQ(cat({Tensor::empty({0, 5}, {.device = kGpu}), Tensor::empty({0, 5}, {.device = kGpu})}, 0).shape(),
            Shape({0, 5}));
}

// ---- past 2^31 elements: every index and offset is 64-bit ---------------------------------

namespace {

// Raw copies run on the legacy stream, which does not wait for the framework's:
// synchronize around them.
void set_tail(const Tensor& t, const std::vector<float>& tail) {
  synchronize(kGpu);
  ASSERT_EQ(cudaMemcpy(t.data<float>() + (t.numel() - static_cast<int64_t>(tail.size())), tail.data(),
                       tail.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  t.bump_version();
}

template <class T>
std::vector<T> tail_of(const Tensor& t, int64_t count) {
  synchronize(kGpu);
  std::vector<T> out(static_cast<size_t>(count));
  EXPECT_EQ(cudaMemcpy(out.data(), t.data<T>() + (t.numel() - count), count * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

}  // namespace

TEST(CudaShapeOps, Past2To31Elements) {
  TG_REQUIRE_GPU();
  const int64_t n = (int64_t{1} << 31) + 7;
  Tensor x = zeros({n}, {.device = kGpu});
  set_tail(x, {1, 2, 3, 4, 5, 6, 7});  // a kernel that wraps at 2^31 reads zeros here
  EXPECT_EQ(narrow(x, 0, n - 8, 8).to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(slice(x, 0, -7, n, 2).to_vector<float>(), (std::vector<float>{1, 3, 5, 7}));
  // A cat whose second input lands past 2^31 in the output.
  Tensor tail = from_vector(std::vector<float>{8, 9}, {2}).to(kGpu);
  Tensor y = cat({x, tail}, 0);
  x = Tensor();
  EXPECT_EQ(tail_of<float>(y, 4), (std::vector<float>{6, 7, 8, 9}));
}

TEST(CudaPool, MaxPoolPast2To31Elements) {
  TG_REQUIRE_GPU();
  // (1, 2, 32770, 32768): 2^31 + 131072 inputs; the second plane starts past 2^30 and ends
  // past 2^31. The last four inputs are 1..4: the last two windows pick 2 and 4.
  Tensor x = zeros({1, 2, 32770, 32768}, {.device = kGpu});
  set_tail(x, {1, 2, 3, 4});
  const PoolProblem p = make_pool_problem("test", PoolKind::max, 2, x, {.kernel_size = {2}});
  const Shape ys = pool_output_shape(p);
  ASSERT_EQ(ys, Shape({1, 2, 16385, 16384}));
  Tensor y = poisoned_gpu(ys, f32), idx = poisoned_gpu(ys, DType::i64);
  cuda::pool_forward(y, idx, x, p);
  EXPECT_EQ(sum(y).item(), 6.0);  // NaN (an unwritten output) fails too
  EXPECT_EQ(tail_of<float>(y, 2), (std::vector<float>{2, 4}));
  const int64_t last_row = int64_t{32769} * 32768;
  EXPECT_EQ(tail_of<int64_t>(idx, 2), (std::vector<int64_t>{last_row + 32765, last_row + 32767}));
  x = Tensor();
  y = Tensor();
  // Every window's gradient lands on its argmax (the first element where all are zero).
  Tensor dy = ones(ys, {.device = kGpu});
  Tensor dx = poisoned_gpu({1, 2, 32770, 32768}, f32);
  cuda::pool_backward(dx, dy, idx, p);
  EXPECT_EQ(sum(dx).item(), double(ys.numel()));
  EXPECT_EQ(tail_of<float>(dx, 4), (std::vector<float>{0, 1, 0, 1}));
}
