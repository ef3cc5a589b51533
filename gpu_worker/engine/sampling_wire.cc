// Sampling parameter conversion; see sampling_wire.h.
#include "gpu_worker/engine/sampling_wire.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gpu_worker/engine/sampler.h"

namespace cascade::worker {

// The engine's FinishReason mirrors cascade.v2.FinishReason value for value (the worker service
// casts one to the other).
#define CASCADE_SAME_VALUE(engine_value, proto_value)                   \
  static_assert(static_cast<int>(engine::FinishReason::engine_value) == \
                    static_cast<int>(cascade::v2::proto_value),         \
                "engine::FinishReason::" #engine_value " must equal cascade.v2." #proto_value)
CASCADE_SAME_VALUE(kNone, FINISH_REASON_UNSPECIFIED);
CASCADE_SAME_VALUE(kStop, FINISH_REASON_STOP);
CASCADE_SAME_VALUE(kLength, FINISH_REASON_LENGTH);
CASCADE_SAME_VALUE(kStopString, FINISH_REASON_STOP_STRING);
CASCADE_SAME_VALUE(kCancelled, FINISH_REASON_CANCELLED);
CASCADE_SAME_VALUE(kError, FINISH_REASON_ERROR);
#undef CASCADE_SAME_VALUE

engine::SamplingParams SamplingFromProto(const cascade::v2::SamplingParams& s,
                                         int32_t default_max_tokens) {
  engine::SamplingParams p;
  p.temperature = s.has_temperature() ? s.temperature() : 1.0f;
  p.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  p.top_k = s.top_k();
  p.min_p = s.min_p();
  p.repetition_penalty = s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f;
  p.frequency_penalty = s.frequency_penalty();
  p.presence_penalty = s.presence_penalty();
  p.max_tokens = s.has_max_tokens() ? s.max_tokens() : default_max_tokens;
  p.min_tokens = s.min_tokens();
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.ignore_eos = s.ignore_eos();
  p.logprobs = s.logprobs();
  p.prompt_logprobs = s.has_prompt_logprobs() ? s.prompt_logprobs() : -1;
  if (s.has_seed()) p.seed = s.seed();
  // A map's order is unspecified on the wire: the engine's list ascends by id (ids are distinct).
  p.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(p.logit_bias.begin(), p.logit_bias.end());
  return p;
}

absl::StatusOr<engine::SamplingParams> ParseSampling(const cascade::v2::SamplingParams& s,
                                                     int vocab_size, int32_t max_tokens_limit,
                                                     int32_t default_max_tokens) {
  if (s.has_prompt_logprobs() && s.prompt_logprobs() < 0) {  // (the engine's -1 means unset)
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.prompt_logprobs must be in [0, 20] (or unset), got ", s.prompt_logprobs()));
  }
  engine::SamplingParams p = SamplingFromProto(s, default_max_tokens);
  if (absl::Status st = engine::ValidateSampling(p, vocab_size, max_tokens_limit); !st.ok()) {
    return st;
  }
  return p;
}

}  // namespace cascade::worker
