// Ops on bf16 / f16 CUDA tensors, and tg::Autocast on the GPU, against the same ops on the CPU.
// Both sides compute in f32 on exact f32 copies of the half operands and round the f32 result
// once (ops/half_compute.h), so:
//   - ops that are one IEEE f32 operation per element (add, sub, mul, div, relu, abs, clamp,
//     neg) are bit-identical;
//   - ops whose f32 results differ by f32 rounding (the device's exp / tanh, an fma in affine,
//     another summation order in reductions and products) give half results that are the same
//     or neighbours: an f32 difference d moves the rounded value by at most d plus one half
//     ulp. Elementwise d is a few f32 ulps (2^-22 relative), far below bf16's 2^-8 and f16's
//     2^-11; reductions take positive inputs, so d stays within n * 2^-24 of the result; the
//     products' bound is the dot product's, 2K * 2^-24 * sum|x||w| per side (FP32 precision
//     on the GPU, as PrecisionGuard sets: FP32-accurate kernels), and most elements are
//     bit-identical.
// Storage and casts: test_half_cuda.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "common/cuda_compare.h"
#include "common/half_util.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

// Position of a half pattern on the number line, in ulps (+0 and -0 both 0).
int ulp_index(uint16_t h) { return (h & 0x8000) ? -static_cast<int>(h & 0x7fff) : static_cast<int>(h & 0x7fff); }

void expect_bit_identical(const Tensor& gpu, const Tensor& cpu, const char* what) {
  ASSERT_TRUE(gpu.device().is_cuda()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  EXPECT_EQ(half_bits(gpu), half_bits(cpu)) << what;
}

// Every element within one half ulp of the CPU's, and at least `identical` of them equal.
void expect_neighbours(const Tensor& gpu, const Tensor& cpu, const char* what, double identical = 0.0) {
  ASSERT_TRUE(gpu.device().is_cuda()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  const std::vector<uint16_t> g = half_bits(gpu), c = half_bits(cpu);
  size_t same = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    same += g[i] == c[i];
    ASSERT_LE(std::abs(ulp_index(g[i]) - ulp_index(c[i])), 1)
        << what << ": element " << i << " is " << decode_half(gpu.dtype(), g[i]) << ", the CPU's "
        << decode_half(cpu.dtype(), c[i]);
  }
  EXPECT_GE(static_cast<double>(same), identical * static_cast<double>(g.size())) << what;
}

// A product op's half results: |gpu - cpu| <= one half ulp + the two sides' f32 error bound,
// 2K * 2^-24 * magnitude each, with magnitude = the op on |operands| (f64, on the CPU).
void expect_product_close(const Tensor& gpu, const Tensor& cpu, const Tensor& magnitude, int64_t K, const char* what) {
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ASSERT_TRUE(gpu.device().is_cuda()) << what;
  const std::vector<float> g = gpu.to_vector<float>(), c = cpu.to_vector<float>();
  const std::vector<double> m = magnitude.to_vector<double>();
  const double ulp = gpu.dtype() == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);  // at 1
  size_t same = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    same += g[i] == c[i];
    const double big = std::max(std::fabs(g[i]), std::fabs(c[i]));
    const double bound = ulp * std::exp2(std::floor(std::log2(std::max(big, 1e-30)))) + 4.0 * K * std::ldexp(m[i], -24);
    ASSERT_LE(std::fabs(static_cast<double>(g[i]) - c[i]), bound) << what << ": element " << i;
  }
  // At most 1% of the elements (and at least one) may differ in their last bit: summation order
  // differs between the GPU's products and the CPU's, and a small result has few elements.
  const size_t allowed = std::max<size_t>(1, static_cast<size_t>(std::ceil(0.01 * static_cast<double>(g.size()))));
  EXPECT_GE(same + allowed, g.size()) << what;
}

Tensor on_gpu(const Tensor& t) { return t.to(kGpu); }

}  // namespace

TEST(HalfOpsCuda, ElementwiseOpsMatchTheCpu) {
  TG_REQUIRE_GPU();
  manual_seed(1);
  const Tensor xf = randn({3, 4, 50}), yf = randn({3, 4, 50}), bf = randn({4, 1});
  for (DType t : kHalves) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = xf.to(t), y = yf.to(t), b = bf.to(t);
    const Tensor gx = on_gpu(x), gy = on_gpu(y), gb = on_gpu(b);
    expect_bit_identical(add(gx, gy), add(x, y), "add");
    expect_bit_identical(sub(gx, gb), sub(x, b), "sub (broadcast)");
    expect_bit_identical(mul(gx, gy), mul(x, y), "mul");
    expect_bit_identical(div(gx, gy), div(x, y), "div");
    expect_bit_identical(div(gb, gx), div(b, x), "div (broadcast)");
    expect_bit_identical(gx * gy + gx, x * y + x, "operators");
    expect_bit_identical(relu(gx), relu(x), "relu");
    expect_bit_identical(abs(gx), abs(x), "abs");
    expect_bit_identical(clamp(gx, -0.5, 0.25), clamp(x, -0.5, 0.25), "clamp");
    expect_bit_identical(neg(gx), neg(x), "neg");
    expect_neighbours(affine(gx, 0.3, 0.1), affine(x, 0.3, 0.1), "affine");
    expect_neighbours(exp(gx), exp(x), "exp");
    expect_neighbours(log(abs(gx)), log(abs(x)), "log");
    expect_neighbours(sqrt(abs(gx)), sqrt(abs(x)), "sqrt");
    expect_neighbours(tanh(gx), tanh(x), "tanh");
    expect_neighbours(sigmoid(gx), sigmoid(x), "sigmoid");
    expect_neighbours(gelu(gx), gelu(x), "gelu");
    expect_neighbours(silu(gx), silu(x), "silu");
  }
}

