// Cascade's sampling rule, one definition for the host sampler (sampler.cc) and the CUDA kernel
// (backend/cuda/sample.cu): plain structs and the per-token arithmetic, host+device under nvcc.
//
// For one logits row z[0, vocab) and a SampleSpec:
//  1. Logit bias and penalties (vLLM's order), on the row's listed tokens only: a token's logit
//     bias b (OpenAI's logit_bias; 0 where none) is added first; then, for tokens of the history
//     (count >= 0; count -1 marks a token listed only for its bias), the repetition penalty
//     (Hugging Face / vLLM) divides the logit by r when positive and multiplies it by r
//     otherwise; then a token generated c > 0 times so far (its count in the list) loses
//     frequency_penalty * c, then presence_penalty (OpenAI's penalties). Each a correctly
//     rounded float operation, skipped where its parameter is off.
//  2. Temperature 0: the token is the argmax of the penalized logits (lowest id among ties); the
//     filters below do not apply (vLLM's greedy). Else s_v = z'_v * (1 / T).
//  3. Filters, each a threshold on s (ties at a threshold are all kept):
//     min-p keeps s_v >= max_s + ln(min_p) (p_v >= min_p * p_max);
//     top-k keeps s_v >= the k-th largest s (counted with multiplicity);
//     top-p, over what min-p and top-k kept: weights w_v = FixedWeight(s_v - max_s) (integers,
//     2^40 at the max), W their sum, need = max(1, floor(top_p * W)) in double; keeps
//     s_v >= the largest value t with sum_{s_u >= t} w_u >= need (vLLM's nucleus: the smallest
//     top set whose mass reaches top_p).
//  4. The draw: argmax over kept v of s_v + GumbelNoise(TokenUniform(seed, position, v)), lowest
//     id among ties: an exact sample of softmax(s) restricted to the kept set.
//  5. Logprobs (vLLM's default, raw logprobs: of the unpenalized, untempered logits):
//     lse = max_z + ln(sum_v FixedWeight(z_v - max_z) / 2^40) in double; logprob_v = z_v - lse
//     rounded to float; the top `logprobs` by (z desc, id asc) and the sampled token's.
// A score row (score_token >= 0: a prompt token scored, vLLM's prompt_logprobs) skips steps 1-4:
// its token is score_token, whose step-5 logprobs come back with its rank, the number of tokens v
// with z_v >= z_token by OrderKey (vLLM's rank: 1 for the argmax without ties).
// Every value is compared through OrderKey (NaN counts as -inf, -0 as +0), every sum is an
// integer sum, and every float operation is correctly rounded (sample_noise.h): the result does
// not depend on the order of any reduction, so a parallel kernel gives the host's bits.
#pragma once

#include <cstdint>

#include "gpu_worker/engine/sample_noise.h"

