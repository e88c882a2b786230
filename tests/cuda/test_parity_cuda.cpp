// Parity with PyTorch on the GPU (f32, relative L2 <= 1e-5 against PyTorch's float64
// results), with the weights loaded by tg::load straight into GPU parameters; and the
// checkpoint and anomaly features on GPU tensors.

#include <limits>

#include "autograd/anomaly.h"
#include "common/fixtures.h"
#include "common/parity.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::parity;

namespace {

constexpr double kF32Tolerance = 1e-5;

void run(const std::string& id) {
  for (const ModelSpec& spec : model_specs())
    if (spec.id == id) check_model(spec, Device::cuda(), f32, kF32Tolerance);
}

}  // namespace

TEST(ParityCuda, WorkloadA) {
  TG_REQUIRE_GPU();
  TG_REQUIRE_PARITY_DATA("A");
  run("A");
}

TEST(ParityCuda, WorkloadB) {
  TG_REQUIRE_GPU();
  TG_REQUIRE_PARITY_DATA("B");
  run("B");
}

TEST(ParityCuda, WorkloadC) {
  TG_REQUIRE_GPU();
  TG_REQUIRE_PARITY_DATA("C");
  run("C");
}

TEST(ParityCuda, WorkloadD) {
  TG_REQUIRE_GPU();
  TG_REQUIRE_PARITY_DATA("D");
  run("D");
}

TEST(ParityCuda, Cnn) {
  TG_REQUIRE_GPU();
  TG_REQUIRE_PARITY_DATA("CNN");
  run("CNN");
}

// ---- checkpoints of GPU modules ---------------------------------------------------------

TEST(CheckpointCuda, LoadCopiesIntoTheParametersDevice) {
  TG_REQUIRE_GPU();
  TempDir dir;
  auto cpu_model = small_cnn(1);
  save(*cpu_model, dir.file("m.safetensors"));
  auto gpu_model = small_cnn(2);
  gpu_model->to(Device::cuda());
  std::vector<Tensor> handles = gpu_model->parameters();
  load(*gpu_model, dir.file("m.safetensors"));
  auto a = cpu_model->named_parameters(), b = gpu_model->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].second.device(), Device::cuda()) << b[i].first;
    EXPECT_TRUE(b[i].second.same(handles[i])) << "load must write into the existing GPU tensors";
    EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << a[i].first;
  }
  // And back: a GPU model's file loads into a CPU model.
  save(*gpu_model, dir.file("g.safetensors"));
  auto again = small_cnn(3);
  load(*again, dir.file("g.safetensors"));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bitwise_equal(a[i].second, again->parameters()[i]));
}

TEST(CheckpointCuda, BadFileLeavesTheGpuModuleUnchanged) {
  TG_REQUIRE_GPU();
  TempDir dir;
  auto ref = small_cnn(1);
  safetensors::NamedTensors bad = ref->named_parameters();
  bad.back().second = ones({7});  // 4.bias should be (5)
  safetensors::save_file(bad, dir.file("bad.safetensors"));
  auto gpu_model = small_cnn(2);
  gpu_model->to(Device::cuda());
  std::vector<Tensor> before;
  for (const Tensor& p : gpu_model->parameters()) before.push_back(p.clone());
  TG_EXPECT_ERROR(load(*gpu_model, dir.file("bad.safetensors")), "tensor '4.bias' has shape [7]", "f32[5] on cuda:0");
  auto after = gpu_model->parameters();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(bitwise_equal(after[i], before[i])) << i;
}

// Train 3 steps on the GPU, save, train 3 more; a fresh GPU model and optimizer loaded
// from the checkpoint reproduce the same losses bit for bit (the kernels are deterministic).
TEST(CheckpointCuda, AdamResumesBitIdenticallyOnTheGpu) {
  TG_REQUIRE_GPU();
  TempDir dir;
  manual_seed(11);
  Tensor x = randn({4, 3, 7, 9}).cuda();
  Tensor y = from_vector(std::vector<int64_t>{0, 3, 4, 1}, {4}).cuda();
  auto train = [&](nn::Module& model, nn::Optimizer& opt, int steps) {
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      Tape tape;
      Tensor loss = cross_entropy(model(x), y);
      losses.push_back(loss.item());
      tape.backward(loss);
      opt.step();
      opt.zero_grad();
    }
    return losses;
  };
  auto model = small_cnn(1);
  model->to(Device::cuda());
  nn::Adam opt(model->parameters(), {.lr = 0.01});
  train(*model, opt, 3);
  save(*model, opt, dir.file("c.safetensors"));
  std::vector<double> expected = train(*model, opt, 3);

  auto fresh = small_cnn(99);
  fresh->to(Device::cuda());
  nn::Adam fresh_opt(fresh->parameters(), {.lr = 0.01});
  load(*fresh, fresh_opt, dir.file("c.safetensors"));
  std::vector<double> resumed = train(*fresh, fresh_opt, 3);
  ASSERT_EQ(resumed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(resumed[i], expected[i]) << "step " << i + 3;
  for (const auto& [name, buffer] : fresh_opt.state()) {
    if (!name.ends_with(".step")) {
      EXPECT_EQ(buffer.device(), Device::cuda()) << name;
    }
  }
}

// ---- anomaly mode on GPU tensors --------------------------------------------------------

TEST(AnomalyCuda, ForwardAndBackwardNameTheOp) {
  TG_REQUIRE_GPU();
  DetectAnomalyGuard on;
  Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).cuda().requires_grad_();
  Tensor b = from_vector(std::vector<float>{1, 0, 2}, {3}).cuda();
  {
    Tape tape;
    TG_EXPECT_ERROR(div(a, b), "anomaly: forward of 'div' produced NaN/Inf in output 0 f32[2, 3] on cuda:0",
                    "element 1 is inf");
  }
  Tensor p = from_vector(std::vector<float>{1e30f, 1.f}, {2}).cuda().requires_grad_();
  Tensor q = from_vector(std::vector<float>{1e-5f, 2.f}, {2}).cuda().requires_grad_();
  Tape tape;
  Tensor loss = sum(div(p, q));
  TG_EXPECT_ERROR(tape.backward(loss), "anomaly: backward of 'div' produced NaN/Inf in the gradient of input 1",
                  "on cuda:0");
  EXPECT_EQ(first_non_finite(full({5}, std::numeric_limits<double>::quiet_NaN(), {.device = Device::cuda()})), 0);
}
