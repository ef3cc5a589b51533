// Float32 building blocks of the CPU backend. Every reduction has one fixed order that depends
// only on its length, never on how many rows or columns are computed together: this is what makes
// the backend batch-invariant (a row's logits are bitwise the same in any batch).
#pragma once

#include <cstdint>
#include <vector>

#include "gpu_worker/model/config.h"

namespace cascade::cpu {

// sum_i a[i] * b[i]: eight interleaved partial sums over the first n - n % 8 elements, combined
// as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)), then the tail added in index order.
float Dot(const float* a, const float* b, int64_t n);

// y[t * ldy + j] = Dot(x + t * k, w + j * k, k) for t in [0, rows), j in [j_begin, j_end).
// x: [rows, k]; w: [n, k] row-major (Hugging Face [out, in] layout); y: [rows, ldy].
// Bitwise equal to calling Dot() per element, whatever rows and the column range are.
void MatMulRange(const float* x, int64_t rows, int64_t k, const float* w, int64_t j_begin,
                 int64_t j_end, float* y, int64_t ldy);

// MatMulRange() with bf16 weights (raw bits), widened exactly to float32 as they are read: the
// same float32 arithmetic in the same order, so bitwise the same result as converting first,
// with half the memory traffic (the 151936-column LM head dominates decode).
void MatMulRangeBf16(const float* x, int64_t rows, int64_t k, const uint16_t* w, int64_t j_begin,
                     int64_t j_end, float* y, int64_t ldy);

// out = w * (x / sqrt(mean(x^2) + eps)), in float32 like Hugging Face's RMSNorm. x, w, out: [n];
// out may alias x.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);

// RoPE frequencies: inv_freq[i] = theta^(-2i/d) for i < d/2, with Llama-3 scaling if configured
// (computed in double).
std::vector<double> RopeInvFreq(const model::ModelConfig& config);

// cos/sin of position * inv_freq[i], each [d/2]; angles in double for accuracy at large positions.
void RopeCosSin(const std::vector<double>& inv_freq, int64_t position, float* cos, float* sin);

// Rotates one head in place (Hugging Face rotate_half convention: pairs (i, i + d/2)).
// x: [d]; cos, sin: [d/2].
void ApplyRope(float* x, const float* cos, const float* sin, int64_t d);

// SiLU(gate) * up, elementwise over n values.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);

}  // namespace cascade::cpu
