// Token sampling: greedy, temperature, top-k, top-p, min-p, logit bias, repetition / frequency /
// presence penalties, logprobs, seeded
// (the rule is sample_rule.h's, shared with the CUDA kernel).
// Randomness comes from a per-request, per-position stream, so a seeded request samples the
// same tokens whatever batch it lands in and whether its prompt came from cache or not.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/engine/row_sampler.h"
#include "gpu_worker/engine/sample_rule.h"
#include "gpu_worker/engine/types.h"

namespace cascade::engine {

// Most entries of SamplingParams::logit_bias, and the largest bias (OpenAI's range).
constexpr size_t kMaxLogitBias = 1024;
constexpr float kMaxLogitBiasValue = 100.0f;

// Checks ranges; the message names the field (e.g. "sampling.temperature must be in [0, 2]").
// `vocab_size` bounds stop_token_ids and logit_bias's ids.
absl::Status ValidateSampling(const SamplingParams& p, int vocab_size, int32_t max_tokens_limit);

// The SampleSpec of a request's row at `position` (penalty tokens not set).
SampleSpec SpecFor(const SamplingParams& p, uint64_t seed, int64_t position);

// The engine's form of a row's logprobs.
LogprobEntry ToLogprobEntry(const RowLogprobs& lp, int32_t token);

struct SampleResult {
  int32_t token_id = 0;
  LogprobEntry logprobs;  // filled when p.logprobs > 0 (sampled + top-n from raw log-softmax)
};

// Samples one token from `logits` ([vocab] float32) by SampleRowRule.
// `history` holds the prompt and generated tokens (the penalties'), generated from index
// `output_start` on (what the frequency and presence penalties count); the listed tokens are
// penalty_list.h's (ListedOf), as the scheduler keeps them; `position` is the global
// position of the token being sampled.
SampleResult Sample(std::span<float> logits, const SamplingParams& p, uint64_t seed,
                    int64_t position, std::span<const int32_t> history, size_t output_start);

}  // namespace cascade::engine
