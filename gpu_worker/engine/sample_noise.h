// The random numbers of seeded sampling, shared by the host sampler and the CUDA kernel so both
// draw the same stream: a counter-based hash of (seed, position, token), no state, so a draw
// depends on nothing but those three (not on the batch, not on whether the prompt was cached).
// Compiles as plain C++ and, under nvcc, as host+device code.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define CASCADE_HD __host__ __device__ __forceinline__
#else
#define CASCADE_HD inline
#endif

namespace cascade::engine {

CASCADE_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in (0, 1) with 24 bits, never 0 or 1, for token `v` at `position` of stream `seed`.
CASCADE_HD float TokenUniform(uint64_t seed, int64_t position, int32_t v) {
  const uint64_t x =
      SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(position) * 0x100000001b3ULL +
                                   static_cast<uint64_t>(v)));
  return (static_cast<float>(x >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// One Gumbel-max draw term: logit / T + Gumbel noise. argmax over v of this is an exact sample
// of softmax(logits / T). Written with explicitly rounded operations so nvcc does not fuse them
// into an FMA the host compiler would not use.
CASCADE_HD float GumbelScore(float logit, float inv_temperature, float u) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(__fmul_rn(logit, inv_temperature), -logf(-logf(u)));
#else
  return logit * inv_temperature + -std::log(-std::log(u));
#endif
}

}  // namespace cascade::engine
