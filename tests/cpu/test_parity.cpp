// Parity with PyTorch on the CPU: the small versions of workloads A-D and the CNN, with
// PyTorch's weights loaded through tg::load, must reproduce PyTorch's float64 outputs and
// every gradient (relative L2 <= 1e-5 in f32, <= 1e-10 in f64). The reference files come
// from tests/data/make_parity.py; without them these tests skip, naming the script.
// One test needs no PyTorch: it checks that our f32 results are within the f32 tolerance
// of our own f64 results on the same models, so the tolerance itself is attainable.

#include <cstring>

#include "common/fixtures.h"
#include "common/parity.h"

using namespace tg;
using namespace tg::test;
using namespace tg::test::parity;

namespace {

constexpr double kF32Tolerance = 1e-5;
constexpr double kF64Tolerance = 1e-10;

void run(const std::string& id, DType dtype, double tol) {
  for (const ModelSpec& spec : model_specs())
    if (spec.id == id) check_model(spec, Device::cpu(), dtype, tol);
}

}  // namespace

TEST(Parity, WorkloadA) {
  TG_REQUIRE_PARITY_DATA("A");
  run("A", f32, kF32Tolerance);
  run("A", f64, kF64Tolerance);
}

TEST(Parity, WorkloadB) {  // NCHW, and NHWC as the permuted NCHW problem
  TG_REQUIRE_PARITY_DATA("B");
  run("B", f32, kF32Tolerance);
  run("B", f64, kF64Tolerance);
}

TEST(Parity, WorkloadC) {
  TG_REQUIRE_PARITY_DATA("C");
  run("C", f32, kF32Tolerance);
  run("C", f64, kF64Tolerance);
}

TEST(Parity, WorkloadD) {
  TG_REQUIRE_PARITY_DATA("D");
  run("D", f32, kF32Tolerance);
  run("D", f64, kF64Tolerance);
}

TEST(Parity, Cnn) {
  TG_REQUIRE_PARITY_DATA("CNN");
  run("CNN", f32, kF32Tolerance);
  run("CNN", f64, kF64Tolerance);
}

// PyTorch's files load into our modules and come back out of tg::save with the same names,
// dtypes, shapes and bytes. With $TG_PARITY_ROUNDTRIP_DIR set, our files are also left
// there, for `make_parity.py --check-roundtrip DIR` to load with safetensors.torch.
TEST(Parity, PyTorchFilesRoundTripThroughOurSave) {
  TG_REQUIRE_PARITY_DATA("CNN");
  TempDir dir;
  const char* keep = std::getenv("TG_PARITY_ROUNDTRIP_DIR");
  for (const ModelSpec& spec : model_specs()) {
    if (!spec.to_ours.empty()) continue;  // B's NHWC variant has B's file
    auto model = spec.make();
    load(*model, model_file(spec.id));
    std::string ours = keep ? std::string(keep) + "/parity_" + spec.id + "_model.safetensors" : dir.file(spec.id);
    if (keep) std::filesystem::create_directories(keep);
    save(*model, ours);
    safetensors::NamedTensors theirs = safetensors::load_file(model_file(spec.id));
    TensorMap mine = load_map(ours);
    EXPECT_EQ(mine.size(), theirs.size()) << spec.id;
    for (const auto& [name, t] : theirs) {
      ASSERT_TRUE(mine.count(name)) << spec.id << ": " << name << " was not saved";
      const Tensor& m = mine[name];
      EXPECT_EQ(m.dtype(), t.dtype()) << name;
      ASSERT_EQ(m.shape(), t.shape()) << name;
      if (t.nbytes() > 0) {
        EXPECT_EQ(std::memcmp(m.raw_data(), t.raw_data(), t.nbytes()), 0) << spec.id << ": " << name << " differs";
      }
    }
  }
}

// Without PyTorch: our f32 results against our f64 results on the same weights and inputs
// (the f64 run stands in for PyTorch's reference: it tells whether 1e-5 is attainable).
TEST(Parity, F32IsWithinToleranceOfF64) {
  TempDir dir;
  for (const ModelSpec& spec : model_specs()) {
    manual_seed(17);
    auto m32 = spec.make();
    // Default init for conv/linear weights; random gamma (1-D weights) and biases.
    for (auto& [name, slot] : m32->named_parameter_slots()) {
      if (slot->dim() == 1 && name.ends_with("weight")) slot->copy_(uniform(slot->shape(), 0.5, 1.5));
      if (name.ends_with("bias")) slot->copy_(uniform(slot->shape(), -0.5, 0.5));
    }
    save(*m32, dir.file("w"));
    auto m64 = spec.make();
    load(*m64, dir.file("w"));
    m64->to(f64);

    // Inputs shaped as make_parity.py shapes them (NCHW; the NHWC spec permutes).
    Shape in_shape = spec.id == "A"   ? Shape{2, 4, 9, 11}
                     : spec.id == "B" ? Shape{2, 5, 6, 9}
                     : spec.id == "C" ? Shape{2, 3, 5, 6, 7}
                     : spec.id == "D" ? Shape{33, 517}
                                      : Shape{4, 3, 9, 11};
    TensorMap data;
    data["target"] = from_vector(std::vector<int64_t>{1, 4, 0, 2}, {4});
    Tensor x = maybe_permute(uniform(in_shape, -1, 1), spec.to_ours);
    Tensor x32 = x.clone().requires_grad_(), x64 = x.to(f64).requires_grad_();
    Tensor y32, y64, seed;
    {
      Tape tape;
      y32 = spec.forward(*m32, x32, data, Device::cpu(), f32);
      seed = uniform(y32.shape(), -1, 1);
      tape.backward(y32, seed);
    }
    {
      Tape tape;
      y64 = spec.forward(*m64, x64, data, Device::cpu(), f64);
      tape.backward(y64, seed.to(f64));
    }
    const std::string where = spec.id + (spec.to_ours.empty() ? "" : " (NHWC)");
    EXPECT_LE(rel_l2(y32, y64), kF32Tolerance) << where << ": output";
    EXPECT_LE(rel_l2(x32.grad(), x64.grad()), kF32Tolerance) << where << ": grad of the input";
    auto p32 = m32->named_parameters(), p64 = m64->named_parameters();
    ASSERT_EQ(p32.size(), p64.size());
    for (size_t i = 0; i < p32.size(); ++i) {
      double err = rel_l2(p32[i].second.grad(), p64[i].second.grad());
      EXPECT_LE(err, kF32Tolerance) << where << ": grad of " << p32[i].first;
    }
  }
}