TEST(HalfOpsCuda, ReductionsMatchTheCpu) {
  TG_REQUIRE_GPU();
  manual_seed(2);
  const Tensor xf = rand({6, 40, 33});  // positive: no cancellation, so f32 orders agree to n * 2^-24
  for (DType t : kHalves) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = xf.to(t), gx = on_gpu(x);
    expect_neighbours(sum(gx), sum(x), "sum");
    expect_neighbours(mean(gx), mean(x), "mean");
    expect_neighbours(sum(gx, {1}), sum(x, {1}), "sum over dim 1");
    expect_neighbours(mean(gx, {0, 2}, true), mean(x, {0, 2}, true), "mean over dims 0, 2");
  }
  // f32 accumulation on the GPU too: a bf16 sum of 4096 ones is 4096.
  EXPECT_EQ(sum(ones({4096}, {.dtype = DType::bf16, .device = kGpu})).item(), 4096.0);
}

TEST(HalfOpsCuda, LinearMatmulAndConvMatchTheCpu) {
  TG_REQUIRE_GPU();
  PrecisionGuard fp32(Precision::FP32);
  manual_seed(3);
  const Tensor a = randn({9, 40}), m = randn({40, 6}), lx = randn({7, 33}), lw = randn({5, 33}), lb = randn({5});
  const Tensor x = randn({2, 5, 9, 7}), w = randn({6, 5, 3, 3}), b = randn({6});
  const ConvParams p{.padding = {1}};
  auto mag = [](const Tensor& v) { return v.defined() ? abs(v.to(DType::f64)) : v; };
  for (DType t : kHalves) {
    SCOPED_TRACE(dtype_name(t));
    auto h = [t](const Tensor& v) { return v.to(t); };
    expect_product_close(matmul(on_gpu(h(a)), on_gpu(h(m))), matmul(h(a), h(m)),
                         matmul(mag(h(a)), mag(h(m))), 40, "matmul");
    expect_product_close(linear(on_gpu(h(lx)), on_gpu(h(lw)), on_gpu(h(lb))), linear(h(lx), h(lw), h(lb)),
                         linear(mag(h(lx)), mag(h(lw)), mag(h(lb))), 34, "linear");
    expect_product_close(conv2d(on_gpu(h(x)), on_gpu(h(w)), on_gpu(h(b)), p), conv2d(h(x), h(w), h(b), p),
                         conv2d(mag(h(x)), mag(h(w)), mag(h(b)), p), 46, "conv2d");
  }
}

// A half result used twice: its two bf16 gradients are summed on the GPU (gradient
// accumulation of half tensors); every step is one IEEE operation, so the f32 gradient that
// reaches the leaf is the CPU's, bit for bit.
TEST(HalfOpsCuda, GradientsThroughHalfResultsMatchTheCpu) {
  TG_REQUIRE_GPU();
  manual_seed(4);
  const Tensor init = randn({5, 31});
  for (DType t : kHalves) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<std::vector<float>> grads;
    for (Device d : {Device::cpu(), kGpu}) {
      Tensor x = init.detach().to(d).requires_grad_();
      {
        Tape tape;
        const Tensor h = x.to(t);
        const Tensor y = h * h + h;
        EXPECT_EQ(y.dtype(), t);
        tape.backward(sum(y.to(DType::f32)));
      }
      ASSERT_TRUE(x.grad().defined());
      EXPECT_EQ(x.grad().dtype(), DType::f32);
      EXPECT_EQ(x.grad().device(), d);
      grads.push_back(x.grad().to_vector<float>());
    }
    EXPECT_EQ(grads[1], grads[0]);
  }
}