namespace cascade::engine {

constexpr int kMaxLogprobs = 20;

// How one row is sampled. Plain data: the device reads an array of these.
struct SampleSpec {
  float temperature = 0.0f;         // >= 0; 0: argmax
  float top_p = 1.0f;               // (0, 1]; 1: off
  int32_t top_k = 0;                // <= 0 or >= vocab: off
  float min_p = 0.0f;               // [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float frequency_penalty = 0.0f;   // [-2, 2]; 0: off
  float presence_penalty = 0.0f;    // [-2, 2]; 0: off
  int32_t logprobs = 0;             // [0, kMaxLogprobs]
  // The row's listed tokens: ForwardBatch::penalty_tokens[start, start + count), distinct, and
  // in ascending order where UsesEntries (the kernel finds a token's entry by its rank), with
  // their generated counts at ForwardBatch::penalty_counts[start, start + count) (-1: listed
  // only for a bias) and, where biased, their logit biases at ForwardBatch::penalty_bias.
  int32_t penalty_start = 0;
  int32_t penalty_count = 0;
  int32_t biased = 0;  // 1: the listed tokens carry logit biases (OpenAI's logit_bias)
  // >= 0: a score row: nothing is drawn, the row's token is this one (step 5 and its rank only).
  // (Here, in what was padding before `seed`: the struct stays 64 bytes.)
  int32_t score_token = -1;
  uint64_t seed = 0;
  int64_t position = 0;  // global position of the token being sampled
};

// Logprobs of one sampled row (step 5).
struct RowLogprobs {
  float sampled = 0.0f;  // the sampled token's
  int32_t num_top = 0;
  int32_t rank = 0;  // score rows: the token's rank (SampleSpec::score_token); else 0
  int32_t top_ids[kMaxLogprobs] = {};
  float top[kMaxLogprobs] = {};
};

// Total order of floats as unsigned keys; callers pass canonical values (Canon).
CASCADE_HD uint32_t OrderKey(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
CASCADE_HD float KeyValue(uint32_t k) {
  const uint32_t b = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  float x;
  memcpy(&x, &b, 4);
  return x;
}
// NaN -> -inf, -0 -> +0.
CASCADE_HD float Canon(float x) { return x != x ? -INFINITY : AddF(x, 0.0f); }

CASCADE_HD float Penalize(float z, float r) { return z > 0.0f ? DivF(z, r) : MulF(z, r); }

CASCADE_HD float InvTemperature(const SampleSpec& s) {
  return s.temperature == 0.0f ? 1.0f : DivF(1.0f, s.temperature);
}

// True when a row's penalties need each listed token's generated count.
CASCADE_HD bool UsesCounts(const SampleSpec& s) {
  return s.frequency_penalty != 0.0f || s.presence_penalty != 0.0f;
}
CASCADE_HD bool UsesBias(const SampleSpec& s) { return s.biased != 0; }
// True when a row's listed tokens carry entries (a count, and a bias where biased): they are
// then ascending, and a count of -1 marks a token listed for its bias alone.
CASCADE_HD bool UsesEntries(const SampleSpec& s) { return UsesCounts(s) || UsesBias(s); }
CASCADE_HD bool UsesPenalty(const SampleSpec& s) {
  return (s.repetition_penalty != 1.0f || UsesEntries(s)) && s.penalty_count > 0;
}

// Step 1's value of a listed token with generated count `count` (-1: listed for its bias alone,
// not in the history) and logit bias `bias`.
CASCADE_HD float PenalizedLogit(float z, int32_t count, float bias, const SampleSpec& s) {
  if (bias != 0.0f) z = AddF(z, bias);
  if (count < 0) return z;
  if (s.repetition_penalty != 1.0f) z = Penalize(z, s.repetition_penalty);
  if (count > 0) {
    if (s.frequency_penalty != 0.0f) {
      z = AddF(z, -MulF(s.frequency_penalty, static_cast<float>(count)));
    }
    if (s.presence_penalty != 0.0f) z = AddF(z, -s.presence_penalty);
  }
  return z;
}

// Step 1-2's value of token v: `penalized` says whether v is among the row's listed tokens,
// `count` its generated count (0 where the row has no entries) and `bias` its logit bias.
CASCADE_HD uint32_t ScoreKey(float z, bool penalized, int32_t count, float bias,
                             const SampleSpec& s, float inv_t) {
  if (penalized) z = PenalizedLogit(z, count, bias, s);
  return OrderKey(Canon(s.temperature == 0.0f ? z : MulF(z, inv_t)));
}
// True when a row's logprobs come back: asked for (top n), or a score row (its token's).
CASCADE_HD bool WantsLogprobs(const SampleSpec& s) { return s.logprobs > 0 || s.score_token >= 0; }
CASCADE_HD bool HasTopK(const SampleSpec& s, int vocab) { return s.top_k > 0 && s.top_k < vocab; }
// True when a temperature row has a filter (min-p, top-k or top-p) to apply before the draw.
CASCADE_HD bool HasFilters(const SampleSpec& s, int vocab) {
  return s.temperature != 0.0f && (s.min_p > 0.0f || HasTopK(s, vocab) || s.top_p < 1.0f);
}

// Min-p's threshold key given the row's max key.
CASCADE_HD uint32_t MinPKey(uint32_t max_key, float min_p) {
  return OrderKey(Canon(AddF(KeyValue(max_key), DetLn(min_p))));
}

// Weight of the value with key k when the row's max value is m (step 3).
CASCADE_HD uint64_t KeyWeight(uint32_t k, float m) { return FixedWeight(AddF(KeyValue(k), -m)); }

// Top-p's mass to reach, of total W.
CASCADE_HD uint64_t NeedMass(uint64_t total, float top_p) {
  const double t = MulD(U64ToD(total), static_cast<double>(top_p));
  return t >= 1.0 ? static_cast<uint64_t>(t) : 1;
}

// Step 5: lse from max_z and the weight sum, then one token's logprob.
CASCADE_HD double LogSumExp(float max_z, uint64_t weight_sum) {
  return AddD(static_cast<double>(max_z),
              AddD(DetLnD(U64ToD(weight_sum)), -kWeightBits * 0.6931471805599453));
}
CASCADE_HD float LogprobOf(float z, double lse) {
  return DToF(AddD(static_cast<double>(Canon(z)), -lse));
}

}  // namespace cascade::engine
