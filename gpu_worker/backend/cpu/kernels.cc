// Portable float32 kernels. GCC vector extensions give SIMD on any x86-64 without -march flags;
// the library is built with -ffp-contract=off so no multiply-add is fused differently in
// different call sites, which keeps results bitwise reproducible.
#include "gpu_worker/backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

namespace cascade::cpu {
namespace {

typedef float V8 __attribute__((vector_size(32)));

inline V8 Load(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The fixed combine order of Dot()'s eight lanes.
inline float Reduce(V8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

typedef uint16_t H8 __attribute__((vector_size(16)));
typedef uint32_t U8 __attribute__((vector_size(32)));

inline V8 LoadW(const float* p) { return Load(p); }
// bf16 bits -> f32 (exact: the bits become the high half of the float).
inline V8 LoadW(const uint16_t* p) {
  H8 h;
  std::memcpy(&h, p, sizeof(h));
  U8 u = __builtin_convertvector(h, U8) << 16;
  V8 v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}
inline float Scalar(float w) { return w; }
inline float Scalar(uint16_t w) {
  uint32_t u = static_cast<uint32_t>(w) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Dot() with weights of type W; the same operations in the same order for every W.
template <typename W>
inline float DotW(const float* a, const W* b, int64_t n) {
  V8 acc = {};
  const int64_t n8 = n - n % 8;
  for (int64_t i = 0; i < n8; i += 8) acc += Load(a + i) * LoadW(b + i);
  float s = Reduce(acc);
  for (int64_t i = n8; i < n; ++i) s += a[i] * Scalar(b[i]);
  return s;
}

// Four dots sharing the x loads; each follows exactly Dot()'s order.
template <typename W>
inline void Dot4(const float* x, const W* w0, const W* w1, const W* w2, const W* w3, int64_t k,
                 float* out) {
  V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  const int64_t k8 = k - k % 8;
  for (int64_t i = 0; i < k8; i += 8) {
    V8 xv = Load(x + i);
    a0 += xv * LoadW(w0 + i);
    a1 += xv * LoadW(w1 + i);
    a2 += xv * LoadW(w2 + i);
    a3 += xv * LoadW(w3 + i);
  }
  float s0 = Reduce(a0), s1 = Reduce(a1), s2 = Reduce(a2), s3 = Reduce(a3);
  for (int64_t i = k8; i < k; ++i) {
    s0 += x[i] * Scalar(w0[i]);
    s1 += x[i] * Scalar(w1[i]);
    s2 += x[i] * Scalar(w2[i]);
    s3 += x[i] * Scalar(w3[i]);
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

template <typename W>
void MatMulRangeT(const float* x, int64_t rows, int64_t k, const W* w, int64_t j_begin,
                  int64_t j_end, float* y, int64_t ldy) {
  // Column tiles of 16 weight rows stay in cache while every x row passes over them.
  constexpr int64_t kTile = 16;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kTile) {
    const int64_t j1 = std::min(j_end, j0 + kTile);
    for (int64_t t = 0; t < rows; ++t) {
      const float* xt = x + t * k;
      float* yt = y + t * ldy;
      int64_t j = j0;
      for (; j + 4 <= j1; j += 4) {
        const W* wj = w + j * k;
        Dot4(xt, wj, wj + k, wj + 2 * k, wj + 3 * k, k, yt + j);
      }
      for (; j < j1; ++j) yt[j] = DotW(xt, w + j * k, k);
    }
  }
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) { return DotW(a, b, n); }

void MatMulRange(const float* x, int64_t rows, int64_t k, const float* w, int64_t j_begin,
                 int64_t j_end, float* y, int64_t ldy) {
  MatMulRangeT(x, rows, k, w, j_begin, j_end, y, ldy);
}

void MatMulRangeBf16(const float* x, int64_t rows, int64_t k, const uint16_t* w, int64_t j_begin,
                     int64_t j_end, float* y, int64_t ldy) {
  MatMulRangeT(x, rows, k, w, j_begin, j_end, y, ldy);
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  const float mean_sq = Dot(x, x, n) / static_cast<float>(n);
  const float r = 1.0f / std::sqrt(mean_sq + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * r);
}

std::vector<double> RopeInvFreq(const model::ModelConfig& c) {
  const int64_t d = c.head_dim;
  std::vector<double> inv(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    inv[i] = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  }
  if (!c.rope_scaling.enabled) return inv;
  // Llama 3.1: wavelengths beyond the original context are stretched by `factor`, short ones are
  // kept, and the band in between is interpolated smoothly.
  const model::RopeScaling& s = c.rope_scaling;
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_len / s.low_freq_factor;
  const double high_freq_wavelen = old_len / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f = f / s.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv;
}

void RopeCosSin(const std::vector<double>& inv_freq, int64_t position, float* cos, float* sin) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double angle = static_cast<double>(position) * inv_freq[i];
    cos[i] = static_cast<float>(std::cos(angle));
    sin[i] = static_cast<float>(std::sin(angle));
  }
}

void ApplyRope(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i] + a * sin[i];
  }
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace cascade::cpu
