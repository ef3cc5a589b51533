// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded.
// Randomness comes from a per-request, per-position stream, so a seeded request samples the
// same tokens whatever batch it lands in and whether its prompt came from cache or not.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/engine/types.h"

namespace cascade::engine {

// Checks ranges; the message names the field (e.g. "sampling.temperature must be in [0, 2]").
// `vocab_size` bounds stop_token_ids.
absl::Status ValidateSampling(const SamplingParams& p, int vocab_size, int32_t max_tokens_limit);

// True when Sample() draws p's token by RowSample's rule (backend.h): the argmax at temperature
// 0, else the Gumbel-max draw, which is exact only with no top-k, top-p or min-p truncation.
bool DrawsByRowRule(const SamplingParams& p);

// True when a backend may sample p's rows itself (RowSample::on_device): the draw follows
// RowSample's rule and nothing else needs the logits on the host (no repetition penalty, no
// logprobs). The scheduler asks this for every row; Sample() takes the same path for these rows,
// so where a row is sampled never changes its token.
bool SampleableOnDevice(const SamplingParams& p);

// Uniform double in [0, 1) for (seed, position): a counter-based generator (SplitMix64 over the
// pair), so no state is carried between steps.
double UniformAt(uint64_t seed, int64_t position);

struct SampleResult {
  int32_t token_id = 0;
  LogprobEntry logprobs;  // filled when p.logprobs > 0 (sampled + top-n from raw log-softmax)
};

// Samples one token from `logits` ([vocab] float32, modified in place as scratch).
// `history` holds the prompt and generated tokens (for the repetition penalty); `position` is the
// global position of the token being sampled.
SampleResult Sample(std::span<float> logits, const SamplingParams& p, uint64_t seed,
                    int64_t position, std::span<const int32_t> history);

}  // namespace cascade::engine
