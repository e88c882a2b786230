// Out of GPU memory: an allocation past the card raises tg::OutOfMemory with the size asked,
// and the allocator stays usable: after freeing, allocations and kernels work and give
// correct results. Also the pool's retry: memory the pool cached from freed tensors is
// released (trimmed) when a request needs it, instead of failing.
#include <cuda_runtime.h>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

constexpr std::size_t kGiB = std::size_t(1) << 30;

std::size_t total_memory() {
  std::size_t free_bytes = 0, total_bytes = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  return total_bytes;
}

// A float tensor of exactly `bytes` bytes on the GPU (bytes is a multiple of 4).
Tensor gpu_bytes(std::size_t bytes) {
  return Tensor::empty({static_cast<int64_t>(bytes / 4)}, {.device = Device::cuda()});
}

// After an OOM: a small matmul on the GPU agrees with the CPU.
void expect_gpu_computes_correctly() {
  manual_seed(5);
  Tensor a = random({37, 29}, f32), b = random({29, 13}, f32);
  Tensor c = matmul(a.cuda(), b.cuda());
  synchronize(Device::cuda());
  EXPECT_LE(rel_l2(c, matmul(a, b)), 1e-5);
  Tensor filled = full({1000}, 3.0, {.device = Device::cuda()});
  EXPECT_DOUBLE_EQ(sum(filled).item(), 3000.0);
}

}  // namespace

TEST(OomCuda, TwiceTheCardRaisesOutOfMemoryAndRecovers) {
  TG_REQUIRE_GPU();
  const std::size_t total = total_memory();
  const std::size_t ask = total * 2 / 4 * 4;
  const std::size_t in_use_before = memory_stats(Device::cuda()).in_use;
  try {
    Tensor t = gpu_bytes(ask);
    ADD_FAILURE() << "allocating " << ask << " bytes on a " << total << "-byte card succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes, ask);
    EXPECT_EQ(e.bytes_in_use, in_use_before);
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(ask)), std::string::npos) << e.what();
  }
  EXPECT_EQ(memory_stats(Device::cuda()).in_use, in_use_before) << "a failed allocation is not counted";
  expect_gpu_computes_correctly();
  // OutOfMemory is a tg::Error: code that catches Error sees it too.
  EXPECT_THROW(gpu_bytes(ask), Error);
}

TEST(OomCuda, FillingTheCardIn8GiBChunksThenFreeing) {
  TG_REQUIRE_GPU();
  const std::size_t chunk = 8 * kGiB;
  const std::size_t in_use_before = memory_stats(Device::cuda()).in_use;
  std::vector<Tensor> chunks;
  bool hit_oom = false;
  for (int i = 0; i < 64 && !hit_oom; ++i) {  // 64 x 8 GiB is past any current card
    try {
      chunks.push_back(gpu_bytes(chunk));
      chunks.back().fill_(1.0);  // touch it: the memory is real
    } catch (const OutOfMemory& e) {
      hit_oom = true;
      EXPECT_EQ(e.requested_bytes, chunk);
      EXPECT_EQ(e.bytes_in_use, in_use_before + chunks.size() * chunk);
    }
  }
  ASSERT_TRUE(hit_oom) << "64 chunks of 8 GiB fit on this card";
  synchronize(Device::cuda());
  const std::size_t held = chunks.size();
  chunks.clear();  // back to the pool, which keeps it cached
  EXPECT_EQ(memory_stats(Device::cuda()).in_use, in_use_before);
  expect_gpu_computes_correctly();

  if (held >= 2) {
    // Twice a chunk: the pool caches `held` separate 8 GiB blocks and the driver has less
    // than 8 GiB left. The request must succeed (the allocator trims the pool and retries)
    // rather than fail with memory that only the cache holds.
    Tensor big;
    EXPECT_NO_THROW(big = gpu_bytes(2 * chunk));
    if (big.defined()) {
      big.fill_(2.0);
      synchronize(Device::cuda());
    }
  }
  // The chunks fit again, as many as before.
  for (std::size_t i = 0; i < held; ++i) EXPECT_NO_THROW(chunks.push_back(gpu_bytes(chunk))) << "chunk " << i;
  chunks.clear();
  expect_gpu_computes_correctly();
}
