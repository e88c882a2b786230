#include "common/host.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "core/tensor_kernels.h"

namespace ex {

HostTensor HostTensor::of(const tg::Tensor& t) { return {t.shape(), t.to_vector<float>()}; }

std::vector<float> read_range(const tg::Tensor& t, int64_t offset, int64_t count) {
  TG_CHECK(t.dtype() == tg::DType::f32, "read_range: expected an f32 tensor, got ", tg::describe(t));
  TG_CHECK(offset >= 0 && count >= 0 && offset + count <= t.numel(), "read_range: [", offset, ", ",
           offset + count, ") is outside ", tg::describe(t));
  std::vector<float> out(static_cast<size_t>(count));
  const float* src = static_cast<const float*>(t.raw_data()) + offset;
  if (t.device().is_cpu()) {
    if (count > 0) std::memcpy(out.data(), src, out.size() * sizeof(float));
  } else {
#if TG_CUDA
    tg::cuda::copy_bytes(out.data(), tg::Device::cpu(), src, t.device(), out.size() * sizeof(float));
#else
    TG_FAIL("read_range: a GPU tensor in a build without CUDA");
#endif
  }
  return out;
}

std::vector<double> read_elements(const tg::Tensor& t, const std::vector<int64_t>& indices) {
  std::vector<double> out;
  out.reserve(indices.size());
  if (t.device().is_cpu()) {
    const float* p = t.data<float>();
    for (int64_t i : indices) out.push_back(p[i]);
    return out;
  }
  // One small copy per run of consecutive indices.
  for (size_t i = 0; i < indices.size();) {
    size_t j = i + 1;
    while (j < indices.size() && indices[j] == indices[j - 1] + 1) ++j;
    for (float v : read_range(t, indices[i], static_cast<int64_t>(j - i))) out.push_back(v);
    i = j;
  }
  return out;
}

std::vector<int64_t> sample_indices(int64_t numel, int64_t max_samples, uint64_t seed) {
  std::vector<int64_t> idx;
  if (numel <= max_samples) {
    for (int64_t i = 0; i < numel; ++i) idx.push_back(i);
    return idx;
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, numel - 1);
  idx.push_back(0);
  idx.push_back(numel - 1);
  while (static_cast<int64_t>(idx.size()) < max_samples) idx.push_back(pick(rng));
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  return idx;
}

Comparison compare(const std::vector<double>& got, const std::vector<double>& want) {
  TG_CHECK(got.size() == want.size(), "compare: ", got.size(), " values against ", want.size());
  Comparison c;
  c.count = static_cast<int64_t>(got.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) c.finite = false;
    double d = got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
    c.max_abs_error = std::max(c.max_abs_error, std::abs(d));
  }
  c.rel_error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (!c.finite) c.rel_error = INFINITY;
  return c;
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  int64_t workers = std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), n));
  if (workers == 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    int64_t begin = n * w / workers, end = n * (w + 1) / workers;
    threads.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  for (auto& t : threads) t.join();
}

}  // namespace ex
