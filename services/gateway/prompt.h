// Validates a public request and turns it into the worker's form: chat template per chunk,
// tokenization, sampling defaults, limits. Every error is INVALID_ARGUMENT (or
// RESOURCE_EXHAUSTED for sizes) with a message naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cascade/v2/gateway.pb.h"
#include "cascade/v2/worker.pb.h"
#include "common/chunk_hash.h"
#include "gpu_worker/engine/sampling_wire.h"
#include "services/tokenizer/tokenizer.h"

namespace cascade::gateway {

struct PromptLimits {
  std::string model_name;
  int64_t max_context = 4096;          // prompt + max_tokens at most
  int64_t max_prompt_bytes = 4 << 20;  // text bytes + 4 per token id, over all chunks
  int max_chunks = 1024;
  int max_stop_strings = 16;
  int max_stop_string_bytes = 256;
  int32_t default_max_tokens = worker::kDefaultMaxTokens;  // what an unset max_tokens means
  // Token ids a client may send: the model's vocabulary, which can be larger than the
  // tokenizer's (ids without text are still the model's tokens, and streams return them).
  // 0: the tokenizer's.
  int64_t vocab_size = 0;
};

struct PromptChunk {
  int32_t kind = 0;
  std::vector<int32_t> tokens;
  std::string cache_salt;
};

struct Prompt {
  std::vector<PromptChunk> chunks;  // templated and tokenized, generation prompt last if added
  int64_t num_tokens = 0;
  // The client's sampling, validated (worker::ParseSampling), with max_tokens and the seed set:
  // forwarded as is, so the worker applies the same defaults to what is unset.
  cascade::v2::SamplingParams sampling;
  std::vector<std::string> stop;
  std::string cache_salt;
};

// `chunks` as sent by a client; `add_generation_prompt` appends the assistant prompt piece, ending
// in Qwen3's empty think block where `enable_thinking` is false (GenerateRequest::enable_thinking).
absl::StatusOr<Prompt> BuildPrompt(
    const google::protobuf::RepeatedPtrField<cascade::v2::Chunk>& chunks,
    const cascade::v2::SamplingParams& sampling, const std::string& cache_salt,
    bool add_generation_prompt, const tokenizer::Tokenizer& tok, const PromptLimits& limits,
    bool enable_thinking = true);

// The largest serialized request that can hold a valid prompt under `limits`: text and token
// ids within max_prompt_bytes (ids count 4 bytes each; on the wire a varint takes up to 5),
// plus room for the other fields. Bigger requests are refused before they are parsed.
size_t MaxRequestBytes(const PromptLimits& limits);

// The model named in a request must be ours (empty means ours).
absl::Status CheckModel(const std::string& model, const PromptLimits& limits);

// The prompt's chunks as the hashing sees them (hash::SpecsOf); they point into `p`.
inline std::vector<hash::ChunkSpec> ChunkSpecs(const Prompt& p) { return hash::SpecsOf(p.chunks); }

// The worker request for a prompt (chunk hashes unset: Route sets the registry's).
cascade::v2::WorkerServiceGenerateRequest ToWorkerRequest(const Prompt& p,
                                                          const std::string& request_id,
                                                          const std::string& model);

}  // namespace cascade::gateway
