// FastDivmod (ops/cuda/arch/fast_divmod.h) is exact for every numerator below 2^31: the
// engine's index decompositions depend on it. Checked here on the host path, which computes
// the same multiply-high as the device's __umulhi.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "ops/cuda/arch/fast_divmod.h"

using tg::cuda::FastDivmod;

namespace {

void expect_exact(uint32_t d, uint32_t n) {
  const FastDivmod f(d);
  uint32_t q, r;
  f.divmod(n, q, r);
  ASSERT_EQ(q, n / d) << n << " / " << d;
  ASSERT_EQ(r, n % d) << n << " % " << d;
}

TEST(FastDivmod, ExactForSmallDivisorsAndNumerators) {
  for (uint32_t d = 1; d <= 300; ++d)
    for (uint32_t n = 0; n <= 5000; ++n) expect_exact(d, n);
}

TEST(FastDivmod, ExactNearTheLimits) {
  std::mt19937 rng(12345);
  const uint32_t kLimit = (uint32_t{1} << 31) - 1;
  const uint32_t divisors[] = {1, 2, 3, 7, 9, 25, 27, 49, 343, 1000, 4096, 12544, 65535, 65537, 1u << 20,
                               (1u << 20) + 1, 1u << 30, kLimit - 1, kLimit};
  for (uint32_t d : divisors) {
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, kLimit - 1, kLimit}) expect_exact(d, n);
    for (int i = 0; i < 20000; ++i) expect_exact(d, rng() & kLimit);
  }
  for (int i = 0; i < 200000; ++i) expect_exact(1 + rng() % kLimit, rng() & kLimit);
}

}  // namespace
