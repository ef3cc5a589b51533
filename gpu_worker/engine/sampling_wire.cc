// Sampling parameter conversion; see sampling_wire.h.
#include "gpu_worker/engine/sampling_wire.h"

namespace cascade::worker {

engine::SamplingParams SamplingFromProto(const cascade::v1::SamplingParams& s,
                                         int32_t default_max_tokens) {
  engine::SamplingParams p;
  p.temperature = s.has_temperature() ? s.temperature() : 1.0f;
  p.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  p.top_k = s.top_k();
  p.min_p = s.min_p();
  p.repetition_penalty = s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f;
  p.max_tokens = s.has_max_tokens() ? s.max_tokens() : default_max_tokens;
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.ignore_eos = s.ignore_eos();
  p.logprobs = s.logprobs();
  if (s.has_seed()) p.seed = s.seed();
  return p;
}

void SamplingToProto(const engine::SamplingParams& s, cascade::v1::SamplingParams* p) {
  p->set_temperature(s.temperature);
  p->set_top_p(s.top_p);
  p->set_top_k(s.top_k);
  p->set_min_p(s.min_p);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_max_tokens(s.max_tokens);
  p->mutable_stop_token_ids()->Assign(s.stop_token_ids.begin(), s.stop_token_ids.end());
  p->set_ignore_eos(s.ignore_eos);
  p->set_logprobs(s.logprobs);
  if (s.seed) p->set_seed(*s.seed);
}

}  // namespace cascade::worker
