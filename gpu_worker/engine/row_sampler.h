// sample_rule.h's rule applied to one logits row on the host (the CPU backend's ForwardSampled,
// the engine's Sample(), and the reference of the CUDA kernel's tests).
#pragma once

#include <cstdint>
#include <span>

#include "gpu_worker/engine/sample_rule.h"

namespace cascade::engine {

// The token of one row, and its logprobs when WantsLogprobs(spec) (`logprobs` may then not be
// null); a score row's token is spec.score_token, its logprobs with the token's rank. `logits`:
// [vocab] float32; `penalty_tokens`: the row's listed tokens (step 1; ids outside the vocabulary
// are ignored, in any order; spec.penalty_start/count are not read), `penalty_counts` their
// generated counts (parallel, or empty: none generated; -1: listed for a bias alone) and
// `penalty_bias` their logit biases (parallel, or empty: none). Found by sorting and exact integer
// sums: the reference the CUDA kernel (any order of reduction) must equal bitwise.
int32_t SampleRowRule(const float* logits, int vocab, const SampleSpec& spec,
                      std::span<const int32_t> penalty_tokens,
                      std::span<const int32_t> penalty_counts, std::span<const float> penalty_bias,
                      RowLogprobs* logprobs);

// Step 5 of the rule alone: `token`'s logprob and the top n (<= kMaxLogprobs) of one row.
void RowLogprobsOf(const float* logits, int vocab, int32_t token, int n, RowLogprobs* out);

// vLLM's rank of `token` in one row: the number of tokens v with OrderKey(Canon(z_v)) >= its own.
int32_t TokenRank(const float* logits, int vocab, int32_t token);

// A score row's result (SampleSpec::score_token): `token`'s logprob, the top n and its rank.
void ScoreRowOf(const float* logits, int vocab, int32_t token, int n, RowLogprobs* out);

}  // namespace cascade::engine
