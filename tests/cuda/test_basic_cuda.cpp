// The basic CUDA kernels against the CPU reference, and 64-bit indexing over 2^31 + 7 floats.
#include <cuda_runtime.h>

#include <chrono>
#include <thread>

#include "common/test_util.h"
#include "core/cuda_context.h"
#include "ops/cuda/kernels.h"
#include "ops/reduce_index.h"

using namespace tg;
using namespace tg::test;

namespace {

const Device kGpu = Device::cuda(0);

// Runs f on CPU f32 inputs and on their GPU copies; compares every output and gradient.
void expect_matches_cpu(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> cpu_inputs) {
  std::vector<Tensor> gpu_inputs;
  for (Tensor& t : cpu_inputs) {
    t.requires_grad_();
    gpu_inputs.push_back(t.detach().to(kGpu).requires_grad_());
  }
  Tensor y_cpu, y_gpu;
  {
    Tape tape;
    y_cpu = f(cpu_inputs);
    tape.backward(sum(y_cpu));
  }
  {
    Tape tape;
    y_gpu = f(gpu_inputs);
    tape.backward(sum(y_gpu));
  }
  EXPECT_LE(rel_l2(y_gpu, y_cpu), 1e-6);
  for (size_t i = 0; i < cpu_inputs.size(); ++i) EXPECT_LE(rel_l2(gpu_inputs[i].grad(), cpu_inputs[i].grad()), 1e-6) << "input " << i;
}

}  // namespace

TEST(CudaBasic, ElementwiseBroadcastMatchesCpu) {
  TG_REQUIRE_GPU();
  expect_matches_cpu([](const std::vector<Tensor>& in) { return relu(in[0] * in[1] + in[2]) / (in[1] * in[1] + 1.0); },
                     {random({3, 7, 9, 5}, f32), random({7, 1, 1}, f32), random({5}, f32)});
  expect_matches_cpu([](const std::vector<Tensor>& in) { return (in[0] - in[1]) * 0.5; },
                     {random({13, 1}, f32), random({1, 9}, f32)});
}

TEST(CudaBasic, ReductionsMatchCpu) {
  TG_REQUIRE_GPU();
  for (std::vector<int64_t> dims : std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {3}, {0, 2}, {1, 3}, {0, 1, 2, 3}}) {
    expect_matches_cpu([dims](const std::vector<Tensor>& in) { return sum(in[0], dims) * 1.5; },
                       {random({5, 7, 9, 11}, f32)});
    expect_matches_cpu([dims](const std::vector<Tensor>& in) { return mean(in[0], dims, true); },
                       {random({3, 1, 13, 300}, f32)});
  }
  // A long reduction into few outputs takes the split (two-pass) path.
  expect_matches_cpu([](const std::vector<Tensor>& in) { return sum(in[0], {1}); }, {random({3, 1000003}, f32)});
  expect_matches_cpu([](const std::vector<Tensor>& in) { return sum(in[0], {0}); }, {random({100003, 3}, f32)});
}

TEST(CudaBasic, PermuteAndCopiesMatchCpu) {
  TG_REQUIRE_GPU();
  expect_matches_cpu([](const std::vector<Tensor>& in) { return in[0].permute({0, 2, 3, 1}).reshape({-1, 7}) * 2.0; },
                     {random({2, 7, 9, 5}, f32)});
  Tensor x = random({4, 5}, f64);
  EXPECT_EQ(x.to(kGpu).to(f32).cpu().to_vector<float>(), x.to(f32).to_vector<float>());
}

TEST(CudaBasic, KernelsWriteEveryOutput) {
  TG_REQUIRE_GPU();
  Tensor a = random({7, 9, 13}, f32, kGpu), b = random({9, 1}, f32, kGpu);
  Tensor out = Tensor::empty({7, 9, 13}, {.device = kGpu});
  poison(out);
  cuda::binary(BinaryOp::mul, out, a, b);
  EXPECT_LE(rel_l2(out, mul(a.cpu(), b.cpu())), 1e-7);
  poison(out);
  cuda::relu(out, a);
  EXPECT_LE(rel_l2(out, relu(a.cpu())), 1e-7);
  Tensor s = Tensor::empty({7, 13}, {.device = kGpu});
  poison(s);
  cuda::sum(s, a, make_reduce_index(a.shape(), {false, true, false}));
  EXPECT_LE(rel_l2(s, sum(a.cpu(), {1})), 1e-6);
}

