// Counter-based random numbers: element i of a draw is a pure function of (seed, offset + i),
// so the CPU and the GPU produce the same numbers, every run, in any order.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define TG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TG_HOST_DEVICE inline
#endif

namespace tg {

// splitmix64 finalizer: a cheap bijective mixer with good avalanche.
TG_HOST_DEVICE uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
TG_HOST_DEVICE double uniform_at(uint64_t seed, uint64_t index) {
  return static_cast<double>(mix64(mix64(seed) ^ index) >> 11) * (1.0 / 9007199254740992.0);
}

// shift + scale * u rounded as written, twice: the CUDA compiler would otherwise fuse it into
// one fma, rounded once, and a draw could differ from the CPU's in its last bit.
TG_HOST_DEVICE double scaled_draw(double shift, double scale, double u) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(shift, __dmul_rn(scale, u));
#else
  return shift + scale * u;
#endif
}

// Standard normal by Box-Muller on two independent uniforms of this element. The GPU uses its
// own log and cospi: the same numbers as the CPU to a few ulps, not always the same bits.
TG_HOST_DEVICE double normal_at(uint64_t seed, uint64_t index) {
  double u1 = uniform_at(seed, 2 * index);
  double u2 = uniform_at(seed, 2 * index + 1);
  if (u1 < 1e-300) u1 = 1e-300;
#if defined(__CUDA_ARCH__)
  return sqrt(-2.0 * log(u1)) * cospi(2.0 * u2);
#else
  return __builtin_sqrt(-2.0 * __builtin_log(u1)) * __builtin_cos(6.283185307179586 * u2);
#endif
}

// The process-wide generator: a seed and a running offset, so that consecutive draws
// differ and a program that seeds once is reproducible.
void manual_seed(uint64_t seed);
// Reserves n consecutive counters; returns {seed, first offset}.
struct RandomDraw {
  uint64_t seed;
  uint64_t offset;
};
RandomDraw next_random_draw(uint64_t n);

// A draw captured into a CUDA graph (core/cuda_graph.h) cannot keep the offset it had at
// capture: every replay would reuse it. Its kernel reads how far its counters moved instead:
// offset + replay[0] * span[0], with both in graph-owned device memory (replay = the launch
// index, span = the counters its stream used per step). Both null outside a graph.
struct ReplayShift {
  const uint64_t* replay = nullptr;
  const uint64_t* span = nullptr;
};
TG_HOST_DEVICE uint64_t shifted_offset(uint64_t offset, ReplayShift s) {
  return s.replay ? offset + *s.replay * *s.span : offset;
}

}  // namespace tg
