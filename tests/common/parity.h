// Parity with PyTorch, shared by tests/cpu/test_parity.cpp and tests/cuda/test_parity_cuda.cpp.
//
// tests/data/make_parity.py (run with PyTorch) writes, for each model X of A, B, C, D, CNN:
//   parity_X_model.safetensors  the model's state_dict (F32), as safetensors.torch.save_file writes it
//   parity_X_data.safetensors   "input" (F32), "grad_output" (F32, the seed gradient of the
//                               output) or "target" (I64, for the CNN's cross-entropy), and
//                               PyTorch's float64 results: "output", "grad.input" and
//                               "grad.<parameter name>" for every parameter (F64)
// Here the same model is built with tapegrad's modules (same names), loaded from the model
// file with tg::load, run forward and backward, and every result compared with PyTorch's.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"

namespace tg::test::parity {

// tests/data next to this file's tests/common, or $TG_PARITY_DIR.
inline std::string data_dir() {
  if (const char* env = std::getenv("TG_PARITY_DIR")) return env;
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "data").string();
}
inline std::string model_file(const std::string& id) { return data_dir() + "/parity_" + id + "_model.safetensors"; }
inline std::string data_file(const std::string& id) { return data_dir() + "/parity_" + id + "_data.safetensors"; }

#define TG_REQUIRE_PARITY_DATA(id)                                                                        \
  do {                                                                                                    \
    if (!std::filesystem::exists(::tg::test::parity::model_file(id)) ||                                  \
        !std::filesystem::exists(::tg::test::parity::data_file(id)))                                     \
      GTEST_SKIP() << "no PyTorch reference data " << ::tg::test::parity::data_file(id)                  \
                   << "; generate it from the repo root with: python3 tests/data/make_parity.py --out tests/data"; \
  } while (0)

using TensorMap = std::map<std::string, Tensor>;

inline TensorMap load_map(const std::string& path) {
  TensorMap m;
  for (auto& [name, t] : safetensors::load_file(path)) m[name] = t;
  return m;
}

inline const Tensor& get(const TensorMap& m, const std::string& name) {
  auto it = m.find(name);
  if (it == m.end()) throw Error("parity data lacks tensor '" + name + "'");
  return it->second;
}

// The models, built exactly as make_parity.py builds them (names included).
struct ModelSpec {
  std::string id;
  std::function<std::shared_ptr<nn::Module>()> make;
  // Our forward pass from the model and its (already moved) input; CNN adds the loss.
  std::function<Tensor(nn::Module&, const Tensor& x, const TensorMap& data, Device, DType)> forward;
  // Maps PyTorch's NCHW tensors to ours and back (B's NHWC variant); identity otherwise.
  std::vector<int64_t> to_ours;  // permutation applied to input, output, grad_output, grad.input
};

inline Tensor maybe_permute(const Tensor& t, const std::vector<int64_t>& perm) {
  return perm.empty() ? t : t.permute(perm);
}

inline std::vector<ModelSpec> model_specs() {
  auto plain = [](nn::Module& m, const Tensor& x, const TensorMap&, Device, DType) { return m(x); };
  std::vector<ModelSpec> specs;
  specs.push_back({"A",
                   [] {
                     return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{
                         .in_channels = 4, .out_channels = 6, .kernel_size = {3, 3}, .bias = false});
                   },
                   plain, {}});
  specs.push_back({"B",
                   [] {
                     return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{
                         .in_channels = 5, .out_channels = 7, .kernel_size = {1, 1}, .bias = false});
                   },
                   plain, {}});
  // B again, channels-last: PyTorch's NCHW tensors permuted to (N, H, W, C).
  specs.push_back({"B",
                   [] {
                     return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = 5,
                                                                           .out_channels = 7,
                                                                           .kernel_size = {1, 1},
                                                                           .bias = false,
                                                                           .layout = Layout::NHWC});
                   },
                   plain, {0, 2, 3, 1}});
  specs.push_back({"C",
                   [] {
                     auto m = std::make_shared<nn::Sequential>();
                     m->add(std::make_shared<nn::Conv3d>(nn::Conv3dOptions{
                         .in_channels = 3, .out_channels = 6, .kernel_size = 3}));
                     m->add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 3, .num_channels = 6}));
                     return m;
                   },
                   [](nn::Module& m, const Tensor& x, const TensorMap&, Device, DType) {
                     return mean(m(x), {1, 2, 3, 4});
                   },
                   {}});
  specs.push_back({"D",
                   [] {
                     return std::make_shared<nn::Linear>(
                         nn::LinearOptions{.in_features = 517, .out_features = 1, .bias = false});
                   },
                   plain, {}});
  specs.push_back({"CNN",
                   [] {
                     auto m = std::make_shared<nn::Sequential>();
                     m->add(std::make_shared<nn::Conv2d>(
                         nn::Conv2dOptions{.in_channels = 3, .out_channels = 8, .kernel_size = {3, 3}, .padding = {1}}));
                     m->add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 4, .num_channels = 8}));
                     m->add(std::make_shared<nn::ReLU>());
                     m->add(std::make_shared<nn::Conv2d>(
                         nn::Conv2dOptions{.in_channels = 8, .out_channels = 8, .kernel_size = {3, 3}, .padding = {1}}));
                     m->add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 4, .num_channels = 8}));
                     m->add(std::make_shared<nn::ReLU>());
                     m->add(std::make_shared<nn::MeanPool>());
                     m->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 8, .out_features = 5}));
                     return m;
                   },
                   [](nn::Module& m, const Tensor& x, const TensorMap& data, Device d, DType) {
                     return cross_entropy(m(x), get(data, "target").to(d));
                   },
                   {}});
  return specs;
}