TEST(CudaBasic, RandomNumbersAreDeviceIndependent) {
  TG_REQUIRE_GPU();
  manual_seed(42);
  Tensor g = randn({1001}, {.device = kGpu});
  manual_seed(42);
  Tensor c = randn({1001});
  EXPECT_LE(rel_l2(g, c), 1e-6);
}

// 2^31 + 7 elements: every index, count and offset must be 64-bit.
TEST(CudaBasic, SumAndMulPast2To31Elements) {
  TG_REQUIRE_GPU();
  const int64_t n = (int64_t{1} << 31) + 7;
  Tensor x = ones({n}, {.device = kGpu});
  // The last 7 elements hold 2^28, so a kernel that stops at 2^31 (or wraps) is caught:
  // the exact sum 2^31 + 7 * 2^28 = 15 * 2^28 is representable in f32.
  const float big = 268435456.0f;
  std::vector<float> tail(7, big);
  // Raw cudaMemcpy runs on the legacy stream, which does not wait for the framework's
  // non-blocking stream: synchronize around it.
  synchronize(kGpu);
  ASSERT_EQ(cudaMemcpy(x.data<float>() + (n - 7), tail.data(), 7 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  x.bump_version();
  EXPECT_EQ(sum(x).item(), 15.0 * 268435456.0);

  Tensor y = mul(x, x);  // tail -> 2^56, the rest 1
  x = Tensor();
  synchronize(kGpu);
  std::vector<float> head(2), last(8);
  ASSERT_EQ(cudaMemcpy(head.data(), y.data<float>(), 2 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(last.data(), y.data<float>() + (n - 8), 8 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(head[0], 1.0f);
  EXPECT_EQ(head[1], 1.0f);
  EXPECT_EQ(last[0], 1.0f);  // element 2^31 - 1
  for (int i = 1; i < 8; ++i) EXPECT_EQ(last[i], big * big) << "element " << n - 8 + i;
}

// tg::GpuTimer must bracket work on tapegrad's own stream (a non-blocking stream: events on
// the default stream would not wait for it). A host function that sleeps 50 ms is queued on
// that stream between start() and stop(): the timer must see it.
TEST(CudaBasic, GpuTimerTimesTapegradsStream) {
  TG_REQUIRE_GPU();
  Tensor a = random({512, 512}, f32, kGpu), b = random({512, 512}, f32, kGpu);
  tg::cuda::Timer timer(kGpu);
  timer.start();
  Tensor c = matmul(a, b);
  timer.stop();
  EXPECT_GT(timer.elapsed_ms(), 0.0);

  timer.start();
  ASSERT_EQ(cudaLaunchHostFunc(
                tg::cuda::stream(0), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr),
            cudaSuccess);
  timer.stop();
  EXPECT_GE(timer.elapsed_ms(), 40.0);
  synchronize(kGpu);
}

TEST(CudaBasic, CudaAndDeviceErrorsAreTyped) {
  TG_REQUIRE_GPU();
  try {
    TG_CUDA_CHECK(cudaSetDevice(1 << 20));
    ADD_FAILURE() << "cudaSetDevice(2^20) succeeded";
  } catch (const Error& e) {
    EXPECT_TRUE(dynamic_cast<const CudaError*>(&e)) << e.what();
    cudaGetLastError();
  }
  tg::cuda::set_device(0);
  try {
    add(random({2}, f32), random({2}, f32, kGpu));
    ADD_FAILURE() << "adding a CPU and a GPU tensor succeeded";
  } catch (const Error& e) {
    EXPECT_TRUE(dynamic_cast<const DeviceError*>(&e)) << e.what();
  }
}