// Under Autocast on the GPU the matrix ops round their f32 operands to the scope's type, run
// the f32 kernels on those values and round the result: bit for bit the same GPU kernels on
// operands rounded beforehand (the kernels are deterministic).
TEST(HalfOpsCuda, AutocastMatrixOpsRoundLikeTheCpu) {
  TG_REQUIRE_GPU();
  PrecisionGuard fp32(Precision::FP32);
  manual_seed(5);
  const TensorOptions on{.device = kGpu};
  const Tensor x = randn({2, 5, 9, 7}, on), w = randn({6, 5, 3, 3}, on), b = randn({6}, on);
  const Tensor a = randn({7, 11}, on), m = randn({11, 4}, on);
  const ConvParams p{.padding = {1}};
  auto rounded = [](const Tensor& v, DType t) { return v.to(t).to(DType::f32); };
  for (DType t : kHalves) {
    SCOPED_TRACE(dtype_name(t));
    Tensor y, mm;
    {
      Autocast ac(t);
      y = conv2d(x, w, b, p);
      mm = matmul(a, m);
    }
    ASSERT_EQ(y.dtype(), t);
    ASSERT_TRUE(y.device().is_cuda());
    EXPECT_EQ(half_bits(y), half_bits(conv2d(rounded(x, t), rounded(w, t), rounded(b, t), p).to(t)));
    EXPECT_EQ(half_bits(mm), half_bits(matmul(rounded(a, t), rounded(m, t)).to(t)));
    // The f32 ops of the table compute in f32 on the GPU too.
    Autocast ac(t);
    EXPECT_EQ(group_norm(y, ones({6}, {.device = kGpu}), zeros({6}, {.device = kGpu}), 2).dtype(), DType::f32);
    EXPECT_EQ(add(y, conv2d(x, w, b, p).to(DType::f32)).dtype(), DType::f32);
  }
}

namespace {

struct SmallNet {
  Tensor cw, cb, gw, gb, lw, lb;
  std::vector<Tensor> all() const { return {cw, cb, gw, gb, lw, lb}; }
};

SmallNet small_net_on(const SmallNet& init, Device d) {
  auto leaf = [d](const Tensor& t) { return t.detach().to(d).requires_grad_(); };  // init stays as it is
  return {leaf(init.cw), leaf(init.cb), leaf(init.gw), leaf(init.gb), leaf(init.lw), leaf(init.lb)};
}

// conv (bf16) -> GroupNorm (f32) -> relu -> spatial mean -> linear (bf16) -> cross_entropy (f32).
Tensor small_net_loss(const SmallNet& n, const Tensor& x, const Tensor& targets, Tensor* logits) {
  Autocast ac(DType::bf16);
  const Tensor h = relu(group_norm(conv2d(x, n.cw, n.cb, {.padding = {1}}), n.gw, n.gb, 4));
  *logits = linear(mean(h, {2, 3}), n.lw, n.lb);
  return cross_entropy(*logits, targets);
}

}  // namespace

// The same model under Autocast(bf16) on both devices, forward and backward. The two sides
// run the same f32 math on the same bf16 operands; they differ where f32 results that differ
// by summation order (about 1e-6 relative) round to neighbouring bf16 values, which is rare.
// The bounds: one bf16 rounding (2^-8) for the outputs, two (2^-7) for the gradients, which
// are rounded to bf16 at each op boundary on the way back; a GPU path that skipped or doubled
// a rounding would differ at every element and is also caught by the bitwise tests above.
TEST(HalfOpsCuda, AutocastModelMatchesTheCpuForwardAndBackward) {
  TG_REQUIRE_GPU();
  PrecisionGuard fp32(Precision::FP32);
  manual_seed(6);
  const SmallNet init{randn({8, 3, 3, 3}) * 0.3, randn({8}) * 0.1, randn({8}) * 0.1 + 1.0, randn({8}) * 0.1,
                      randn({5, 8}) * 0.3, randn({5}) * 0.1};
  const Tensor x = randn({4, 3, 9, 7});
  const std::vector<int64_t> labels = {0, 3, 1, 4};
  std::vector<Tensor> logits(2), losses(2), x_grads(2);
  std::vector<SmallNet> nets;
  int side = 0;
  for (Device d : {Device::cpu(), kGpu}) {
    nets.push_back(small_net_on(init, d));
    Tensor xd = x.detach().to(d).requires_grad_();
    const Tensor targets = from_vector(labels, {4}, {.device = d});
    {
      Tape tape;
      losses[side] = small_net_loss(nets.back(), xd, targets, &logits[side]);
      tape.backward(losses[side]);  // after the scope, as in PyTorch
    }
    x_grads[side] = xd.grad();
    ++side;
  }
  EXPECT_EQ(logits[1].dtype(), DType::bf16);
  EXPECT_TRUE(logits[1].device().is_cuda());
  EXPECT_EQ(losses[1].dtype(), DType::f32);
  EXPECT_LE(rel_l2(logits[1].to(DType::f32), logits[0].to(DType::f32)), std::ldexp(1.0, -8));
  EXPECT_LE(rel_l2(losses[1], losses[0]), std::ldexp(1.0, -8));
  EXPECT_LE(rel_l2(x_grads[1], x_grads[0]), std::ldexp(1.0, -7)) << "input gradient";
  const std::vector<Tensor> gpu = nets[1].all(), cpu = nets[0].all();
  for (size_t i = 0; i < gpu.size(); ++i) {
    ASSERT_TRUE(gpu[i].grad().defined()) << i;
    EXPECT_EQ(gpu[i].grad().dtype(), DType::f32) << i;  // f32 parameters get f32 gradients
    EXPECT_LE(rel_l2(gpu[i].grad(), cpu[i].grad()), std::ldexp(1.0, -7)) << "gradient of parameter " << i;
  }
}
