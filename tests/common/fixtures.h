// Helpers shared by the checkpoint and parity tests (CPU and CUDA): a scratch directory,
// a byte-exact tensor comparison and the small seeded CNN whose state they save and load.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace tg::test {

// A fresh directory per test, named <prefix><pid>_<n>, removed afterwards (even when a test
// left it read-only).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tapegrad_test_") {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            (prefix + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::filesystem::path path_;
};

// Same shape, dtype and bytes (on any device).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  if (a.nbytes() == 0) return true;  // empty buffers may be null: nothing to compare
  Tensor ha = a.cpu(), hb = b.cpu();
  return std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

// conv -> group norm -> relu -> mean pool -> linear: every layer kind with parameters.
inline std::shared_ptr<nn::Sequential> small_cnn(uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Conv2d>(
      nn::Conv2dOptions{.in_channels = 3, .out_channels = 6, .kernel_size = 3, .padding = {1}}));
  auto gn = m->add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 3, .num_channels = 6}));
  m->add(std::make_shared<nn::ReLU>());
  m->add(std::make_shared<nn::MeanPool>());
  m->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 6, .out_features = 5}));
  // Perturb gamma and beta so they are not the 1 / 0 every fresh model shares.
  gn->weight.copy_(uniform({6}, 0.5, 1.5));
  gn->bias.copy_(uniform({6}, -0.5, 0.5));
  return m;
}

}  // namespace tg::test
