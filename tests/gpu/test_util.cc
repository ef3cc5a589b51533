// Helpers for the GPU tests.
#include "tests/gpu/test_util.h"

#include <cmath>

namespace cascade::cuda::testing {

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float FromBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<uint16_t> RoundToBf16(std::vector<float>* v) {
  std::vector<uint16_t> out(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    out[i] = ToBf16((*v)[i]);
    (*v)[i] = FromBf16(out[i]);
  }
  return out;
}

std::vector<float> RandomNormal(size_t n, std::mt19937* rng, float stddev) {
  std::normal_distribution<float> d(0.f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(*rng);
  return v;
}

double RelL2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (std::isnan(num)) return INFINITY;
  return std::sqrt(num / std::max(den, 1e-300));
}

double MaxAbs(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace cascade::cuda::testing
