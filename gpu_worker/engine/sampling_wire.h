// cascade.v2.SamplingParams -> engine::SamplingParams: the one definition of what an unset field
// means, and the one check of a request's sampling. Shared by the gateway (which checks before
// routing and forwards the client's message) and the worker (which converts what it receives).
#pragma once

#include "absl/status/statusor.h"
#include "cascade/v2/common.pb.h"
#include "gpu_worker/engine/types.h"

namespace cascade::worker {

// What an unset sampling.max_tokens means, whether a request enters through the gateway or
// straight at a worker. The gateway's --default_max_tokens starts here (and, when changed, the
// gateway sends its value explicitly, so workers never apply a different one).
inline constexpr int32_t kDefaultMaxTokens = 256;

// Unset fields: temperature 1, top_p 1, repetition_penalty 1, max_tokens `default_max_tokens`,
// seed drawn by the engine. Values are copied as given (0 max_tokens stays 0), so
// ValidateSampling rejects them clearly.
engine::SamplingParams SamplingFromProto(const cascade::v2::SamplingParams& s,
                                         int32_t default_max_tokens = kDefaultMaxTokens);

// SamplingFromProto, then engine::ValidateSampling (sampler.h) with these bounds: what the gateway
// runs before routing. The engine runs the same validator on every request it is given (a
// worker may be called directly), so a request through the gateway is checked at both edges by
// one rule.
absl::StatusOr<engine::SamplingParams> ParseSampling(
    const cascade::v2::SamplingParams& s, int vocab_size, int32_t max_tokens_limit,
    int32_t default_max_tokens = kDefaultMaxTokens);

}  // namespace cascade::worker
