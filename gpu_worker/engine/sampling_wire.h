// cascade.v1.SamplingParams <-> engine::SamplingParams, with the documented defaults for unset
// fields. Shared by the gateway (validation before routing) and the worker.
#pragma once

#include "cascade/v1/common.pb.h"
#include "gpu_worker/engine/types.h"

namespace cascade::worker {

// Unset fields: temperature 1, top_p 1, repetition_penalty 1, max_tokens `default_max_tokens`.
// Values are copied as given (0 max_tokens stays 0), so ValidateSampling rejects them clearly.
engine::SamplingParams SamplingFromProto(const cascade::v1::SamplingParams& s,
                                         int32_t default_max_tokens);

// The inverse, with every field set explicitly (what the gateway forwards to a worker).
void SamplingToProto(const engine::SamplingParams& s, cascade::v1::SamplingParams* p);

}  // namespace cascade::worker
