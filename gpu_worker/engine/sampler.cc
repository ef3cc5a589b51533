// Sampling parameters: validation, the row spec of a request, and Sample() over a whole logits
// row by the shared rule (row_sampler.h).
#include "gpu_worker/engine/sampler.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "gpu_worker/engine/penalty_list.h"

namespace cascade::engine {

absl::Status ValidateSampling(const SamplingParams& p, int vocab_size, int32_t max_tokens_limit) {
  if (!(p.temperature >= 0.0f && p.temperature <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.temperature must be in [0, 2], got ", p.temperature));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p must be in (0, 1], got ", p.top_p));
  }
  if (p.top_k < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_k must be >= 0, or -1 to disable; got ", p.top_k));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.min_p must be in [0, 1], got ", p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.repetition_penalty must be > 0, got ", p.repetition_penalty));
  }
  for (const auto& [name, v] : {std::pair{"frequency_penalty", p.frequency_penalty},
                                std::pair{"presence_penalty", p.presence_penalty}}) {
    if (!(v >= -2.0f && v <= 2.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.", name, " must be in [-2, 2], got ", v));
    }
  }
  if (p.max_tokens < 1 || p.max_tokens > max_tokens_limit) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_tokens must be in [1, ",
                                                   max_tokens_limit, "], got ", p.max_tokens));
  }
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.min_tokens must be in [0, max_tokens (", p.max_tokens, ")], got ", p.min_tokens));
  }
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.prompt_logprobs must be in [0, 20] (or unset), got ", p.prompt_logprobs));
  }
  if (p.logprobs < 0 || p.logprobs > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.logprobs must be in [0, 20], got ", p.logprobs));
  }
  // Each generated token is looked up in the list on the engine's thread: a request with a
  // million ids (a few MB on the wire) would slow every step of the whole batch.
  constexpr size_t kMaxStopTokenIds = 1024;
  if (p.stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.stop_token_ids: ", p.stop_token_ids.size(), " ids, at most ", kMaxStopTokenIds));
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.stop_token_ids: ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  // The biased tokens are listed in every step of the request (copied into the batch), as the
  // stop ids are looked up: bounded alike.
  if (p.logit_bias.size() > kMaxLogitBias) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias: ", p.logit_bias.size(),
                                                   " tokens, at most ", kMaxLogitBias));
  }
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto [id, bias] = p.logit_bias[i];
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.logit_bias: token ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (i > 0 && id <= p.logit_bias[i - 1].first) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias: token ids must be distinct and ascending (", id,
                       " after ", p.logit_bias[i - 1].first, ")"));
    }
    if (!(bias >= -kMaxLogitBiasValue && bias <= kMaxLogitBiasValue)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias: the bias of token ", id,
                                                     " must be in [", -kMaxLogitBiasValue, ", ",
                                                     kMaxLogitBiasValue, "], got ", bias));
    }
  }
  return absl::OkStatus();
}

SampleSpec SpecFor(const SamplingParams& p, uint64_t seed, int64_t position) {
  SampleSpec s;
  s.temperature = p.temperature;
  s.top_p = p.top_p;
  s.top_k = p.top_k;
  s.min_p = p.min_p;
  s.repetition_penalty = p.repetition_penalty;
  s.frequency_penalty = p.frequency_penalty;
  s.presence_penalty = p.presence_penalty;
  s.logprobs = p.logprobs;
  s.biased = p.logit_bias.empty() ? 0 : 1;
  s.seed = seed;
  s.position = position;
  return s;
}

LogprobEntry ToLogprobEntry(const RowLogprobs& lp, int32_t token) {
  LogprobEntry e;
  e.sampled = {token, lp.sampled};
  e.rank = lp.rank;
  for (int i = 0; i < lp.num_top; ++i) e.top.push_back({lp.top_ids[i], lp.top[i]});
  return e;
}

SampleResult Sample(std::span<float> logits, const SamplingParams& p, uint64_t seed,
                    int64_t position, std::span<const int32_t> history, size_t output_start) {
  SampleResult r;
  RowLogprobs lp;
  const SampleSpec spec = SpecFor(p, seed, position);
  std::vector<int32_t> tokens, counts;
  std::vector<float> bias;
  ListedOf(p, history, output_start, &tokens, &counts, &bias);
  r.token_id = SampleRowRule(logits.data(), static_cast<int>(logits.size()), spec, tokens, counts,
                             bias, &lp);
  if (p.logprobs > 0) r.logprobs = ToLogprobEntry(lp, r.token_id);
  return r;
}

}  // namespace cascade::engine