// Runs one model on `device` in `dtype` with the weights of its PyTorch file and checks the
// output and every gradient against PyTorch's f64 results (relative L2 <= tol).
// The weights are loaded after the module is moved: tg::load copies into the parameters'
// device. For f64, the F32 file is loaded first and the module cast afterwards.
inline void check_model(const ModelSpec& spec, Device device, DType dtype, double tol) {
  TensorMap data = load_map(data_file(spec.id));
  std::shared_ptr<nn::Module> model = spec.make();
  if (dtype == DType::f32) {
    model->to(device);
    load(*model, model_file(spec.id));
  } else {
    load(*model, model_file(spec.id));
    model->to(dtype);
    model->to(device);
  }
  for (const Tensor& p : model->parameters()) EXPECT_EQ(p.device(), device);
  const auto& perm = spec.to_ours;
  Tensor x = maybe_permute(get(data, "input"), perm).to(dtype).to(device).clone().requires_grad_();
  Tensor y;
  {
    Tape tape;
    y = spec.forward(*model, x, data, device, dtype);
    if (data.count("grad_output")) {
      Tensor seed = maybe_permute(get(data, "grad_output"), perm).to(dtype).to(device);
      tape.backward(y, seed);
    } else {
      tape.backward(y);
    }
  }
  const std::string where = spec.id + (perm.empty() ? "" : " (NHWC)") + " on " + device.str() + " in " + dtype_name(dtype);
  const bool verbose = std::getenv("TG_PARITY_VERBOSE") != nullptr;  // prints every error
  auto report = [&](double err, const std::string& what) {
    if (verbose) std::printf("parity %-28s %-22s rel_l2 %.2e (tolerance %.0e)\n", where.c_str(), what.c_str(), err, tol);
    EXPECT_LE(err, tol) << where << ": " << what;
  };
  auto expect_close = [&](const Tensor& ours, const Tensor& ref, const std::string& what) {
    ASSERT_TRUE(ours.defined()) << where << ": no " << what;
    EXPECT_EQ(ours.device(), device) << where << ": " << what;
    Tensor theirs = maybe_permute(ref, perm);
    ASSERT_EQ(ours.shape(), theirs.shape()) << where << ": " << what;
    report(rel_l2(ours, theirs), what);
  };
  expect_close(y, get(data, "output"), "output");
  expect_close(x.grad(), get(data, "grad.input"), "grad of the input");
  for (const auto& [name, p] : model->named_parameters()) {
    Tensor ref = get(data, "grad." + name);
    ASSERT_EQ(p.grad().defined() ? p.grad().shape() : Shape{}, ref.shape()) << where << ": grad." << name;
    report(rel_l2(p.grad(), ref), "grad of " + name);
  }
  // Every parameter gradient PyTorch computed was compared (none was left out by name).
  size_t ref_grads = 0;
  for (const auto& [name, t] : data) ref_grads += name.rfind("grad.", 0) == 0 && name != "grad.input";
  EXPECT_EQ(ref_grads, model->named_parameters().size()) << where;
}

}  // namespace tg::test::parity
