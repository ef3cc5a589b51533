// Exactly reproducible arithmetic for sampling, shared by the host sampler and the CUDA kernel:
// the counter-based random stream (a hash of (seed, position, token), no state), and ln / exp
// built only from correctly rounded IEEE operations (add, multiply, fused multiply-add, divide,
// frexp, floor), so the host and the device compute every value bit for bit alike (libm's logf
// and CUDA's logf may differ by an ulp; an FMA the compiler fuses where the code multiplies and
// adds rounds once instead of twice). Compiles as plain C++ and, under nvcc, as host+device code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define CASCADE_HD __host__ __device__ __forceinline__
#else
#define CASCADE_HD inline
#endif

namespace cascade::engine {

// ---- Correctly rounded operations that no compiler contracts into an FMA ----------------------
// Host code: x86-64 without FMA cannot fuse; where the target has FMA (__FP_FAST_FMAF), the
// product goes through a volatile so GCC's default -ffp-contract=fast cannot fuse it either.
CASCADE_HD float AddF(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
CASCADE_HD float MulF(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#elif defined(__FP_FAST_FMAF)
  volatile float p = a * b;
  return p;
#else
  return a * b;
#endif
}
CASCADE_HD float DivF(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// a * b + c rounded once (IEEE fusedMultiplyAdd on both sides: glibc's fmaf is exact with or
// without the instruction).
CASCADE_HD float FmaF(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fmaf(a, b, c);
#endif
}
CASCADE_HD double AddD(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
CASCADE_HD double MulD(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#elif defined(__FP_FAST_FMA)
  volatile double p = a * b;
  return p;
#else
  return a * b;
#endif
}
CASCADE_HD double DivD(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
CASCADE_HD double U64ToD(uint64_t x) {
#ifdef __CUDA_ARCH__
  return __ull2double_rn(x);
#else
  return static_cast<double>(x);
#endif
}
CASCADE_HD float DToF(double x) {
#ifdef __CUDA_ARCH__
  return __double2float_rn(x);
#else
  return static_cast<float>(x);
#endif
}
CASCADE_HD float FrexpF(float x, int* e) {
#ifdef __CUDA_ARCH__
  return frexpf(x, e);
#else
  return std::frexp(x, e);
#endif
}
CASCADE_HD double FrexpD(double x, int* e) {
#ifdef __CUDA_ARCH__
  return frexp(x, e);
#else
  return std::frexp(x, e);
#endif
}
CASCADE_HD float FloorF(float x) {
#ifdef __CUDA_ARCH__
  return floorf(x);
#else
  return std::floor(x);
#endif
}

// ---- ln and exp from those operations ---------------------------------------------------------

// Natural log of a finite x > 0, within a few float ulps: x = 2^e * m with m in [sqrt(.5),
// sqrt(2)), ln m = 2 atanh(t), t = (m - 1) / (m + 1) (|t| <= 0.172), by its series to t^9
// (the rest is below 1e-9).
CASCADE_HD float DetLn(float x) {
  int e = 0;
  float m = FrexpF(x, &e);  // [0.5, 1)
  if (m < 0.70710678f) {
    m = MulF(m, 2.0f);  // exact
    e -= 1;
  }
  const float t = DivF(AddF(m, -1.0f), AddF(m, 1.0f));
  const float t2 = MulF(t, t);
  float p = 1.0f / 9.0f;
  p = AddF(MulF(p, t2), 1.0f / 7.0f);
  p = AddF(MulF(p, t2), 1.0f / 5.0f);
  p = AddF(MulF(p, t2), 1.0f / 3.0f);
  const float two_t = MulF(2.0f, t);  // exact
  const float ln_m = AddF(two_t, MulF(MulF(two_t, t2), p));
  return AddF(MulF(static_cast<float>(e), 0.693147182f), ln_m);
}

// The same in double (series to t^25), for log-sum-exp.
CASCADE_HD double DetLnD(double x) {
  int e = 0;
  double m = FrexpD(x, &e);
  if (m < 0.7071067811865476) {
    m = MulD(m, 2.0);
    e -= 1;
  }
  const double t = DivD(AddD(m, -1.0), AddD(m, 1.0));
  const double t2 = MulD(t, t);
  double p = 1.0 / 25.0;
  for (int k = 23; k >= 3; k -= 2) p = AddD(MulD(p, t2), DivD(1.0, static_cast<double>(k)));
  const double two_t = MulD(2.0, t);
  const double ln_m = AddD(two_t, MulD(MulD(two_t, t2), p));
  return AddD(MulD(static_cast<double>(e), 0.6931471805599453), ln_m);
}

// Fixed point weight of a log-probability difference d <= 0 (natural log units):
// round-down(2^40 * e^d) up to the polynomial's ~1e-7 relative error; 0 below e^-28 (2^-41),
// exactly 2^40 at d = 0. An integer, so sums of weights are exact and order-independent.
constexpr int kWeightBits = 40;
// Written without branches (the weight of x < -41 is computed on 0 and then dropped) so that a
// GPU thread can interleave several of them; integer steps in 32 bits where the value fits.
CASCADE_HD uint64_t FixedWeight(float d) {
  const float x0 = MulF(d, 1.44269504f);  // log2(e)
  const bool live = x0 >= -41.0f;         // false for NaN too
  const float x = live ? x0 : 0.0f;
  const float n = FloorF(x);    // [-41, 0]
  const float f = AddF(x, -n);  // [0, 1), exact
  // 2^f = sum (f ln 2)^k / k!, k <= 9 (truncation < 1e-8), by Horner's rule in fused steps.
  float p = 1.01780860e-07f;
  p = FmaF(p, f, 1.32154868e-06f);
  p = FmaF(p, f, 1.52527338e-05f);
  p = FmaF(p, f, 0.000154035304f);
  p = FmaF(p, f, 0.00133335581f);
  p = FmaF(p, f, 0.00961812911f);
  p = FmaF(p, f, 0.0555041087f);
  p = FmaF(p, f, 0.240226507f);
  p = FmaF(p, f, 0.693147181f);
  p = FmaF(p, f, 1.0f);
  const uint32_t q = static_cast<uint32_t>(MulF(p, 8388608.0f));  // p in [1, 2]: < 2^25
  const int shift = static_cast<int>(n) + (kWeightBits - 23);     // [-24, 17]
  const uint64_t w = shift >= 0 ? uint64_t{q} << shift : uint64_t{q >> -shift};
  return live ? w : 0;
}

// ---- The random stream ------------------------------------------------------------------------

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;  // SplitMix64's increment

// SplitMix64's output function: a bijective 64-bit mix.
CASCADE_HD uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
CASCADE_HD uint64_t SplitMix64(uint64_t x) { return Mix64(x + kGolden); }

// The j-th of the 2^24 values TokenUniform gives, j in [0, 2^24).
CASCADE_HD float UniformOf(uint32_t j) {
  return (static_cast<float>(j) + 0.5f) * (1.0f / 16777216.0f);
}

// Where the stream of the token at `position` of seed `seed` starts (a hash of both).
CASCADE_HD uint64_t StreamStart(uint64_t seed, int64_t position) {
  return SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(position) * 0x100000001b3ULL));
}

// Uniform in (0, 1) with 24 bits, never 0 or 1, for vocabulary entry v: value v + 1 of the
// SplitMix64 generator started at `start` (one mix per entry; the start is per row), its top 24
// bits j (TokenBitsAt) made UniformOf(j) (TokenUniformAt).
CASCADE_HD uint32_t TokenBitsAt(uint64_t start, int32_t v) {
  const uint64_t x = Mix64(start + (static_cast<uint64_t>(static_cast<uint32_t>(v)) + 1) * kGolden);
  return static_cast<uint32_t>(x >> 40);
}
CASCADE_HD float TokenUniformAt(uint64_t start, int32_t v) {
  return UniformOf(TokenBitsAt(start, v));
}

// The same for token `v` at `position` of stream `seed`.
CASCADE_HD float TokenUniform(uint64_t seed, int64_t position, int32_t v) {
  return TokenUniformAt(StreamStart(seed, position), v);
}

// Standard Gumbel noise -ln(-ln u). argmax over v of (s_v + GumbelNoise(u_v)) is an exact sample
// of softmax(s) (the Gumbel-max trick).
CASCADE_HD float GumbelNoise(float u) { return -DetLn(-DetLn(u)); }

}  // namespace cascade::engine
